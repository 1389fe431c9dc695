// Package gctest holds fakes for testing code against the collector: a map
// pool that can check invariants at the moment of each delete, a set
// liveness source, a clock that moves only when told, and one that is off
// by a fixed skew.
package gctest

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/gc"
)

// Pool is a map-backed gc.Pool that also has the Has and Pin a namespaces
// link service needs. C is the collector sweeping it.
type Pool struct {
	C *gc.Collector

	mu sync.Mutex
	m  map[blob.Digest]int64
	// OnDelete, if set, runs inside Delete, under the collector's
	// arbitration lock: the place to assert invariants.
	OnDelete func(d blob.Digest)
	// AfterHas, if set, runs inside Has after the answer is decided: the
	// window between a link's check and its link.
	AfterHas func(d blob.Digest)
}

var _ gc.Pool = (*Pool)(nil)

// NewPool returns a pool holding ds and a quiet collector over it.
func NewPool(o gc.Options, ds ...blob.Digest) *Pool {
	p := &Pool{m: make(map[blob.Digest]int64)}
	for _, d := range ds {
		p.Add(d)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	p.C = gc.New(p, o)
	return p
}

// Add puts d in the pool (a publish). Its size is derived from d.
func (p *Pool) Add(d blob.Digest) {
	p.mu.Lock()
	p.m[d] = int64(d[0]) + 1
	p.mu.Unlock()
}

// Holds reports whether d is in the pool.
func (p *Pool) Holds(d blob.Digest) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.m[d]
	return ok
}

// Len is the number of entries.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}

// Digests returns the entries, sorted.
func (p *Pool) Digests() []blob.Digest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.SortedFunc(maps.Keys(p.m), blob.Digest.Compare)
}

func (p *Pool) List(ctx context.Context) iter.Seq2[engines.Entry, error] {
	return func(yield func(engines.Entry, error) bool) {
		p.mu.Lock()
		es := make([]engines.Entry, 0, len(p.m))
		for d, n := range p.m {
			es = append(es, engines.Entry{Digest: d, Size: n})
		}
		p.mu.Unlock()
		slices.SortFunc(es, func(a, b engines.Entry) int { return a.Digest.Compare(b.Digest) })
		for _, e := range es {
			if !yield(e, nil) {
				return
			}
		}
	}
}

func (p *Pool) Delete(ctx context.Context, d blob.Digest) (int64, error) {
	if p.OnDelete != nil {
		p.OnDelete(d)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.m[d]
	if !ok {
		return 0, blob.Wrap("delete", "gctest", d, blob.ErrMissing)
	}
	delete(p.m, d)
	return n, nil
}

// Has reports whether d is in the pool, then runs AfterHas.
func (p *Pool) Has(ctx context.Context, d blob.Digest) (bool, error) {
	ok := p.Holds(d)
	if p.AfterHas != nil {
		p.AfterHas(d)
	}
	return ok, nil
}

// Size returns d's size, or an error wrapping blob.ErrMissing.
func (p *Pool) Size(ctx context.Context, d blob.Digest) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.m[d]
	if !ok {
		return 0, blob.Wrap("size", "gctest", d, blob.ErrMissing)
	}
	return n, nil
}

// Pin pins d on the collector.
func (p *Pool) Pin(ctx context.Context, d blob.Digest) (*gc.Pin, error) { return p.C.Pin(ctx, d) }

// PinMany pins each of ds on the collector.
func (p *Pool) PinMany(ctx context.Context, ds []blob.Digest) ([]*gc.Pin, error) {
	return p.C.PinMany(ctx, ds)
}

// Source is a liveness source over a set.
type Source struct {
	mu sync.Mutex
	m  map[blob.Digest]bool
	// Err, if set, fails every query.
	Err error
	// Gate, if set, blocks enumeration until closed; Entered, if set, is
	// sent a value when enumeration starts.
	Gate    chan struct{}
	Entered chan struct{}
}

var _ gc.Source = (*Source)(nil)

// NewSource returns a source that keeps ds live.
func NewSource(ds ...blob.Digest) *Source {
	s := &Source{m: make(map[blob.Digest]bool)}
	for _, d := range ds {
		s.m[d] = true
	}
	return s
}

// Set makes d live or not.
func (s *Source) Set(d blob.Digest, live bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if live {
		s.m[d] = true
	} else {
		delete(s.m, d)
	}
}

// Digests returns the live set, sorted.
func (s *Source) Digests() []blob.Digest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.SortedFunc(maps.Keys(s.m), blob.Digest.Compare)
}

func (s *Source) IsLive(ctx context.Context, d blob.Digest) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[d], s.Err
}

func (s *Source) Live(ctx context.Context) iter.Seq2[blob.Digest, error] {
	return func(yield func(blob.Digest, error) bool) {
		if s.Entered != nil {
			s.Entered <- struct{}{}
		}
		if s.Gate != nil {
			<-s.Gate
		}
		if s.Err != nil {
			yield(blob.Digest{}, s.Err)
			return
		}
		for _, d := range s.Digests() {
			if !yield(d, nil) {
				return
			}
		}
	}
}

// Clock is a gc.Clock that moves only on Advance. Each After call is
// announced on Waiting (buffered), so a test knows when a sweep has
// reached its delete window.
type Clock struct {
	Waiting chan time.Duration

	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

var _ gc.Clock = (*Clock)(nil)

// NewClock returns a clock at a fixed instant.
func NewClock() *Clock {
	return &Clock{now: time.Unix(1_700_000_000, 0), Waiting: make(chan time.Duration, 16)}
}

func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	ch := make(chan time.Time, 1)
	c.waiters = append(c.waiters, waiter{c.now.Add(d), ch})
	c.mu.Unlock()
	c.Waiting <- d
	return ch
}

// Advance moves the clock and fires the timers that are due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
		} else {
			kept = append(kept, w)
		}
	}
	c.waiters = kept
}

// Skewed is a gc.Clock off the real clock by a fixed offset: the clock of
// a host that is wrong about the time. It still measures durations right,
// as a host's clock that is merely set wrong does.
type Skewed time.Duration

var _ gc.Clock = Skewed(0)

func (s Skewed) Now() time.Time                         { return time.Now().Add(time.Duration(s)) }
func (s Skewed) After(d time.Duration) <-chan time.Time { return time.After(d) }

// BatchPool is a Pool with gc.BatchPool's DeleteMany, so tests can run the
// sweep's batched delete path as well as the per-key one.
type BatchPool struct{ *Pool }

var _ gc.BatchPool = BatchPool{}

// NewBatchPool is NewPool with a collector that deletes in batches.
func NewBatchPool(o gc.Options, ds ...blob.Digest) BatchPool {
	p := NewPool(o, ds...)
	bp := BatchPool{p}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	p.C = gc.New(bp, o)
	return bp
}

func (p BatchPool) DeleteMany(ctx context.Context, ds []blob.Digest) ([]int64, error) {
	out := make([]int64, len(ds))
	for i, d := range ds {
		n, err := p.Delete(ctx, d)
		switch {
		case err == nil:
			out[i] = n
		case errors.Is(err, blob.ErrMissing):
			out[i] = -1
		default:
			return nil, err
		}
	}
	return out, nil
}
