package upkeep

import (
	"context"
	"fmt"
	"log/slog"
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

// ScrubReport is the outcome of one scrub of the store.
type ScrubReport struct {
	Trigger string    `json:"trigger"`
	Started time.Time `json:"started"`
	store.ScrubSummary
	// BadDigests names the first blobs found bad (at most scrubBadMax).
	BadDigests []string `json:"bad_digests,omitempty"`
}

const scrubBadMax = 100

// Scrubber re-verifies the whole store at a bounded rate, on a timer and
// when asked: one scrub at a time. It reads the medium (dropping a blob's
// cached pages first), so it finds what a check at open cannot: bytes the
// medium changed without the filesystem knowing (bit rot).
type Scrubber struct {
	st      Store
	log     *slog.Logger
	every   time.Duration
	rate    int64
	onScrub func(store.ScrubResult)

	// sem lets one scrub run at a time; a caller waiting for it leaves
	// when its context ends. base ends every scrub at Stop.
	sem   chan struct{}
	base  context.Context
	abort context.CancelFunc
	runs  atomic.Int64
	found atomic.Int64 // corrupt, unreadable or lost blobs, all scrubs

	mu   sync.Mutex
	last *ScrubReport

	loopDone chan struct{} // closed when the timer's loop has ended
}

func newScrubber(st Store, lg *slog.Logger, every time.Duration, rate int64, onScrub func(store.ScrubResult)) *Scrubber {
	s := &Scrubber{st: st, log: lg, every: every, rate: rate, onScrub: onScrub, sem: make(chan struct{}, 1)}
	s.base, s.abort = context.WithCancel(context.Background())
	return s
}

// Start runs the timer, if any, until Stop.
func (s *Scrubber) Start() {
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
				s.Run(s.base, "timer")
			}
		}
	}()
}

// Stop ends the timer and every scrub in progress, and waits for a timed
// one to stop. It may be called more than once.
func (s *Scrubber) Stop() {
	s.abort()
	if s.loopDone != nil {
		<-s.loopDone
	}
}

// Run scrubs the whole store; a caller waits for a scrub in progress to
// end before its own starts. Cancelling ctx stops it (or the wait) early;
// Stop does too, and the error is then ErrStopped.
func (s *Scrubber) Run(ctx context.Context, trigger string) (ScrubReport, error) {
	if s.base.Err() != nil {
		return ScrubReport{}, ErrStopped
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
	rep := ScrubReport{Trigger: trigger, Started: time.Now()}
	s.log.Info("scrub started", "trigger", trigger, "rate_bytes_per_s", s.rate)
	sum, err := s.st.Scrub(ctx, s.st.Digests(ctx), store.ScrubOptions{
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
	s.log.Info(msg, "trigger", trigger, "checked", sum.Checked, "bytes", sum.Bytes, "corrupt", sum.Corrupt,
		"unreadable", sum.Unreadable, "missing", sum.Missing, "duration", sum.Duration, "err", err)
	if err != nil && s.base.Err() != nil {
		err = ErrStopped
	}
	return rep, err
}

// judge counts and logs one verdict, after the surface's hook has seen it.
func (s *Scrubber) judge(r store.ScrubResult) {
	if s.onScrub != nil {
		s.onScrub(r)
	}
	switch r.Status {
	case store.ScrubCorrupt:
		s.found.Add(1)
		if s.onScrub == nil {
			s.log.Error("scrub: blob is corrupt", "digest", r.Digest.String(), "tier", string(r.Tier), "err", r.Error)
		}
	case store.ScrubUnreadable:
		s.found.Add(1)
		s.log.Error("scrub: blob is unreadable", "digest", r.Digest.String(), "tier", string(r.Tier), "err", r.Error)
	case store.ScrubMissing:
		if r.Lost {
			s.found.Add(1)
			s.log.Error("scrub: blob is lost: a namespace links it but no tier holds it", "digest", r.Digest.String())
		}
	}
}

// Every is the timer (0: off).
func (s *Scrubber) Every() time.Duration { return s.every }

// Rate is the most bytes a scrub reads a second (0: unlimited).
func (s *Scrubber) Rate() int64 { return s.rate }

// Runs counts the scrubs that ended, stopped ones included: it moves
// after the run's verdicts (Found) and before its report (Last).
func (s *Scrubber) Runs() int64 { return s.runs.Load() }

// Found counts the blobs scrubs found corrupt, unreadable or lost, all
// scrubs.
func (s *Scrubber) Found() int64 { return s.found.Load() }

// LastReport is the most recent scrub's report, if any.
func (s *Scrubber) LastReport() (ScrubReport, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		return ScrubReport{}, false
	}
	return *s.last, true
}
