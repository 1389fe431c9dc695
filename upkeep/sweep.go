package upkeep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alkblobfs/alkblobfs/store"
)

// MinSweepInterval is the shortest sweep timer: a sweep lists the whole
// pool, and a timer of a nanosecond would run thousands a second.
const MinSweepInterval = time.Second

// DefaultSweepInterval is what the timer's "on" starts when no interval
// was ever set.
const DefaultSweepInterval = 15 * time.Minute

// CheckSweepEvery validates a sweep timer: 0 (off) or at least
// MinSweepInterval, and off for a read-only store, which deletes nothing.
func CheckSweepEvery(d time.Duration, readOnly bool) error {
	switch {
	case d < 0 || d > 0 && d < MinSweepInterval:
		return fmt.Errorf("sweep interval %s: want 0 (off) or at least %s", d, MinSweepInterval)
	case d > 0 && readOnly:
		return errors.New("a read-only store does not sweep: no sweep interval with read-only")
	}
	return nil
}

// Sweeper runs a store's sweeps, for its timer and for whoever asks (a
// control file, a request): one code path, one sweep at a time (a caller
// waits for a timer sweep in progress rather than getting an immediate
// SweeperLock abort).
type Sweeper struct {
	st  Store
	log *slog.Logger

	// base ends a timer's sweep at Stop; timed counts those running.
	base   context.Context
	cancel context.CancelFunc
	timed  sync.WaitGroup

	runMu sync.Mutex
	runs  atomic.Int64
	// lastOK is when a sweep last ended without an error (UnixNano), or
	// when the sweeper was made: the metric an alert on sweeps that stopped
	// happening compares with the timer, from the start.
	lastOK atomic.Int64

	mu      sync.Mutex
	every   time.Duration // 0: off
	lastOn  time.Duration // what "on" resumes
	timer   *time.Timer
	gen     uint64
	stopped bool
}

func newSweeper(st Store, lg *slog.Logger, every time.Duration) *Sweeper {
	s := &Sweeper{st: st, log: lg, every: every, lastOn: every}
	s.lastOK.Store(time.Now().UnixNano())
	s.base, s.cancel = context.WithCancel(context.Background())
	return s
}

// Run sweeps now, after a sweep in progress has ended; trigger says who
// asked, for the log.
func (s *Sweeper) Run(ctx context.Context, trigger string) (store.Report, error) {
	s.runMu.Lock()
	defer s.runMu.Unlock()
	rep, err := s.st.Sweep(ctx)
	s.runs.Add(1)
	if err != nil {
		s.log.Error("sweep failed", "trigger", trigger, "err", err)
		return rep, err
	}
	s.lastOK.Store(time.Now().UnixNano())
	s.log.Info("sweep done", "trigger", trigger, "aborted", string(rep.Aborted), "deleted", rep.Deleted,
		"queued", rep.Queued, "bytes_freed", rep.BytesFreed, "duration", rep.Duration)
	return rep, nil
}

// Runs counts the sweeps Run began, failed ones included.
func (s *Sweeper) Runs() int64 { return s.runs.Load() }

// LastSuccess is when a sweep run here last ended without an error
// (deliberate aborts included: another process held the sweep), or when
// the sweeper was made if none has yet.
func (s *Sweeper) LastSuccess() time.Time { return time.Unix(0, s.lastOK.Load()) }

// Every is the timer's interval, 0 when it is off.
func (s *Sweeper) Every() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.every
}

// LastReport is the report of the store's most recent sweep in this
// process, if any: the collector keeps it, so a sweep run past the
// Sweeper (the store's Sweep) is the last one too.
func (s *Sweeper) LastReport() (store.Report, bool) { return s.st.LastReport() }

// Set applies a timer command (see Command): off, on, or a duration (see
// ParseDuration) of at least MinSweepInterval. 0 is not off here, unlike a
// flag's 0: a stray `echo 0` (or a value cut short) must not stop GC, so
// off is said in words. Bad input is ErrBadInput and changes nothing. undo
// takes the timer back to before the command, unless it has changed again
// since.
func (s *Sweeper) Set(cmd string) (undo func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prevEvery, prevOn := s.every, s.lastOn
	switch cmd {
	case "off":
		s.every = 0
	case "on":
		if s.lastOn <= 0 {
			s.lastOn = DefaultSweepInterval
		}
		s.every = s.lastOn
	default:
		d, err := ParseDuration(cmd)
		if err != nil || d < MinSweepInterval {
			return nil, fmt.Errorf("%w: sweep-timer %q: want off, on or a duration of at least %s such as 15m or 1h30m (unsigned, each unit once)", ErrBadInput, Clip(cmd), MinSweepInterval)
		}
		s.every, s.lastOn = d, d
	}
	s.armLocked()
	every, on := s.every, s.lastOn
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.every == every && s.lastOn == on && (s.every != prevEvery || s.lastOn != prevOn) {
			s.every, s.lastOn = prevEvery, prevOn
			s.armLocked()
		}
	}, nil
}

// String is the timer: "off" or its interval.
func (s *Sweeper) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.every <= 0 {
		return "off"
	}
	return s.every.String()
}

// Start runs the timer, if it is on, until Stop.
func (s *Sweeper) Start() {
	s.mu.Lock()
	s.armLocked()
	s.mu.Unlock()
}

// Stop ends the timer for good, ends a timer's sweep in progress and
// waits for it. A sweep asked for through Run runs on its caller's
// context.
func (s *Sweeper) Stop() {
	s.mu.Lock()
	s.stopped = true
	s.armLocked()
	s.mu.Unlock()
	s.cancel()
	s.timed.Wait()
}

func (s *Sweeper) armLocked() {
	s.gen++
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if s.every <= 0 || s.stopped {
		return
	}
	g := s.gen
	s.timer = time.AfterFunc(s.every, func() { s.fire(g) })
}

func (s *Sweeper) fire(g uint64) {
	s.mu.Lock()
	live := g == s.gen && !s.stopped
	if live {
		// Under mu, before Stop can set stopped: Stop's Wait sees it.
		s.timed.Add(1)
	}
	s.mu.Unlock()
	if !live {
		return
	}
	defer s.timed.Done()
	s.Run(s.base, "timer")
	s.mu.Lock()
	if g == s.gen {
		s.armLocked()
	}
	s.mu.Unlock()
}
