package gc

import (
	"context"
	"fmt"
	"iter"
	"math"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/meta"
)

// AbortCause says why a sweep deliberately did nothing. The empty cause
// means the sweep ran.
type AbortCause string

const (
	// AbortNoLivenessSources: no source is registered, so nothing can be
	// proven dead. The safe default.
	AbortNoLivenessSources AbortCause = "NoLivenessSources"
	// AbortSweeperLock: another sweep holds the sweeper lock.
	AbortSweeperLock AbortCause = "SweeperLock"
	// AbortProtectFailed: the protect callback returned an error.
	AbortProtectFailed AbortCause = "ProtectFailed"
)

// Report is what one sweep did. Counts are exact relative to the window
// schedule: Deleted and Cancelled describe the candidates executed by this
// sweep (queued by an earlier sweep in the durable form, or by this one in
// the in-process form); Queued counts what this sweep's mark found dead.
type Report struct {
	Started    time.Time     `json:"started"`
	Duration   time.Duration `json:"duration_ns"`
	Aborted    AbortCause    `json:"aborted,omitempty"`
	Detail     string        `json:"detail,omitempty"` // why ProtectFailed, for operators
	Scanned    int64         `json:"scanned"`          // pool entries the mark enumerated
	Live       int64         `json:"live"`             // of those, protected at mark time
	Queued     int           `json:"candidates_queued"`
	Deleted    int           `json:"deleted"`
	Cancelled  int           `json:"cancelled_by_arbitration"`
	BytesFreed int64         `json:"bytes_freed"`
	Pending    int           `json:"window_pending"` // candidates still waiting afterwards
	Reaped     int64         `json:"pins_reaped"`    // expired pin rows removed
	Durable    bool          `json:"durable_window"`
	Delay      time.Duration `json:"window_delay_ns"`
}

// executeBatch is how many window rows one round trip takes;
// arbitrateBatch how many candidates one hold of the arbitration lock
// decides (Pin waits for it: keep it short).
const (
	executeBatch   = 1000
	arbitrateBatch = 128
)

// Sweep runs one collection. See the package doc for the order of phases.
// The error is for operational failure only (engine or source I/O); every
// deliberate no-op is an Aborted report, and an abort deletes nothing.
func (c *Collector) Sweep(ctx context.Context) (Report, error) {
	r := Report{Started: c.clock.Now(), Durable: c.durable, Delay: c.delay}
	if c.closed.Load() {
		return r, blob.ErrClosed
	}
	// Design point (lease composition): the in-process flag first (cheap,
	// and it keeps this process's sweeps off the database lease), then the
	// host's lease, pool-wide, held for this sweep only.
	if !c.sweeping.TryLock() {
		r.Aborted = AbortSweeperLock
		c.count(r, nil)
		return r, nil // not recorded as the last report: the running sweep's will be
	}
	defer c.sweeping.Unlock()
	var lease meta.Lease
	if c.host != nil {
		l, held, err := c.host.SweepLease(ctx)
		if err != nil {
			err = fmt.Errorf("sweep lease: %w", err)
			c.count(r, err)
			return r, err
		}
		if !held {
			r.Aborted = AbortSweeperLock
			r.Detail = "another process is sweeping this pool"
			// Recorded as the last report: no sweep of this process will
			// replace it, and a reader of the last report (the control
			// file after `echo run`) must not take the report of an
			// earlier sweep for this one's.
			c.lastMu.Lock()
			rr := r
			c.last = &rr
			c.lastMu.Unlock()
			c.count(r, nil)
			return r, nil
		}
		lease = l
		defer lease.Release()
	}
	err := c.sweep(ctx, &r, lease)
	r.Duration = c.clock.Now().Sub(r.Started)
	if n, werr := c.window.WindowLen(ctx); werr == nil {
		r.Pending = n
	}
	c.lastMu.Lock()
	rr := r
	c.last = &rr
	c.lastMu.Unlock()
	c.count(r, err)
	if err != nil {
		c.log.Error("sweep failed", "err", err, "deleted", r.Deleted)
		return r, err
	}
	c.log.Debug("sweep", "aborted", string(r.Aborted), "scanned", r.Scanned, "queued", r.Queued,
		"deleted", r.Deleted, "cancelled", r.Cancelled, "bytes_freed", r.BytesFreed, "duration", r.Duration)
	return r, nil
}

