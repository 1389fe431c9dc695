package fusefs

import (
	"context"
	"errors"

	"github.com/alkblobfs/alkblobfs/store"
	"github.com/alkblobfs/alkblobfs/upkeep"
)

// Stats is what /.alkblobfs/stats shows.
type Stats struct {
	Mountpoint string      `json:"mountpoint,omitempty"`
	Verify     Verify      `json:"verify"`
	Store      store.Stats `json:"store"`
	Namespaces int         `json:"namespaces"`
	// Cache is the large tier's local cache (--cache), if any.
	Cache *store.CacheStats `json:"cache,omitempty"`

	OpenHandles  int64 `json:"open_handles"`
	OpenDigests  int   `json:"open_digests"`
	Opens        int64 `json:"opens"`
	Reads        int64 `json:"reads"`
	BytesRead    int64 `json:"bytes_out"`
	Writes       int64 `json:"writes"`
	BytesWritten int64 `json:"bytes_in"`

	Uploads         int64 `json:"uploads_started"`
	UploadsInFlight int   `json:"uploads_in_flight"`
	Publishes       int64 `json:"publishes"`
	PublishFailures int64 `json:"publish_failures"`
	Superseded      int64 `json:"superseded"`
	Receipts        int64 `json:"receipts"`
	VerifyFailures  int64 `json:"verify_failures"`
	ChangedOnDisk   int64 `json:"changed_on_disk"`

	Passthrough PassthroughStats `json:"passthrough"`

	Scrub ScrubStats `json:"scrub"`

	SweepTimer string        `json:"sweep_timer"`
	Sweeps     int64         `json:"sweeps"`
	LastSweep  *store.Report `json:"last_sweep,omitempty"`

	// CrashRestarts counts the times the guard restarted a crashed
	// daemon on this mount's connection (--restart-on-crash).
	CrashRestarts uint64 `json:"crash_restarts"`
}

// ScrubStats describes the mount's scrubs.
type ScrubStats struct {
	Every string `json:"every"` // "off" or a duration
	// Rate is the most bytes a scrub reads a second; 0 is unlimited.
	Rate int64 `json:"rate_bytes_per_s"`
	Runs int64 `json:"runs"`
	// Found counts the blobs scrubs found corrupt or unreadable.
	Found int64 `json:"found_bad"`
	// Refused counts the blobs the store knows to be corrupt (a scrub in
	// any process found them so): refused at open, or served verified only
	// when their file has changed since, until they are repaired.
	Refused int                 `json:"refused"`
	Last    *upkeep.ScrubReport `json:"last,omitempty"`
}

// PassthroughStats says whether the kernel reads local blobs directly.
type PassthroughStats struct {
	Active       bool   `json:"active"`
	Reason       string `json:"reason,omitempty"`
	Opens        int64  `json:"opens"`
	CachedOpens  int64  `json:"cached_opens"`
	FellBackOnce bool   `json:"fell_back,omitempty"`
}

// Stats is a snapshot of the mount's counters and its namespace count.
func (f *FS) Stats(ctx context.Context) Stats {
	s := f.Counters()
	switch cs, err := f.st.CacheStats(ctx); {
	case err == nil:
		s.Cache = &cs
	case !errors.Is(err, store.ErrNoCache):
		f.log.Warn("stats: could not read the cache's", "err", err)
	}
	if bad, err := f.st.Corrupt(ctx); err == nil {
		s.Scrub.Refused = len(bad)
	} else {
		f.log.Warn("stats: listing the blobs known corrupt", "err", err)
	}
	for _, err := range f.reg.Names(ctx, "") {
		if err != nil {
			break
		}
		s.Namespaces++
	}
	return s
}

// Counters is Stats without the namespace count, which takes a walk of
// the registry: what a metrics scrape reads.
func (f *FS) Counters() Stats {
	s := Stats{
		Verify:       f.cfg.Verify,
		Store:        f.st.Stats(),
		OpenHandles:  f.stats.openHandles.Load(),
		OpenDigests:  f.refs.len(),
		Opens:        f.stats.opens.Load(),
		Reads:        f.stats.reads.Load(),
		BytesRead:    f.stats.bytesRead.Load(),
		Writes:       f.stats.writes.Load(),
		BytesWritten: f.stats.bytesWritten.Load(),

		Uploads:         f.stats.uploads.Load(),
		Publishes:       f.stats.publishes.Load(),
		PublishFailures: f.stats.publishFailures.Load(),
		Superseded:      f.stats.superseded.Load(),
		Receipts:        f.stats.receipts.Load(),
		VerifyFailures:  f.stats.verifyFailures.Load(),
		ChangedOnDisk:   f.stats.changedOnDisk.Load(),

		Passthrough: PassthroughStats{
			Active:       f.ptAvailable.Load(),
			Opens:        f.stats.ptOpens.Load(),
			CachedOpens:  f.stats.cachedOpens.Load(),
			FellBackOnce: f.ptFellBack.Load(),
		},
		Scrub: ScrubStats{
			Every: "off",
			Rate:  f.upkeep.Scrubber.Rate(),
			Runs:  f.upkeep.Scrubber.Runs(),
			Found: f.upkeep.Scrubber.Found(),
		},
		SweepTimer: f.upkeep.Sweeper.String(),
		Sweeps:     f.upkeep.Sweeper.Runs(),
	}
	if !s.Passthrough.Active {
		s.Passthrough.Reason, _ = f.ptReason.Load().(string)
	}
	if f.mount != nil {
		s.Mountpoint = f.mount.dir
		s.CrashRestarts = restartGen(f.mount.dir, f.mount.minor.Load())
	}
	for _, d := range f.nsDirs() {
		d.mu.Lock()
		s.UploadsInFlight += len(d.pending)
		d.mu.Unlock()
		d.tree.mu.Lock()
		s.UploadsInFlight += len(d.tree.live)
		d.tree.mu.Unlock()
	}
	if rep, ok := f.upkeep.Sweeper.LastReport(); ok {
		s.LastSweep = &rep
	}
	if every := f.upkeep.Scrubber.Every(); every > 0 {
		s.Scrub.Every = every.String()
	}
	if rep, ok := f.upkeep.Scrubber.LastReport(); ok {
		s.Scrub.Last = &rep
	}
	return s
}

// ForReader is s as a reader who is not root nor the mounting user sees
// it, unless privileged: counts only. The digests of the blobs a scrub
// found bad may be any namespace's, and the operators' details of a
// sweep or scrub that stopped early may name files and engine URLs.
func (s Stats) ForReader(privileged bool) Stats {
	if privileged {
		return s
	}
	s.LastSweep = redactSweep(s.LastSweep)
	s.Scrub.Last = redactScrub(s.Scrub.Last)
	return s
}

func redactSweep(r *store.Report) *store.Report {
	if r == nil {
		return nil
	}
	c := *r
	c.Detail = ""
	return &c
}

func redactScrub(r *upkeep.ScrubReport) *upkeep.ScrubReport {
	if r == nil {
		return nil
	}
	c := *r
	c.BadDigests, c.Error = nil, ""
	return &c
}

// privileged reports whether the caller behind ctx sees names in the
// control files' reports: root and the mounting user.
func (f *FS) privileged(ctx context.Context) bool {
	uid, _ := caller(ctx, f)
	return uid == 0 || uid == f.uid
}
