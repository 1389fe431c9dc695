package ops

import (
	"context"
	"sync"
	"time"
)

// recounter keeps the result of a count too slow for a scrape to wait
// for (listing a tier, reading every namespace's usage): it runs the count
// at most once per every and in the background, so that a scrape never
// waits for one and never starts a second. The first scrape starts the
// first count and reports nothing; a count cut short (closed, or not
// whole) keeps the last whole one.
type recounter[T any] struct {
	every time.Duration
	// count returns what it counted, and whether that is the whole of it.
	// Nil: nothing to count.
	count func(ctx context.Context) (got []T, whole bool)

	mu      sync.Mutex
	counted time.Time
	running bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{}
	last    []T
}

// get returns the last whole count, and starts the next one when it is
// due.
func (r *recounter[T]) get() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.count != nil && !r.running && !r.closed && time.Since(r.counted) >= r.every {
		r.running = true
		ctx, cancel := context.WithCancel(context.Background())
		r.cancel, r.done = cancel, make(chan struct{})
		go r.run(ctx, cancel, r.done)
	}
	return r.last
}

func (r *recounter[T]) run(ctx context.Context, cancel context.CancelFunc, done chan struct{}) {
	defer close(done)
	defer cancel()
	got, whole := r.count(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running = false
	r.counted = time.Now()
	if ctx.Err() == nil && whole {
		r.last = got
	}
}

// close stops a count in progress and waits for it; no count starts after.
func (r *recounter[T]) close() {
	r.mu.Lock()
	r.closed = true
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}