func (c *Collector) sweep(ctx context.Context, r *Report, lease meta.Lease) error {
	sources, p := c.snapshot()
	if len(sources) == 0 {
		r.Aborted = AbortNoLivenessSources
		return nil
	}
	protected, err := consult(ctx, p)
	if err != nil {
		r.Aborted = AbortProtectFailed
		r.Detail = err.Error()
		return nil
	}
	// Design point (reap ordering): expired pin rows are reaped before the
	// overdue execution, as hygiene only — arbitration already ignores
	// expired rows, so the answers are the same either way.
	if c.host != nil {
		n, err := c.host.ReapPins(ctx)
		if err != nil {
			return fmt.Errorf("reap expired pin rows: %w", err)
		}
		r.Reaped = n
	}
	// The protect consult above covers the execution phase too: overdue
	// candidates are re-arbitrated against pins, sources and this
	// predicate.
	if err := c.executeDue(ctx, r, sources, protected, lease); err != nil {
		return err
	}
	dead, err := c.mark(ctx, r, sources, protected)
	if err != nil {
		return err
	}
	// Checked here too for a collector made without a store (which checks
	// at Open); the window host adds the delay to its own clock.
	if _, err := VisibleAfter(c.clock.Now(), c.delay); err != nil {
		return err
	}
	for _, batch := range dead.chunks {
		if err := c.window.WindowQueue(ctx, batch, c.delay); err != nil {
			return fmt.Errorf("queue delete candidates: %w", err)
		}
	}
	r.Queued = dead.len()
	if c.durable || dead.len() == 0 {
		return nil
	}
	// In-process window: wait out the delay, then execute inline.
	if c.delay > 0 {
		select {
		case <-c.clock.After(c.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return c.executeDue(ctx, r, sources, protected, lease)
}

// maxTime is the last instant a window row can hold: visible_after is
// stored as int64 unix nanoseconds.
var maxTime = time.Unix(0, math.MaxInt64)

// VisibleAfter is now + delay, checked: a delay that would carry the
// window past what the window table can store is an error, never a wrapped
// time in the past (which would make a candidate due at once). The window
// hosts add a delay to their own clocks; this is how a delay is checked
// before it gets there.
func VisibleAfter(now time.Time, delay time.Duration) (time.Time, error) {
	at := now.Add(delay)
	if delay < 0 || at.After(maxTime) {
		return time.Time{}, fmt.Errorf("gc window %s from %s ends after %s, the last time the window can record", delay, now.Format(time.RFC3339), maxTime.UTC().Format(time.RFC3339))
	}
	return at, nil
}

// executeDue deletes every window candidate whose time has come, each
// re-arbitrated now. Protected or vanished candidates are cancelled; both
// leave the window (a still-dead one is queued again by a later mark).
func (c *Collector) executeDue(ctx context.Context, r *Report, sources []Source, protected func(blob.Digest) bool, lease meta.Lease) error {
	var after blob.Digest
	for {
		due, err := c.window.WindowDue(ctx, after, executeBatch)
		if err != nil {
			return fmt.Errorf("read delete window: %w", err)
		}
		if len(due) == 0 {
			return nil
		}
		done := make([]blob.Digest, 0, len(due))
		for lo := 0; lo < len(due); lo += arbitrateBatch {
			if err := ctx.Err(); err != nil {
				c.removeDone(ctx, done)
				return err
			}
			// Design point (lease hold): the lease is re-checked before
			// each delete batch; a lost one (a database restart drops a
			// session lock) ends the sweep with nothing more deleted.
			if lease != nil {
				if err := lease.Check(ctx); err != nil {
					c.removeDone(ctx, done)
					return err
				}
			}
			ds := due[lo:min(len(due), lo+arbitrateBatch)]
			out, err := c.arbitratedDeleteMany(ctx, ds, sources, protected)
			if err != nil {
				c.removeDone(ctx, done)
				return err
			}
			for _, n := range out {
				if n >= 0 {
					r.Deleted++
					r.BytesFreed += n
				} else {
					r.Cancelled++ // protected now, or vanished meanwhile
				}
			}
			done = append(done, ds...)
		}
		if err := c.window.WindowRemove(ctx, done); err != nil {
			return fmt.Errorf("clear delete window: %w", err)
		}
		after = due[len(due)-1]
	}
}

// removeDone clears executed rows on an early exit so that counts stay
// exact: an executed candidate must not be executed (and counted) twice.
func (c *Collector) removeDone(ctx context.Context, done []blob.Digest) {
	if len(done) == 0 {
		return
	}
	if err := c.window.WindowRemove(context.WithoutCancel(ctx), done); err != nil {
		c.log.Warn("clear delete window after failed sweep", "err", err)
	}
}

// mark merges the pool listing (ascending) with every source's ascending
// enumeration and a snapshot of the pins, and returns the digests nothing
// protects. Memory is O(dead + pins), never O(pool): the dead are held, 32
// bytes each, until mark ends, because they are all queued at
// mark_end + delay.
func (c *Collector) mark(ctx context.Context, r *Report, sources []Source, protected func(blob.Digest) bool) (*digestList, error) {
	cursors := make([]*cursor, 0, len(sources))
	defer func() {
		for _, cur := range cursors {
			cur.stop()
		}
	}()
	for _, s := range sources {
		cursors = append(cursors, newCursor(s.Live(ctx)))
	}
	pinned := c.pins.sorted()
	dead := &digestList{}
	for e, err := range c.pool.List(ctx) {
		if err != nil {
			return nil, fmt.Errorf("list pool: %w", err)
		}
		r.Scanned++
		for len(pinned) > 0 && pinned[0].Compare(e.Digest) < 0 {
			pinned = pinned[1:]
		}
		live := len(pinned) > 0 && pinned[0] == e.Digest || protected(e.Digest)
		for _, cur := range cursors {
			hit, err := cur.seek(e.Digest)
			if err != nil {
				return nil, fmt.Errorf("enumerate liveness: %w", err)
			}
			live = live || hit
		}
		if live {
			r.Live++
			continue
		}
		dead.add(e.Digest)
	}
	return dead, ctx.Err()
}

// digestList is an append-only list in fixed-size chunks: no doubling
// growth and no copying, so a million dead digests cost 32 MB, not up to
// three times that while a slice regrows.
type digestList struct {
	chunks [][]blob.Digest
}

const listChunk = executeBatch

func (l *digestList) add(d blob.Digest) {
	if n := len(l.chunks); n == 0 || len(l.chunks[n-1]) == listChunk {
		l.chunks = append(l.chunks, make([]blob.Digest, 0, listChunk))
	}
	last := &l.chunks[len(l.chunks)-1]
	*last = append(*last, d)
}

func (l *digestList) len() int {
	if len(l.chunks) == 0 {
		return 0
	}
	return (len(l.chunks)-1)*listChunk + len(l.chunks[len(l.chunks)-1])
}

// cursor walks one source's ascending enumeration for the merge.
type cursor struct {
	next func() (blob.Digest, error, bool)
	stop func()
	cur  blob.Digest
	ok   bool // cur is valid
	done bool
	prev blob.Digest
}

func newCursor(seq iter.Seq2[blob.Digest, error]) *cursor {
	next, stop := iter.Pull2(seq)
	return &cursor{next: next, stop: stop}
}

// seek advances to the first digest >= d and reports whether it equals d.
func (c *cursor) seek(d blob.Digest) (bool, error) {
	for !c.done && (!c.ok || c.cur.Compare(d) < 0) {
		v, err, more := c.next()
		if !more {
			c.done, c.ok = true, false
			break
		}
		if err != nil {
			return false, err
		}
		if c.ok && v.Compare(c.prev) < 0 {
			return false, fmt.Errorf("liveness source enumerated %s after %s: not ascending", v, c.prev)
		}
		c.cur, c.prev, c.ok = v, v, true
	}
	return c.ok && c.cur == d, nil
}
