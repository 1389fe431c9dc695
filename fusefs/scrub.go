package fusefs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alkblobfs/alkblobfs/store"
)

// MinScrubInterval is the shortest scrub timer. A scrub is paced by its
// rate, so a short timer only means back-to-back scrubs.
const MinScrubInterval = time.Second

// DefaultScrubRate is --scrub-rate's default, in bytes per second: 100 MB/s.
const DefaultScrubRate = 100_000_000

// CheckScrub validates a scrub timer and rate: every 0 (off) or at least
// MinScrubInterval; rate 0 (unlimited) or positive.
func CheckScrub(every time.Duration, rate int64) error {
	switch {
	case every < 0 || every > 0 && every < MinScrubInterval:
		return fmt.Errorf("scrub interval %s: want 0 (off) or at least %s", every, MinScrubInterval)
	case rate < 0:
		return fmt.Errorf("scrub rate %d: want 0 (unlimited) or a positive number of bytes per second", rate)
	}
	return nil
}

// ScrubReport is the outcome of one scrub of the mount's store.
type ScrubReport struct {
	Trigger string    `json:"trigger"`
	Started time.Time `json:"started"`
	store.ScrubSummary
	// BadDigests names the first blobs found bad (at most scrubBadMax).
	BadDigests []string `json:"bad_digests,omitempty"`
}

const scrubBadMax = 100

// scrubber re-verifies the whole store at a bounded rate, on a timer
// (--scrub-every) and when an operator writes "run" to .alkblobfs/scrub:
// one scrub at a time. It reads the medium (dropping a blob's cached pages
// first), so it finds what the identity check at open cannot: bytes the
// medium changed without the filesystem knowing (bit rot). A local blob
// found corrupt is recorded in the mount's verdicts: from then on it is
// EIO at open, and never passes through, until its file changes or a
// scrub finds it good again.
type scrubber struct {
	f     *FS
	every time.Duration
	rate  int64

	// sem lets one scrub run at a time; a caller waiting for it leaves
	// when its context ends. base ends every scrub at unmount.
	sem   chan struct{}
	base  context.Context
	abort context.CancelFunc
	runs  atomic.Int64
	found atomic.Int64 // corrupt or unreadable blobs, all scrubs

	mu   sync.Mutex
	last *ScrubReport

	loopDone chan struct{} // closed when the timer's loop has ended
}

func newScrubber(f *FS, every time.Duration, rate int64) *scrubber {
	s := &scrubber{f: f, every: every, rate: rate, sem: make(chan struct{}, 1)}
	s.base, s.abort = context.WithCancel(f.ctx)
	return s
}

// start runs the timer, if any, until stop.
func (s *scrubber) start() {
	if s.every <= 0 {
		return
	}
	s.loopDone = make(chan struct{})
	go func() {
		defer close(s.loopDone)
		t := time.NewTicker(s.every)
		defer t.Stop()
		for {
			select {
			case <-s.base.Done():
				return
			case <-t.C:
				s.run(s.base, "timer")
			}
		}
	}()
}

// stop ends the timer and every scrub in progress, and waits for a timed
// one to stop.
func (s *scrubber) stop() {
	s.abort()
	if s.loopDone != nil {
		<-s.loopDone
	}
}

// run scrubs the whole store; a caller waits for a scrub in progress to
// end before its own starts. Cancelling ctx, or unmounting, stops it (or
// the wait) early.
func (s *scrubber) run(ctx context.Context, trigger string) (ScrubReport, error) {
	if s.base.Err() != nil {
		// Not EINTR, which a shell's echo would retry.
		return ScrubReport{}, errUnmounting
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.base, cancel)()
	select {
	case s.sem <- struct{}{}:
		defer func() { <-s.sem }()
	case <-ctx.Done():
		return ScrubReport{}, ctx.Err()
	}
	f := s.f
	rep := ScrubReport{Trigger: trigger, Started: time.Now()}
	f.log.Info("scrub started", "trigger", trigger, "rate_bytes_per_s", s.rate)
	sum, err := f.st.Scrub(ctx, f.st.Pool(ctx), store.ScrubOptions{
		Jobs: 1,
		Rate: s.rate,
		Result: func(r store.ScrubResult) error {
			s.judge(r)
			if r.Status != store.ScrubOK && len(rep.BadDigests) < scrubBadMax {
				rep.BadDigests = append(rep.BadDigests, r.Digest.String())
			}
			return nil
		},
	})
	rep.ScrubSummary = sum
	if err != nil {
		rep.Error = err.Error()
	}
	s.runs.Add(1)
	s.mu.Lock()
	s.last = &rep
	s.mu.Unlock()
	msg := "scrub done"
	if err != nil {
		msg = "scrub stopped early"
	}
	f.log.Info(msg, "trigger", trigger, "checked", sum.Checked, "bytes", sum.Bytes, "corrupt", sum.Corrupt,
		"unreadable", sum.Unreadable, "duration", sum.Duration, "err", err)
	if err != nil && s.base.Err() != nil {
		err = errUnmounting
	}
	return rep, err
}

// judge records one verdict where the mount's reads will see it.
func (s *scrubber) judge(r store.ScrubResult) {
	f := s.f
	switch r.Status {
	case store.ScrubOK:
		if r.File != nil {
			f.verdicts.recordGood(r.Digest, *r.File)
		}
	case store.ScrubCorrupt:
		s.found.Add(1)
		f.stats.verifyFailures.Add(1)
		if r.File != nil {
			f.verdicts.recordCorrupt(r.Digest, *r.File)
		}
		f.log.Error("scrub: blob is corrupt; refusing to serve it", "digest", r.Digest.String(), "tier", string(r.Tier), "err", r.Error)
	case store.ScrubUnreadable:
		s.found.Add(1)
		f.log.Error("scrub: blob is unreadable", "digest", r.Digest.String(), "tier", string(r.Tier), "err", r.Error)
	}
}

func (s *scrubber) lastReport() (ScrubReport, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		return ScrubReport{}, false
	}
	return *s.last, true
}
