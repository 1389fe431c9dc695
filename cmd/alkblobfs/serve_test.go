//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// server is one `alkblobfs serve` process.
type server struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	url    string
}

var servingURL = regexp.MustCompile(`url=(http://[0-9.:\[\]]+)`)

// httpURL waits for a mount run with --listen HOST:PORT to log where it
// serves HTTP, and returns that URL.
func (d *daemon) httpURL() string {
	d.t.Helper()
	var url string
	eventually(d.t, 10*time.Second, "the mount's HTTP surface", func() bool {
		if m := servingURL.FindStringSubmatch(d.stderr.String()); m != nil {
			url = m[1]
			return true
		}
		return false
	})
	return url
}

// startServe runs alkblobfs serve with args and waits until it listens.
func startServe(t *testing.T, c *cli, args ...string) *server {
	t.Helper()
	return startServeAt(t, c, servingURL, args...)
}

// startServeURL is startServe finding the URL in the log by pattern.
func startServeURL(t *testing.T, c *cli, pattern string, args ...string) *server {
	t.Helper()
	return startServeAt(t, c, regexp.MustCompile(pattern), args...)
}

func startServeAt(t *testing.T, c *cli, servingURL *regexp.Regexp, args ...string) *server {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	s := &server{stderr: &syncBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(bin, append(append([]string{"--data", c.data}, c.flags...), append([]string{"serve"}, args...)...)...)
	s.cmd.Env = c.environ()
	s.cmd.Stderr = s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			s.cmd.Process.Kill()
			<-s.done
		}
	})
	eventually(t, 20*time.Second, "serve to listen", func() bool {
		if m := servingURL.FindStringSubmatch(s.stderr.String()); m != nil {
			s.url = m[1]
			return true
		}
		select {
		case <-s.done:
			t.Fatalf("serve exited: %s", s.stderr.String())
		default:
		}
		return false
	})
	return s
}

