package gc

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// memWindow is the in-process delete window for stores whose engines
// cannot hold a gc_window table (mem, local).
type memWindow struct {
	mu     sync.Mutex
	m      map[blob.Digest]time.Time
	sorted []blob.Digest // keys in order, rebuilt after a stage; may hold removed keys
	dirty  bool
}

func newMemWindow() *memWindow { return &memWindow{m: make(map[blob.Digest]time.Time)} }

// NewMemWindow returns an in-process window. A collector uses one by
// default; passing one as Options.Window instead gives the durable
// schedule (a later sweep executes what one stages) without durability,
// which is how tests exercise that schedule without a database.
func NewMemWindow() engines.WindowHost { return newMemWindow() }

var _ engines.WindowHost = (*memWindow)(nil)

func (w *memWindow) WindowStage(_ context.Context, cs []engines.Candidate) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range cs {
		if _, ok := w.m[c.Digest]; !ok {
			w.m[c.Digest] = c.VisibleAfter
			w.dirty = true
		}
	}
	return nil
}

func (w *memWindow) WindowDue(_ context.Context, now time.Time, after blob.Digest, limit int) ([]engines.Candidate, error) {
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
	var out []engines.Candidate
	for ; i < len(w.sorted) && len(out) < limit; i++ {
		d := w.sorted[i]
		if t, ok := w.m[d]; ok && d != after && !t.After(now) {
			out = append(out, engines.Candidate{Digest: d, VisibleAfter: t})
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
