package ops

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/alkblobfs/alkblobfs/store"
	"github.com/alkblobfs/alkblobfs/upkeep"
)

// MountStats is what a mount attached to the metrics reports: the same
// counters its .alkblobfs/stats file shows.
type MountStats struct {
	OpenHandles     int64
	OpenDigests     int64
	Receipts        int64
	UploadsInFlight int64
	Opens           int64
	Reads           int64
	BytesRead       int64
	Writes          int64
	BytesWritten    int64
	Publishes       int64
	PublishFailures int64
	VerifyFailures  int64
	CrashRestarts   int64
}

// Metrics is the Prometheus side of a store (and of a mount, once
// attached): GET /metrics. Counters are read from the store's and the
// mount's own counters at each scrape, so /metrics and the mount's stats
// file never disagree.
type Metrics struct {
	st  *store.Store
	reg *prometheus.Registry

	requests *prometheus.CounterVec
	fuse     *prometheus.HistogramVec

	errMu  sync.Mutex
	errors map[string]int64 // by kind

	mount  atomic.Pointer[func() MountStats]
	tokens atomic.Pointer[func() int]
	upkeep atomic.Pointer[upkeep.Upkeep]

	tiers recounter[tierSize]
}

// NewMetrics returns the metrics of st.
func NewMetrics(st *store.Store) *Metrics {
	m := &Metrics{
		st:  st,
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "alkblobfs_http_requests_total",
			Help: "HTTP requests answered, by route and status code.",
		}, []string{"route", "code"}),
		fuse: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "alkblobfs_fuse_request_duration_seconds",
			Help: "Time the daemon took to answer a FUSE request, by operation.",
			// 10 µs to 2.6 s: a cached getattr to a publish of a big file.
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10),
		}, []string{"op"}),
		errors: make(map[string]int64),
		tiers:  recounter[tierSize]{every: tierInterval, count: countTiers(st)},
	}
	m.reg.MustRegister(m.requests, m.fuse, (*storeCollector)(m),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// handlerWith serves the metrics and extra's, which is collected for this
// scrape alone (a caller's view).
func (m *Metrics) handlerWith(extra prometheus.Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(extra)
	return promhttp.HandlerFor(prometheus.Gatherers{m.reg, reg}, promhttp.HandlerOpts{})
}

// Close stops a tier count under way and waits for it.
func (m *Metrics) Close() { m.tiers.close() }

// AttachMount adds a mount's counters to the metrics.
func (m *Metrics) AttachMount(stats func() MountStats) { m.mount.Store(&stats) }

// AttachUpkeep adds the scrubs of the upkeep that serves the store (sweeps
// are the store's own counters: every sweep of the process counts).
func (m *Metrics) AttachUpkeep(u *upkeep.Upkeep) { m.upkeep.Store(u) }

// ObserveFUSE records one FUSE request's latency (fusefs.Config.Observe).
func (m *Metrics) ObserveFUSE(op string, d time.Duration) {
	m.fuse.WithLabelValues(op).Observe(d.Seconds())
}

// countError counts one failed request by kind.
func (m *Metrics) countError(kind string) {
	m.errMu.Lock()
	m.errors[kind]++
	m.errMu.Unlock()
}

// storeCollector reads the store's (and the mount's) counters at scrape
// time.
type storeCollector Metrics

var (
	descPuts           = desc("alkblobfs_puts_total", "Blobs put (dedups included).")
	descDedups         = desc("alkblobfs_dedups_total", "Puts of content already stored: nothing written.")
	descBytesIn        = desc("alkblobfs_bytes_in_total", "Bytes put.")
	descGets           = desc("alkblobfs_gets_total", "Blobs opened for reading.")
	descBytesOut       = desc("alkblobfs_bytes_out_total", "Bytes read from the store.")
	descPins           = desc("alkblobfs_pins", "Pins held by this process.")
	descPinned         = desc("alkblobfs_pinned_digests", "Distinct digests pinned by this process.")
	descLapsed         = desc("alkblobfs_pins_lapsed_total", "Pin rows found expired at renewal.")
	descUploadMem      = desc("alkblobfs_upload_memory_bytes", "Bytes uploads hold in memory now.")
	descTokens         = desc("alkblobfs_pin_tokens", "Pin tokens handed out by the HTTP surface and still live.")
	descErrors         = desc("alkblobfs_errors_total", "Failed requests, by kind.", "kind")
	descSweeps         = desc("alkblobfs_sweeps_total", "Sweeps run (aborted ones included).")
	descSweepFail      = desc("alkblobfs_sweep_failures_total", "Sweeps that ended with an operational error.")
	descSweepAbort     = desc("alkblobfs_sweep_aborts_total", "Sweeps that deliberately did nothing, by cause.", "cause")
	descScanned        = desc("alkblobfs_sweep_scanned_total", "Pool entries sweeps enumerated.")
	descQueued         = desc("alkblobfs_sweep_queued_total", "Delete candidates sweeps queued.")
	descCacheHits      = desc("alkblobfs_cache_hits_total", "Opens of a remote blob served by its local copy (--cache).")
	descCacheMisses    = desc("alkblobfs_cache_misses_total", "Opens of a remote blob with no local copy.")
	descCacheFills     = desc("alkblobfs_cache_fills_total", "Blobs fetched into the cache and published.")
	descCacheFilled    = desc("alkblobfs_cache_filled_bytes_total", "Bytes fetched from the remote tier into the cache.")
	descCacheAdopted   = desc("alkblobfs_cache_adopted_total", "Puts whose file became the cached copy by a link.")
	descCacheEvictions = desc("alkblobfs_cache_evictions_total", "Cached copies evicted to stay within --cache-size or the disk.")
	descCacheDropped   = desc("alkblobfs_cache_dropped_corrupt_total", "Cached copies found corrupt and dropped.")
	descCacheFillErr   = desc("alkblobfs_cache_fill_errors_total", "Fills given up, by cause (remote, nospace, full, verify, local, busy, put_nospace).", "cause")
	descCacheBytes     = desc("alkblobfs_cache_bytes", "Bytes of the cached copies (every process of the host).")
	descCacheBlobs     = desc("alkblobfs_cache_blobs", "Cached copies (every process of the host).")
	descCacheLimit     = desc("alkblobfs_cache_limit_bytes", "The cache's --cache-size.")
	descDeleted        = desc("alkblobfs_sweep_deleted_total", "Blobs sweeps deleted.")
	descCancelled      = desc("alkblobfs_sweep_cancelled_total", "Queued candidates found live again at delete time.")
	descFreed          = desc("alkblobfs_sweep_freed_bytes_total", "Bytes sweeps freed.")
	descReaped         = desc("alkblobfs_sweep_pins_reaped_total", "Expired pin rows sweeps removed.")
	descScrubs         = desc("alkblobfs_scrubs_total", "Scrubs run (stopped ones included).")
	descScrubBad       = desc("alkblobfs_scrub_found_bad_total", "Blobs scrubs found corrupt, unreadable or lost (linked, with no content).")
	descSweepEvery     = desc("alkblobfs_sweep_interval_seconds", "The sweep timer's interval; 0 when it is off.")
	descSweepLastOK    = desc("alkblobfs_sweep_last_success_timestamp_seconds", "When a sweep of this process last ended without an error (aborts included), or when its upkeep started if none has yet.")
	descFSSize         = desc("alkblobfs_filesystem_size_bytes", "Size of the filesystem that holds the large tier's files (absent for S3, PostgreSQL or memory).")
	descFSAvail        = desc("alkblobfs_filesystem_avail_bytes", "Bytes an unprivileged writer can still put on the filesystem of the large tier's files.")
	descTierBlobs      = desc("alkblobfs_tier_blobs", "Blobs in a tier (counted at most once a minute).", "tier")
	descTierBytes      = desc("alkblobfs_tier_bytes", "Bytes in a tier (counted at most once a minute).", "tier")

	descMountHandles   = desc("alkblobfs_mount_open_handles", "Files open on the mount.")
	descMountDigests   = desc("alkblobfs_mount_open_digests", "Distinct blobs open on the mount (each pinned).")
	descMountReceipts  = desc("alkblobfs_mount_receipts", "Receipts the mount keeps in incoming/.")
	descMountUploads   = desc("alkblobfs_mount_uploads_in_flight", "Files being written in incoming/.")
	descMountOpens     = desc("alkblobfs_mount_opens_total", "Blob opens on the mount.")
	descMountReads     = desc("alkblobfs_mount_reads_total", "Read requests the daemon served.")
	descMountBytesOut  = desc("alkblobfs_mount_read_bytes_total", "Bytes the daemon served to readers.")
	descMountWrites    = desc("alkblobfs_mount_writes_total", "Write requests into incoming/.")
	descMountBytesIn   = desc("alkblobfs_mount_written_bytes_total", "Bytes written into incoming/.")
	descMountPublishes = desc("alkblobfs_mount_publishes_total", "Files published from incoming/.")
	descMountRestarts  = desc("alkblobfs_mount_crash_restarts_total", "Times the mount's guard restarted its daemon after a crash, on the live connection (mount --restart-on-crash).")
)

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

// Describe describes nothing: an unchecked collector, so that registering
// it does not collect (which would start a tier count).
func (c *storeCollector) Describe(chan<- *prometheus.Desc) {}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	s := c.st.Stats()
	counter(descPuts, s.Puts)
	counter(descDedups, s.Dedups)
	counter(descBytesIn, s.BytesIn)
	counter(descGets, s.Reads)
	counter(descBytesOut, s.BytesOut)
	gauge(descPins, int64(s.Pins))
	gauge(descPinned, int64(s.Pinned))
	counter(descLapsed, s.PinsLapsed)
	gauge(descUploadMem, s.UploadMemory)
	if f := c.tokens.Load(); f != nil {
		gauge(descTokens, int64((*f)()))
	}

	sw := s.Sweeps
	counter(descSweeps, sw.Runs)
	counter(descSweepFail, sw.Failed)
	for cause, n := range sw.Aborted {
		counter(descSweepAbort, n, string(cause))
	}
	counter(descScanned, sw.Scanned)
	counter(descQueued, sw.Queued)
	counter(descDeleted, sw.Deleted)
	counter(descCancelled, sw.Cancelled)
	counter(descFreed, sw.BytesFreed)
	counter(descReaped, sw.Reaped)
	if c.st.HasCache() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		cs, err := c.st.CacheStats(ctx)
		cancel()
		if err == nil {
			// This process's counters (a scrape is of one process); the
			// size is the host's.
			p := cs.Process
			counter(descCacheHits, p.Hits)
			counter(descCacheMisses, p.Misses)
			counter(descCacheFills, p.Fills)
			counter(descCacheFilled, p.BytesFilled)
			counter(descCacheAdopted, p.Adopted)
			counter(descCacheEvictions, p.Evictions)
			counter(descCacheDropped, p.Dropped)
			// Every cause from 0, so that the first fill error is an
			// increase to rate() and not a series born at 1.
			for _, cause := range fillErrorCauses {
				if _, ok := p.FillErrors[cause]; !ok {
					counter(descCacheFillErr, 0, cause)
				}
			}
			for cause, n := range p.FillErrors {
				counter(descCacheFillErr, n, cause)
			}
			gauge(descCacheBytes, cs.Bytes)
			gauge(descCacheBlobs, cs.Blobs)
			gauge(descCacheLimit, cs.Limit)
		}
	}
	if u := c.upkeep.Load(); u != nil {
		counter(descScrubs, u.Scrubber.Runs())
		counter(descScrubBad, u.Scrubber.Found())
		ch <- prometheus.MustNewConstMetric(descSweepEvery, prometheus.GaugeValue, u.Sweeper.Every().Seconds())
		ch <- prometheus.MustNewConstMetric(descSweepLastOK, prometheus.GaugeValue, float64(u.Sweeper.LastSuccess().UnixNano())/1e9)
	}
	if fs, ok, err := c.st.StatFS(); ok && err == nil {
		gauge(descFSSize, int64(fs.Blocks)*fs.Frsize)
		gauge(descFSAvail, int64(fs.Bavail)*fs.Frsize)
	}

	errs := map[string]int64{}
	c.errMu.Lock()
	for k, v := range c.errors {
		errs[k] = v
	}
	c.errMu.Unlock()
	if f := c.mount.Load(); f != nil {
		ms := (*f)()
		gauge(descMountHandles, ms.OpenHandles)
		gauge(descMountDigests, ms.OpenDigests)
		gauge(descMountReceipts, ms.Receipts)
		gauge(descMountUploads, ms.UploadsInFlight)
		counter(descMountOpens, ms.Opens)
		counter(descMountReads, ms.Reads)
		counter(descMountBytesOut, ms.BytesRead)
		counter(descMountWrites, ms.Writes)
		counter(descMountBytesIn, ms.BytesWritten)
		counter(descMountPublishes, ms.Publishes)
		counter(descMountRestarts, ms.CrashRestarts)
		errs["mount_publish"] += ms.PublishFailures
		errs["mount_verification"] += ms.VerifyFailures
	}
	for kind, n := range errs {
		counter(descErrors, n, kind)
	}
	for _, t := range c.tiers.get() {
		gauge(descTierBlobs, t.blobs, string(t.tier))
		gauge(descTierBytes, t.bytes, string(t.tier))
	}
}

// fillErrorCauses are the causes alkblobfs_cache_fill_errors_total's help
// names (the cache engine's fillError calls).
var fillErrorCauses = []string{"remote", "nospace", "full", "verify", "local", "busy", "put_nospace"}

// tierInterval is how often tier sizes are counted at most.
var tierInterval = time.Minute

type tierSize struct {
	tier         store.Tier
	blobs, bytes int64
}

// countTiers counts each tier's blobs and bytes by listing it (for a
// recounter: a scrape never waits for a listing).
func countTiers(st *store.Store) func(ctx context.Context) ([]tierSize, bool) {
	return func(ctx context.Context) ([]tierSize, bool) {
		var sizes []tierSize
		// A tier whose listing fails is left out of this count.
		got, _ := st.TierSizes(ctx)
		for _, ts := range got {
			sizes = append(sizes, tierSize{tier: ts.Tier, blobs: ts.Blobs, bytes: ts.Bytes})
		}
		return sizes, true
	}
}