func tokenFile(t *testing.T, tok string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(tok+" 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestServe: alkblobfs serve as a process, and the CLI's --remote put,
// have, get and cat through it, with a bearer token.
func TestServe(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.ok("ns", "create", "builds")
	const secret = "b7e1-secret-token-4f2c"
	good, bad := tokenFile(t, secret), tokenFile(t, "not-it")
	// At debug level every refusal is logged: the token must still not be.
	s := startServe(t, c, "--log-level", "debug", "--listen", "127.0.0.1:0", "--auth-token-file", good)

	remote := newCLI(t, "--remote", s.url, "--auth-token-file", good)
	src, content, digest := writeFile(t, t.TempDir(), 400<<10, 7)
	if got := strings.TrimSpace(remote.ok("put", "--ns", "builds", src)); got != digest {
		t.Fatalf("remote put printed %q, want %s", got, digest)
	}
	absent := strings.Repeat("0", 64)
	if got := remote.ok("have", "--ns", "builds", digest, absent); got != digest+" present\n"+absent+" absent\n" {
		t.Fatalf("remote have: %q", got)
	}
	if got := c.ok("have", "--ns", "builds", digest, absent); got != digest+" present\n"+absent+" absent\n" {
		t.Fatalf("local have: %q", got)
	}
	out := filepath.Join(t.TempDir(), "out")
	remote.ok("get", digest, "-o", out)
	if b, _ := os.ReadFile(out); !bytes.Equal(b, content) {
		t.Fatal("remote get -o wrote other bytes")
	}
	if got := remote.ok("cat", digest); got != string(content) {
		t.Fatal("remote cat wrote other bytes")
	}
	// The put linked the blob: the local store lists it in the namespace.
	if !strings.Contains(c.ok("ls", "builds"), digest) {
		t.Fatal("the remote put is not in the namespace")
	}

	// put --remote released its pin tokens.
	req, _ := http.NewRequest("GET", s.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(body, []byte("\nalkblobfs_pin_tokens 0\n")) {
		t.Fatalf("pin tokens left after remote puts:\n%s", body)
	}

	remote.fail(1, "(404)", "get", absent)
	remote.fail(2, "put --remote needs --ns", "put", src)
	remote.fail(2, "not through --remote", "ls")
	newCLI(t, "--remote", s.url, "--auth-token-file", bad).fail(1, "(401)", "get", digest)
	newCLI(t, "--remote", s.url).fail(1, "(401)", "have", "--ns", "builds", digest)
	newCLI(t, "--remote", "ftp://x").fail(2, "--remote", "get", digest)

	s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop on SIGINT")
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("serve exited %d after SIGINT:\n%s", code, s.stderr.String())
	}
	if strings.Contains(s.stderr.String(), secret) {
		t.Fatalf("the auth token is in serve's log:\n%s", s.stderr.String())
	}

	// Refusals before anything is served.
	c.fail(2, "needs a token file", "serve", "--listen", "0.0.0.0:0")
	c.fail(2, "needs a token file", "serve", "--listen", "127.0.0.1:0")
	loose := tokenFile(t, secret)
	os.Chmod(loose, 0o604)
	c.fail(2, "other users", "--auth-token-file", loose, "serve", "--listen", "0.0.0.0:0")
}

// TestMountListen: mount --listen serves the HTTP surface beside the
// mount; /metrics shows the mount's counters (the same ones its stats file
// shows) and FUSE latencies, and an HTTP put shows up in the mount.
func TestMountListen(t *testing.T) {
	t.Parallel()
	requireFUSE(t)
	c := newCLI(t)
	c.ok("ns", "create", "builds")
	mnt := t.TempDir()
	d := startDaemon(t, c.data, mnt, "--listen", "127.0.0.1:0", "--insecure-loopback")
	url := d.httpURL()

	_, content, digest := writeFile(t, t.TempDir(), 200<<10, 9)
	if err := os.WriteFile(filepath.Join(mnt, "builds", "incoming", "f"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "builds", digest)); err != nil {
		t.Fatal(err)
	}
	// An HTTP put appears in the mount.
	other := randomBytes(5000, 10)
	resp, err := http.Post(url+"/v1/blobs?namespace=builds", "application/octet-stream", bytes.NewReader(other))
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("HTTP put: %v %v", resp, err)
	}
	resp.Body.Close()
	eventually(t, 30*time.Second, "the HTTP put in the mount", func() bool {
		_, err := os.Stat(filepath.Join(mnt, "builds", sum(other)))
		return err == nil
	})

	var stats struct {
		Store struct {
			Puts int64 `json:"puts"`
		} `json:"store"`
		Publishes int64 `json:"publishes"`
	}
	b, err := os.ReadFile(filepath.Join(mnt, ".alkblobfs", "stats"))
	if err != nil || json.Unmarshal(b, &stats) != nil {
		t.Fatalf("stats: %v %s", err, b)
	}
	fams := scrapeMetrics(t, url)
	for name, want := range map[string]float64{
		"alkblobfs_puts_total":            float64(stats.Store.Puts),
		"alkblobfs_mount_publishes_total": float64(stats.Publishes),
	} {
		if got := metricValue(fams, name, ""); got != want || want == 0 {
			t.Errorf("%s = %v; the stats file says %v", name, got, want)
		}
	}
	// The mount's scrubs are there too (none ran).
	if fams["alkblobfs_scrubs_total"] == nil {
		t.Error("no alkblobfs_scrubs_total beside a mount")
	}
	for _, op := range []string{"lookup", "create", "write", "flush"} {
		if n := metricValue(fams, "alkblobfs_fuse_request_duration_seconds", op); n == 0 {
			t.Errorf("no %s requests in the FUSE latency histogram", op)
		}
	}
}

func scrapeMetrics(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	return fams
}

// metricValue is a metric's value (a histogram's count), for the series
// whose op label is op ("" for a metric without labels).
func metricValue(fams map[string]*dto.MetricFamily, name, op string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	for _, m := range f.Metric {
		if op != "" {
			found := false
			for _, l := range m.Label {
				found = found || l.GetName() == "op" && l.GetValue() == op
			}
			if !found {
				continue
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return 0
}

// TestServeProfiles: serve --cpuprofile and --memprofile (hidden, for
// scripts/measure-http.sh PROFILE=DIR) write both profiles when the server
// stops, over the puts it served.
func TestServeProfiles(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.ok("ns", "create", "builds")
	dir := t.TempDir()
	cpu, mem := filepath.Join(dir, "cpu.pprof"), filepath.Join(dir, "mem.pprof")
	s := startServe(t, c, "--listen", "127.0.0.1:0", "--insecure-loopback", "--cpuprofile", cpu, "--memprofile", mem)
	resp, err := http.Post(s.url+"/v1/blobs?namespace=builds", "application/octet-stream", strings.NewReader("profiled"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("put: %s", resp.Status)
	}
	s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop on SIGINT")
	}
	for _, p := range []string{cpu, mem} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("%v\n%s", err, s.stderr.String())
		}
		// A pprof profile is a gzipped protobuf.
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Fatalf("%s: %d bytes, not a gzipped profile", p, len(b))
		}
	}
}
