//go:build linux

package clitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Server is one `alkblobfs serve` process.
type Server struct {
	Cmd    *exec.Cmd
	Stderr *SyncBuffer
	Done   chan struct{}
	URL    string
}

// ServingURL finds the URL in the log line where serve says it listens.
var ServingURL = regexp.MustCompile(`url=(http://[0-9.:\[\]]+)`)

// HTTPURL waits for a mount run with --listen HOST:PORT to log where it
// serves HTTP, and returns that URL.
func (d *Daemon) HTTPURL() string {
	d.t.Helper()
	var url string
	Eventually(d.t, 10*time.Second, "the mount's HTTP surface", func() bool {
		if m := ServingURL.FindStringSubmatch(d.Stderr.String()); m != nil {
			url = m[1]
			return true
		}
		return false
	})
	return url
}

// StartServe runs alkblobfs serve with args and waits until it listens.
func StartServe(t *testing.T, c *CLI, args ...string) *Server {
	t.Helper()
	return StartServeAt(t, c, ServingURL, args...)
}

// StartServeURL is StartServe finding the URL in the log by pattern.
func StartServeURL(t *testing.T, c *CLI, pattern string, args ...string) *Server {
	t.Helper()
	return StartServeAt(t, c, regexp.MustCompile(pattern), args...)
}

// StartServeAt runs alkblobfs serve with args and waits until its log
// shows servingURL (first group: the URL); the test's cleanup kills it.
func StartServeAt(t *testing.T, c *CLI, servingURL *regexp.Regexp, args ...string) *Server {
	t.Helper()
	if BuildErr != nil {
		t.Fatal(BuildErr)
	}
	s := &Server{Stderr: &SyncBuffer{}, Done: make(chan struct{})}
	s.Cmd = exec.Command(Bin, append(append([]string{"--data", c.Data}, c.Flags...), append([]string{"serve"}, args...)...)...)
	s.Cmd.Env = c.Environ()
	s.Cmd.Stderr = s.Stderr
	if err := s.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.Cmd.Wait(); close(s.Done) }()
	t.Cleanup(func() {
		select {
		case <-s.Done:
		default:
			s.Cmd.Process.Kill()
			<-s.Done
		}
	})
	Eventually(t, 20*time.Second, "serve to listen", func() bool {
		if m := servingURL.FindStringSubmatch(s.Stderr.String()); m != nil {
			s.URL = m[1]
			return true
		}
		select {
		case <-s.Done:
			t.Fatalf("serve exited: %s", s.Stderr.String())
		default:
		}
		return false
	})
	return s
}

// UnixGet is GET http://alkblobfs/PATH on the Unix socket sock: its
// status and body.
func UnixGet(t *testing.T, sock, path string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://alkblobfs" + path)
	if err != nil {
		t.Fatalf("GET %s on %s: %v", path, sock, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s on %s: %v", path, sock, err)
	}
	return resp.StatusCode, string(body)
}

// ScrapeMetrics reads and parses url/metrics.
func ScrapeMetrics(t *testing.T, url string) map[string]*dto.MetricFamily {
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

// MetricValue is a metric's value (a histogram's count), for the series
// whose op label is op ("" for a metric without labels).
func MetricValue(fams map[string]*dto.MetricFamily, name, op string) float64 {
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

// HTTPStatus is the status of a request to the server at url.
func HTTPStatus(t *testing.T, method, url string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// WantHTTPRefused checks that GET of digest from the server at url is
// refused as known corrupt: 500, before any byte of the blob, with a body
// that names the digest and no server path.
func WantHTTPRefused(t *testing.T, url, digest, data string) {
	t.Helper()
	resp, err := http.Get(url + "/v1/blobs/" + digest)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e struct{ Error string }
	if resp.StatusCode != http.StatusInternalServerError || json.Unmarshal(body, &e) != nil {
		t.Fatalf("GET of a blob a scrub found corrupt: %d %q; want 500 and a JSON error", resp.StatusCode, body)
	}
	if !strings.Contains(e.Error, "known corrupt") || !strings.Contains(e.Error, digest) ||
		strings.Contains(e.Error, data) || strings.Contains(e.Error, "/tmp") {
		t.Fatalf("GET refusal %q: want it to say known corrupt and name the digest, and no server path", e.Error)
	}
}

// WantCLIRefused checks that get and cat, separate processes beside the
// Server that scrubbed, refuse digest up front: exit 1, one clear line,
// nothing on stdout, and no file left where -o pointed.
func WantCLIRefused(t *testing.T, c *CLI, digest string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	for _, args := range [][]string{{"get", digest}, {"cat", digest}, {"get", digest, "-o", out}} {
		r := c.Run(nil, args...)
		CheckFail(t, r, 1, "known corrupt", args)
		if r.Stdout != "" || !strings.Contains(r.Stderr, digest) {
			t.Fatalf("alkblobfs %s: stdout %d bytes, stderr %q; want nothing on stdout and the digest named", strings.Join(args, " "), len(r.Stdout), r.Stderr)
		}
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("get -o of a corrupt blob left %s: %v", out, err)
	}
}
