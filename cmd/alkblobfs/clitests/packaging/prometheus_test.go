//go:build linux

package packaging

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
)

// The alert rules and the dashboard an operator installs (contrib/), as
// paths from this directory.
const (
	alertRules = "../../../../contrib/prometheus/alkblobfs-alerts.yml"
	alertTests = "../../../../contrib/prometheus/alkblobfs-alerts.test.yml"
	dashboard  = "../../../../contrib/grafana/alkblobfs.json"
)

// TestPrometheusRules: promtool accepts the alert rules and their unit
// tests pass (each alert fires on the series that should raise it and
// not on a healthy twin); every alert has a test; the dashboard is
// Grafana JSON whose every panel queries the dashboard's Prometheus.
func TestPrometheusRules(t *testing.T) {
	t.Parallel()
	debTool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", alertRules}, {"test", "rules", alertTests}} {
		if b, err := exec.Command("promtool", args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, b)
		}
	}
	rules, err := os.ReadFile(alertRules)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(alertTests)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*- alert: (\w+)$`).FindAllStringSubmatch(string(rules), -1) {
		if !regexp.MustCompile(`(?m)^\s*alertname: ` + m[1] + `$`).Match(tests) {
			t.Errorf("alert %s has no unit test in %s", m[1], filepath.Base(alertTests))
		}
	}
	for _, e := range dashboardExprs(t) {
		if e.datasource != "${datasource}" {
			t.Errorf("panel %q queries datasource %q; want ${datasource}, the dashboard's variable", e.panel, e.datasource)
		}
	}
}

type dashExpr struct{ panel, expr, datasource string }

// dashboardExprs are the queries of every panel of the dashboard.
func dashboardExprs(t *testing.T) []dashExpr {
	t.Helper()
	b, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		Expr       string `json:"expr"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	}
	var d struct {
		Title  string `json:"title"`
		Panels []struct {
			Type    string   `json:"type"`
			Title   string   `json:"title"`
			Targets []target `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	var out []dashExpr
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Expr == "" {
				t.Errorf("panel %q has an empty query", p.Title)
			}
			out = append(out, dashExpr{p.Title, tg.Expr, tg.Datasource.UID})
		}
	}
	if len(out) < 20 {
		t.Fatalf("%s: %d queries; the panels did not parse", dashboard, len(out))
	}
	return out
}

// TestPrometheusScrape: a real Prometheus scrapes two real mounts' /metrics
// (one on the local default store, one on S3 with a cache) and loads the
// alert rules; every metric the rules and the dashboard name has a series,
// every dashboard query returns one, and every rule evaluates without an
// error: no misspelled metric name, label or function passes.
func TestPrometheusScrape(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	debTool(t, "prometheus")
	s3url := s3test.URL(t)

	// The local store, with the sweep timer on.
	local := clitest.NewCLI(t)
	local.OK("ns", "create", "p")
	local.OK("ns", "quota", "p", "--bytes", "1GiB") // for the quota alert's series
	mntA := t.TempDir()
	a := clitest.StartDaemon(t, local.Data, mntA, "--listen", "127.0.0.1:0", "--insecure-loopback", "--sweep-every", "1h")
	// S3 with a cache.
	flags := []string{"--large", s3url, "--cache", filepath.Join(t.TempDir(), "cache")}
	remote := clitest.NewCLI(t, flags...)
	remote.OK("ns", "create", "p")
	mntB := t.TempDir()
	b := clitest.StartDaemon(t, remote.Data, mntB, append(flags, "--listen", "127.0.0.1:0", "--insecure-loopback")...)
	urls := []string{a.HTTPURL(), b.HTTPURL()}

	// Something to count: a write, a publish and a read through each
	// mount (a cache miss and a fill on S3), and an HTTP 404.
	for _, mnt := range []string{mntA, mntB} {
		_, content, digest := clitest.WriteFile(t, t.TempDir(), 300<<10, 7)
		if err := os.WriteFile(filepath.Join(mnt, "p", "incoming", "f"), content, 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(mnt, "p", digest)); err != nil || len(got) != len(content) {
			t.Fatalf("reading back %s: %d bytes, %v", digest, len(got), err)
		}
	}
	for _, u := range urls {
		resp, err := http.Get(u + "/v1/blobs/sha256:" + strings.Repeat("0", 64))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}

	prom := startPrometheus(t, urls)

	// Both targets up, and the tier sizes (counted in the background
	// after the first scrape) in.
	clitest.Eventually(t, 60*time.Second, "Prometheus to scrape both mounts and their tier sizes", func() bool {
		up, _ := prom.query(`up{job="alkblobfs"} == 1`)
		tiers, _ := prom.query(`count by (instance) (alkblobfs_tier_bytes)`)
		return len(up) == 2 && len(tiers) == 2
	})

	// The rules as Prometheus loaded them.
	var rules []string
	clitest.Eventually(t, 30*time.Second, "Prometheus to load and evaluate the alert rules", func() bool {
		rules = rules[:0]
		loaded, ok := prom.rules(t)
		for _, r := range loaded {
			if r.Health != "ok" {
				t.Fatalf("rule %s: health %s: %s", r.Name, r.Health, r.LastError)
			}
			rules = append(rules, r.Query)
		}
		return ok
	})
	b2, _ := os.ReadFile(alertRules)
	if n := strings.Count(string(b2), "- alert: "); len(rules) != n {
		t.Fatalf("Prometheus loaded %d rules; %s has %d alerts", len(rules), filepath.Base(alertRules), n)
	}

	exprs := dashboardExprs(t)
	vars := strings.NewReplacer("$__rate_interval", "1m", "$job", ".+", "$instance", ".+")
	names := map[string]bool{}
	metric := regexp.MustCompile(`\b(alkblobfs|process|go)_[a-z0-9_]+\b`)
	for _, q := range rules {
		for _, n := range metric.FindAllString(q, -1) {
			names[n] = true
		}
		if _, err := prom.query(q); err != nil {
			t.Errorf("rule %s: %v", q, err)
		}
	}
	for _, e := range exprs {
		for _, n := range metric.FindAllString(e.expr, -1) {
			names[n] = true
		}
	}
	var sorted []string
	for n := range names {
		sorted = append(sorted, n)
	}
	slices.Sort(sorted)
	t.Logf("%d rules, %d dashboard queries, %d metrics: %s", len(rules), len(exprs), len(sorted), strings.Join(sorted, " "))

	// Every name a series; every dashboard query a result. A rate needs
	// two samples in its window: wait for them, within a deadline.
	missing := func() []string {
		var out []string
		for _, n := range sorted {
			if r, err := prom.query(n); err != nil || len(r) == 0 {
				out = append(out, fmt.Sprintf("metric %s: no series (%v)", n, err))
			}
		}
		for _, e := range exprs {
			if r, err := prom.query(vars.Replace(e.expr)); err != nil || len(r) == 0 {
				out = append(out, fmt.Sprintf("dashboard panel %q: %s: no result (%v)", e.panel, e.expr, err))
			}
		}
		return out
	}
	var last []string
	deadline := time.Now().Add(60 * time.Second)
	for last = missing(); len(last) > 0 && time.Now().Before(deadline); last = missing() {
		time.Sleep(time.Second) // the next scrape: polled, with the deadline above
	}
	for _, m := range last {
		t.Error(m)
	}
}

// promServer is a Prometheus server the test started.
type promServer struct{ url string }

// startPrometheus runs prometheus scraping targets (http URLs) every
// second, with the alert rules loaded and its storage in a temporary
// directory, on a free loopback port; it waits until it is ready.
func startPrometheus(t *testing.T, targets []string) *promServer {
	t.Helper()
	dir := t.TempDir()
	rules, err := filepath.Abs(alertRules)
	if err != nil {
		t.Fatal(err)
	}
	var hosts []string
	for _, u := range targets {
		hosts = append(hosts, fmt.Sprintf("%q", strings.TrimPrefix(u, "http://")))
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: alkblobfs
    static_configs:
      - targets: [%s]
`, rules, strings.Join(hosts, ", "))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	var logs clitest.SyncBuffer
	cmd := exec.Command("prometheus", "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("prometheus's log:\n%s", logs.String())
		}
	})
	p := &promServer{url: "http://" + addr}
	clitest.Eventually(t, 30*time.Second, "prometheus to be ready on "+addr, func() bool {
		select {
		case <-exited:
			t.Fatalf("prometheus exited:\n%s", logs.String())
		default:
		}
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// query runs an instant query and returns its result vector (a scalar
// is one element).
func (p *promServer) query(q string) ([]json.RawMessage, error) {
	resp, err := http.Get(p.url + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", r.Status, r.Error)
	}
	if r.Data.ResultType == "scalar" {
		return []json.RawMessage{r.Data.Result}, nil
	}
	var v []json.RawMessage
	err = json.Unmarshal(r.Data.Result, &v)
	return v, err
}

type promRule struct {
	Name, Query, Health, LastError string
	LastEvaluation                 time.Time
}

// rules lists the loaded rules; ok once each has been evaluated.
func (p *promServer) rules(t *testing.T) (rules []promRule, ok bool) {
	resp, err := http.Get(p.url + "/api/v1/rules")
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Groups []struct {
				Rules []promRule `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("/api/v1/rules: %v", err)
	}
	ok = len(r.Data.Groups) > 0
	for _, g := range r.Data.Groups {
		for _, rule := range g.Rules {
			rules = append(rules, rule)
			ok = ok && !rule.LastEvaluation.IsZero() && rule.LastEvaluation.Year() > 1
		}
	}
	return rules, ok
}
