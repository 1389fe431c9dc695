package ops_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/ops"
	"github.com/alkblobfs/alkblobfs/upkeep"
)

// scrape fetches /metrics and parses it with the Prometheus text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	status, h, body := request(t, "GET", url+"/metrics", nil, nil)
	if status != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
		t.Fatalf("/metrics: %d, %s", status, h.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v\n%s", err, body)
	}
	return fams
}

// value is the metric's value for the label pairs given (name=value).
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			found := false
			for _, lp := range m.Label {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

func TestMetrics(t *testing.T) {
	ops.SetTierInterval(t, 10*time.Millisecond)
	e := newEnv(t, envOptions{})
	m0 := scrape(t, e.url)
	for _, name := range []string{"alkblobfs_puts_total", "alkblobfs_bytes_in_total", "alkblobfs_pins", "alkblobfs_sweeps_total", "alkblobfs_upload_memory_bytes", "go_goroutines"} {
		if _, ok := value(m0, name); !ok {
			t.Errorf("%s missing", name)
		}
	}
	b := randBytes(200<<10, 21)
	d, tok := e.put(t, "builds", b)
	e.put(t, "builds", []byte("small"))
	request(t, "GET", e.url+"/v1/blobs/"+d.String(), nil, nil)
	request(t, "GET", e.url+"/v1/blobs/"+blob.Sum(nil).String(), nil, nil) // 404
	e.c.Release(t.Context(), tok)
	e.svc.Unlink(t.Context(), "builds", d)
	e.sweepAll(t)

	m1 := scrape(t, e.url)
	for _, c := range []struct {
		name   string
		labels []string
		delta  float64
	}{
		{"alkblobfs_puts_total", nil, 2},
		{"alkblobfs_bytes_in_total", nil, float64(len(b) + 5)},
		{"alkblobfs_gets_total", nil, 1},
		{"alkblobfs_errors_total", []string{"kind=not_found"}, 1},
		{"alkblobfs_http_requests_total", []string{"route=put", "code=201"}, 2},
		{"alkblobfs_http_requests_total", []string{"route=get", "code=404"}, 1},
		{"alkblobfs_sweeps_total", nil, 2},
		{"alkblobfs_sweep_deleted_total", nil, 1},
		{"alkblobfs_sweep_freed_bytes_total", nil, float64(len(b))},
		{"alkblobfs_pin_tokens", nil, 1}, // the small blob's token
	} {
		before, _ := value(m0, c.name, c.labels...)
		after, ok := value(m1, c.name, c.labels...)
		if !ok || after-before != c.delta {
			t.Errorf("%s%v: %v → %v (present %v); want +%v", c.name, c.labels, before, after, ok, c.delta)
		}
	}
	// Tier sizes are counted in the background after the first scrape.
	deadline := time.Now().Add(5 * time.Second)
	for {
		fams := scrape(t, e.url)
		kv, ok1 := value(fams, "alkblobfs_tier_blobs", "tier=kv")
		large, _ := value(fams, "alkblobfs_tier_blobs", "tier=large")
		if ok1 && kv == 1 && large == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alkblobfs_tier_blobs{tier=kv} = %v (present %v)", kv, ok1)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A mount attached to the metrics adds its counters and the FUSE latency
// histogram (checked end to end with a real mount in cmd/alkblobfs).
func TestMetricsMount(t *testing.T) {
	e := newEnv(t, envOptions{})
	m := ops.NewMetrics(e.st)
	m.AttachMount(func() ops.MountStats { return ops.MountStats{OpenHandles: 3, Receipts: 2, PublishFailures: 1} })
	m.ObserveFUSE("lookup", 80*time.Microsecond)
	m.ObserveFUSE("lookup", 2*time.Millisecond)
	rec := &recorder{header: http.Header{}}
	req, _ := http.NewRequest("GET", "/metrics", nil)
	m.Handler().ServeHTTP(rec, req)
	fams, err := func() (map[string]*dto.MetricFamily, error) {
		p := expfmt.NewTextParser(model.UTF8Validation)
		return p.TextToMetricFamilies(&rec.body)
	}()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"alkblobfs_mount_open_handles", nil, 3},
		{"alkblobfs_mount_receipts", nil, 2},
		{"alkblobfs_errors_total", []string{"kind=mount_publish"}, 1},
		{"alkblobfs_fuse_request_duration_seconds", []string{"op=lookup"}, 2},
	} {
		if got, ok := value(fams, c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v); want %v", c.name, c.labels, got, ok, c.want)
		}
	}
}

type recorder struct {
	header http.Header
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(p []byte) (int, error) { return r.body.Write(p) }
func (r *recorder) WriteHeader(int)             {}

// The series the shipped alert rules (contrib/prometheus) need from the
// start: the sweep timer and when a sweep last succeeded (an alert on
// sweeps that stopped compares the two), and the large tier's filesystem
// (an alert on a disk nearly full).
func TestMetricsSweepTimerAndDisk(t *testing.T) {
	e := newEnv(t, envOptions{})
	start := time.Now()
	u, err := upkeep.New(upkeep.Config{Store: e.st, SweepEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	m := ops.NewMetrics(e.st)
	m.AttachUpkeep(u)
	get := func() map[string]*dto.MetricFamily {
		rec := &recorder{header: http.Header{}}
		req, _ := http.NewRequest("GET", "/metrics", nil)
		m.Handler().ServeHTTP(rec, req)
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(&rec.body)
		if err != nil {
			t.Fatal(err)
		}
		return fams
	}
	f := get()
	if v, ok := value(f, "alkblobfs_sweep_interval_seconds"); !ok || v != 3600 {
		t.Errorf("alkblobfs_sweep_interval_seconds = %v (present %v); want 3600", v, ok)
	}
	// Before any sweep: the upkeep's start, so that "no sweep for three
	// intervals" counts from there.
	first, ok := value(f, "alkblobfs_sweep_last_success_timestamp_seconds")
	if !ok || first < float64(start.Unix()-1) || first > float64(time.Now().Unix()+1) {
		t.Errorf("alkblobfs_sweep_last_success_timestamp_seconds = %v (present %v); want the upkeep's start, %v", first, ok, start.Unix())
	}
	if _, err := u.Sweeper.Run(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := u.Sweeper.Set("off"); err != nil {
		t.Fatal(err)
	}
	f = get()
	if v, _ := value(f, "alkblobfs_sweep_last_success_timestamp_seconds"); v <= first {
		t.Errorf("after a sweep alkblobfs_sweep_last_success_timestamp_seconds = %v; want later than %v", v, first)
	}
	if v, ok := value(f, "alkblobfs_sweep_interval_seconds"); !ok || v != 0 {
		t.Errorf("timer off: alkblobfs_sweep_interval_seconds = %v (present %v); want 0", v, ok)
	}
	size, ok1 := value(f, "alkblobfs_filesystem_size_bytes")
	avail, ok2 := value(f, "alkblobfs_filesystem_avail_bytes")
	if !ok1 || !ok2 || size <= 0 || avail <= 0 || avail > size {
		t.Errorf("alkblobfs_filesystem_{size,avail}_bytes = %v, %v (present %v, %v)", size, avail, ok1, ok2)
	}

	// A store whose large tier is no directory has no filesystem to report.
	m = ops.NewMetrics(newEnv(t, envOptions{kvOnly: true}).st)
	if _, ok := value(get(), "alkblobfs_filesystem_size_bytes"); ok {
		t.Errorf("a store without a large tier reports alkblobfs_filesystem_size_bytes")
	}
}
