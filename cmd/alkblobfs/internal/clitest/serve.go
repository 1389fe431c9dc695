//go:build linux

package clitest

import (
	"bytes"
	"io"
	"net/http"
	"os/exec"
	"regexp"
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

// StartServeURL is startServe finding the URL in the log by pattern.
func StartServeURL(t *testing.T, c *CLI, pattern string, args ...string) *Server {
	t.Helper()
	return StartServeAt(t, c, regexp.MustCompile(pattern), args...)
}

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
