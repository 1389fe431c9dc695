//go:build linux

package serve

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

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
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "builds")
	const secret = "b7e1-secret-token-4f2c"
	good, bad := tokenFile(t, secret), tokenFile(t, "not-it")
	// At debug level every refusal is logged: the token must still not be.
	s := clitest.StartServe(t, c, "--log-level", "debug", "--listen", "127.0.0.1:0", "--auth-token-file", good)

	remote := clitest.NewCLI(t, "--remote", s.URL, "--auth-token-file", good)
	src, content, digest := clitest.WriteFile(t, t.TempDir(), 400<<10, 7)
	if got := strings.TrimSpace(remote.OK("put", "--ns", "builds", src)); got != digest {
		t.Fatalf("remote put printed %q, want %s", got, digest)
	}
	absent := strings.Repeat("0", 64)
	if got := remote.OK("have", "--ns", "builds", digest, absent); got != digest+" present\n"+absent+" absent\n" {
		t.Fatalf("remote have: %q", got)
	}
	if got := c.OK("have", "--ns", "builds", digest, absent); got != digest+" present\n"+absent+" absent\n" {
		t.Fatalf("local have: %q", got)
	}
	out := filepath.Join(t.TempDir(), "out")
	remote.OK("get", digest, "-o", out)
	if b, _ := os.ReadFile(out); !bytes.Equal(b, content) {
		t.Fatal("remote get -o wrote other bytes")
	}
	if got := remote.OK("cat", digest); got != string(content) {
		t.Fatal("remote cat wrote other bytes")
	}
	// The put linked the blob: the local store lists it in the namespace.
	if !strings.Contains(c.OK("ls", "builds"), digest) {
		t.Fatal("the remote put is not in the namespace")
	}

	// put --remote released its pin tokens.
	req, _ := http.NewRequest("GET", s.URL+"/metrics", nil)
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

	remote.Fail(1, "(404)", "get", absent)
	remote.Fail(2, "put --remote needs --ns", "put", src)
	remote.Fail(2, "not through --remote", "ls")
	clitest.NewCLI(t, "--remote", s.URL, "--auth-token-file", bad).Fail(1, "(401)", "get", digest)
	clitest.NewCLI(t, "--remote", s.URL).Fail(1, "(401)", "have", "--ns", "builds", digest)
	clitest.NewCLI(t, "--remote", "ftp://x").Fail(2, "--remote", "get", digest)

	s.Cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.Done:
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop on SIGINT")
	}
	if code := s.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("serve exited %d after SIGINT:\n%s", code, s.Stderr.String())
	}
	if strings.Contains(s.Stderr.String(), secret) {
		t.Fatalf("the auth token is in serve's log:\n%s", s.Stderr.String())
	}

	// Refusals before anything is served.
	c.Fail(2, "needs a token file", "serve", "--listen", "0.0.0.0:0")
	c.Fail(2, "needs a token file", "serve", "--listen", "127.0.0.1:0")
	loose := tokenFile(t, secret)
	os.Chmod(loose, 0o604)
	c.Fail(2, "other users", "--auth-token-file", loose, "serve", "--listen", "0.0.0.0:0")
}

// TestMountListen: mount --listen serves the HTTP surface beside the
// mount; /metrics shows the mount's counters (the same ones its stats file
// shows) and FUSE latencies, and an HTTP put shows up in the mount.
func TestMountListen(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "builds")
	mnt := t.TempDir()
	d := clitest.StartDaemon(t, c.Data, mnt, "--listen", "127.0.0.1:0", "--insecure-loopback")
	url := d.HTTPURL()

	_, content, digest := clitest.WriteFile(t, t.TempDir(), 200<<10, 9)
	if err := os.WriteFile(filepath.Join(mnt, "builds", "incoming", "f"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "builds", digest)); err != nil {
		t.Fatal(err)
	}
	// An HTTP put appears in the mount.
	other := clitest.RandomBytes(5000, 10)
	resp, err := http.Post(url+"/v1/blobs?namespace=builds", "application/octet-stream", bytes.NewReader(other))
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("HTTP put: %v %v", resp, err)
	}
	resp.Body.Close()
	clitest.Eventually(t, 30*time.Second, "the HTTP put in the mount", func() bool {
		_, err := os.Stat(filepath.Join(mnt, "builds", clitest.Sum(other)))
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
	fams := clitest.ScrapeMetrics(t, url)
	for name, want := range map[string]float64{
		"alkblobfs_puts_total":            float64(stats.Store.Puts),
		"alkblobfs_mount_publishes_total": float64(stats.Publishes),
	} {
		if got := clitest.MetricValue(fams, name, ""); got != want || want == 0 {
			t.Errorf("%s = %v; the stats file says %v", name, got, want)
		}
	}
	// The mount's scrubs are there too (none ran).
	if fams["alkblobfs_scrubs_total"] == nil {
		t.Error("no alkblobfs_scrubs_total beside a mount")
	}
	for _, op := range []string{"lookup", "create", "write", "flush"} {
		if n := clitest.MetricValue(fams, "alkblobfs_fuse_request_duration_seconds", op); n == 0 {
			t.Errorf("no %s requests in the FUSE latency histogram", op)
		}
	}
}

// TestServeProfiles: serve --cpuprofile and --memprofile (hidden, for
// scripts/measure-http.sh PROFILE=DIR) write both profiles when the server
// stops, over the puts it served.
func TestServeProfiles(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "builds")
	dir := t.TempDir()
	cpu, mem := filepath.Join(dir, "cpu.pprof"), filepath.Join(dir, "mem.pprof")
	s := clitest.StartServe(t, c, "--listen", "127.0.0.1:0", "--insecure-loopback", "--cpuprofile", cpu, "--memprofile", mem)
	resp, err := http.Post(s.URL+"/v1/blobs?namespace=builds", "application/octet-stream", strings.NewReader("profiled"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("put: %s", resp.Status)
	}
	s.Cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.Done:
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop on SIGINT")
	}
	for _, p := range []string{cpu, mem} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("%v\n%s", err, s.Stderr.String())
		}
		// A pprof profile is a gzipped protobuf.
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Fatalf("%s: %d bytes, not a gzipped profile", p, len(b))
		}
	}
}
