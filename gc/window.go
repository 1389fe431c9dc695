package gc

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/meta"
)

// memWindow is the in-process delete window for stores whose engines
// cannot hold a gc_window table (mem, local). Its rows are timed by the
// collector's Clock: no other process reads them. RealClock's readings
// carry Go's monotonic clock, and comparisons of two of them use it, so a
// jump of the wall clock moves no candidate.
type memWindow struct {
	clock  Clock
	mu     sync.Mutex
	m      map[blob.Digest]time.Time
	sorted []blob.Digest // keys in order, rebuilt after a queue; may hold removed keys
	dirty  bool
}

func newMemWindow(clock Clock) *memWindow {
	if clock == nil {
		clock = RealClock
	}
	return &memWindow{clock: clock, m: make(map[blob.Digest]time.Time)}
}

// NewMemWindow returns an in-process window timed by clock (nil:
// RealClock). A collector uses one by default; passing one as
// Options.Window instead gives the durable schedule (a later sweep
// executes what one queues) without durability, which is how tests
// exercise that schedule without a database.
func NewMemWindow(clock Clock) meta.Window { return newMemWindow(clock) }

var _ meta.Window = (*memWindow)(nil)

func (w *memWindow) WindowQueue(_ context.Context, ds []blob.Digest, delay time.Duration) error {
	at := w.clock.Now().Add(max(delay, 0))
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range ds {
		if _, ok := w.m[d]; !ok {
			w.m[d] = at
			w.dirty = true
		}
	}
	return nil
}

func (w *memWindow) WindowDue(_ context.Context, after blob.Digest, limit int) ([]blob.Digest, error) {
	now := w.clock.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dirty {
		w.sorted = w.sorted[:0]
		for d := range w.m {
			w.sorted = append(w.sorted, d)
		}
		sortDigests(w.sorted)
		w.dirty = false
	}
	i, _ := slices.BinarySearchFunc(w.sorted, after, blob.Digest.Compare)
	var out []blob.Digest
	for ; i < len(w.sorted) && len(out) < limit; i++ {
		d := w.sorted[i]
		if t, ok := w.m[d]; ok && d != after && !t.After(now) {
			out = append(out, d)
		}
	}
	return out, nil
}

func (w *memWindow) WindowRemove(_ context.Context, ds []blob.Digest) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range ds {
		delete(w.m, d)
	}
	if len(w.m) == 0 {
		w.sorted, w.dirty = nil, false
	}
	return nil
}

func (w *memWindow) WindowLen(context.Context) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.m), nil
}
