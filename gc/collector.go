package gc

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// Source is a liveness source: something that keeps digests alive, such as
// the namespaces registry or the mount's open files.
type Source interface {
	// IsLive answers the point query used by delete-time arbitration.
	IsLive(ctx context.Context, d blob.Digest) (bool, error)
	// Live enumerates the live digests in ascending order (duplicates
	// allowed) for marking. It must stream: the sweep merges it with the
	// pool listing without building a set.
	Live(ctx context.Context) iter.Seq2[blob.Digest, error]
}

// BatchSource is an optional Source capability: the point query for many
// digests in one round trip, used when a sweep executes its window.
type BatchSource interface {
	Source
	// LiveAmong returns the digests of ds that are live.
	LiveAmong(ctx context.Context, ds []blob.Digest) (map[blob.Digest]bool, error)
}

// Protect is the embedder's protect callback, consulted once per sweep (and
// once per direct Delete). It returns a predicate naming protected keys; an
// error aborts the sweep with AbortProtectFailed.
type Protect func(ctx context.Context) (func(blob.Digest) bool, error)

// Pool is what the collector sweeps: the store's fall-through view of both
// tiers.
type Pool interface {
	// List streams every entry of every tier in ascending digest order.
	List(ctx context.Context) iter.Seq2[engines.Entry, error]
	// Delete removes d from whichever tier holds it and returns its size.
	// A vanished key returns an error wrapping blob.ErrMissing.
	Delete(ctx context.Context, d blob.Digest) (int64, error)
}

// BatchPool is an optional Pool capability: DeleteMany deletes every
// digest of ds and returns each one's size, or -1 for a vanished one.
type BatchPool interface {
	Pool
	DeleteMany(ctx context.Context, ds []blob.Digest) ([]int64, error)
}

// Clock is injected so that window logic is tested without sleeping.
type Clock interface {
	Now() time.Time
	// After behaves like time.After.
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// RealClock is the wall clock.
var RealClock Clock = realClock{}

// Options configure a Collector.
type Options struct {
	// Window, when non-nil, is the durable delete window (an SQL-backed
	// engine's gc_window table): candidates staged by one sweep are executed
	// by a later one. When nil, an in-process window is used and each sweep
	// executes its own candidates once Delay has passed.
	Window engines.WindowHost
	// Delay is the delete window: candidates become executable at
	// mark_end + Delay.
	Delay time.Duration
	// Clock defaults to RealClock.
	Clock Clock
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Collector owns all GC state of one store instance.
type Collector struct {
	pool    Pool
	window  engines.WindowHost
	durable bool
	delay   time.Duration
	clock   Clock
	log     *slog.Logger

	// arb is the arbitration lock. Pin takes the read side, a delete's
	// check-then-delete takes the write side, so no pin can appear between
	// an arbitration's check and its delete.
	arb  sync.RWMutex
	pins pins

	srcMu   sync.Mutex
	sources map[*Registration]Source
	protect Protect

	sweeping sync.Mutex // held for a whole sweep; TryLock → AbortSweeperLock

	lastMu sync.Mutex
	last   *Report
}

// New returns a collector over pool.
func New(pool Pool, o Options) *Collector {
	c := &Collector{
		pool:    pool,
		window:  o.Window,
		durable: o.Window != nil,
		delay:   o.Delay,
		clock:   o.Clock,
		log:     o.Logger,
		sources: make(map[*Registration]Source),
	}
	if c.window == nil {
		c.window = newMemWindow()
	}
	if c.clock == nil {
		c.clock = RealClock
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	return c
}

// Durable reports whether staged candidates survive a restart.
func (c *Collector) Durable() bool { return c.durable }

// Delay is the configured delete window.
func (c *Collector) Delay() time.Duration { return c.delay }

// Pin mints a pin on d. Mint it before the entry it protects becomes
// visible (pin-before-publish); pinning an absent digest is allowed.
func (c *Collector) Pin(d blob.Digest) *Pin {
	c.arb.RLock()
	c.pins.add(d)
	c.arb.RUnlock()
	return &Pin{c: c, d: d}
}

// Pinned reports whether d has at least one live pin.
func (c *Collector) Pinned(d blob.Digest) bool { return c.pins.has(d) }

// PinCount returns the number of pinned digests and of pins.
func (c *Collector) PinCount() (digests, pins int) { return c.pins.count() }

// Registration is the handle of a registered Source.
type Registration struct{ c *Collector }

// Deregister removes the source. Idempotent.
func (r *Registration) Deregister() {
	r.c.srcMu.Lock()
	delete(r.c.sources, r)
	r.c.srcMu.Unlock()
}

// Register adds a liveness source until the returned handle deregisters it.
func (c *Collector) Register(s Source) *Registration {
	r := &Registration{c: c}
	c.srcMu.Lock()
	c.sources[r] = s
	c.srcMu.Unlock()
	return r
}

// SetProtect installs (or, with nil, removes) the protect callback.
func (c *Collector) SetProtect(p Protect) {
	c.srcMu.Lock()
	c.protect = p
	c.srcMu.Unlock()
}

func (c *Collector) snapshot() ([]Source, Protect) {
	c.srcMu.Lock()
	defer c.srcMu.Unlock()
	ss := make([]Source, 0, len(c.sources))
	for _, s := range c.sources {
		ss = append(ss, s)
	}
	return ss, c.protect
}

func consult(ctx context.Context, p Protect) (func(blob.Digest) bool, error) {
	if p == nil {
		return func(blob.Digest) bool { return false }, nil
	}
	pred, err := p(ctx)
	if err != nil {
		return nil, err
	}
	if pred == nil {
		pred = func(blob.Digest) bool { return false }
	}
	return pred, nil
}

// errProtected is arbitrate's internal "keep it" answer.
var errProtected = errors.New("protected")

// arbitratedDelete deletes d unless something protects it right now. It
// returns errProtected when protected, an error wrapping blob.ErrMissing
// when d vanished, or the delete's size.
func (c *Collector) arbitratedDelete(ctx context.Context, d blob.Digest, sources []Source, protected func(blob.Digest) bool) (int64, error) {
	c.arb.Lock()
	defer c.arb.Unlock()
	if c.pins.has(d) || protected(d) {
		return 0, errProtected
	}
	for _, s := range sources {
		live, err := s.IsLive(ctx, d)
		if err != nil {
			return 0, fmt.Errorf("liveness query for %s: %w", d, err)
		}
		if live {
			return 0, errProtected
		}
	}
	return c.pool.Delete(ctx, d)
}

// Outcomes of arbitratedDeleteMany besides a size.
const (
	outcomeMissing   = -1
	outcomeProtected = -2
)

// arbitratedDeleteMany is arbitratedDelete for a batch, under one hold of
// the arbitration lock, with one liveness query per BatchSource and one
// DeleteMany on a BatchPool. out[i] is ds[i]'s size, outcomeMissing or
// outcomeProtected.
func (c *Collector) arbitratedDeleteMany(ctx context.Context, ds []blob.Digest, sources []Source, protected func(blob.Digest) bool) ([]int64, error) {
	out := make([]int64, len(ds))
	c.arb.Lock()
	defer c.arb.Unlock()
	var idx []int // candidates still unprotected
	for i, d := range ds {
		if c.pins.has(d) || protected(d) {
			out[i] = outcomeProtected
		} else {
			idx = append(idx, i)
		}
	}
	for _, s := range sources {
		if len(idx) == 0 {
			break
		}
		live, err := liveAmong(ctx, s, ds, idx)
		if err != nil {
			return nil, fmt.Errorf("liveness query: %w", err)
		}
		kept := idx[:0]
		for _, i := range idx {
			if live[ds[i]] {
				out[i] = outcomeProtected
			} else {
				kept = append(kept, i)
			}
		}
		idx = kept
	}
	if len(idx) == 0 {
		return out, nil
	}
	if bp, ok := c.pool.(BatchPool); ok {
		batch := make([]blob.Digest, len(idx))
		for k, i := range idx {
			batch[k] = ds[i]
		}
		sizes, err := bp.DeleteMany(ctx, batch)
		if err != nil {
			return nil, err
		}
		for k, i := range idx {
			out[i] = sizes[k]
		}
		return out, nil
	}
	for _, i := range idx {
		n, err := c.pool.Delete(ctx, ds[i])
		switch {
		case errors.Is(err, blob.ErrMissing):
			out[i] = outcomeMissing
		case err != nil:
			return nil, err
		default:
			out[i] = n
		}
	}
	return out, nil
}

func liveAmong(ctx context.Context, s Source, ds []blob.Digest, idx []int) (map[blob.Digest]bool, error) {
	if bs, ok := s.(BatchSource); ok {
		batch := make([]blob.Digest, len(idx))
		for k, i := range idx {
			batch[k] = ds[i]
		}
		return bs.LiveAmong(ctx, batch)
	}
	live := make(map[blob.Digest]bool)
	for _, i := range idx {
		ok, err := s.IsLive(ctx, ds[i])
		if err != nil {
			return nil, err
		}
		if ok {
			live[ds[i]] = true
		}
	}
	return live, nil
}

// Delete is the direct delete: it refuses (blob.ErrGcRefuse) any key that
// is pinned, live in a registered source, or named by the protect callback,
// and returns blob.ErrMissing for an absent key.
func (c *Collector) Delete(ctx context.Context, d blob.Digest) error {
	sources, p := c.snapshot()
	protected, err := consult(ctx, p)
	if err != nil {
		return blob.Wrap("delete", "", d, fmt.Errorf("%w: protect callback failed: %v", blob.ErrGcRefuse, err))
	}
	_, err = c.arbitratedDelete(ctx, d, sources, protected)
	if errors.Is(err, errProtected) {
		return blob.Wrap("delete", "", d, blob.ErrGcRefuse)
	}
	return err
}

// LastReport returns the most recent sweep's report, if any.
func (c *Collector) LastReport() (Report, bool) {
	c.lastMu.Lock()
	defer c.lastMu.Unlock()
	if c.last == nil {
		return Report{}, false
	}
	return *c.last, true
}

// WindowLen counts candidates waiting in the window.
func (c *Collector) WindowLen(ctx context.Context) (int, error) { return c.window.WindowLen(ctx) }

func sortDigests(ds []blob.Digest) {
	slices.SortFunc(ds, func(a, b blob.Digest) int { return a.Compare(b) })
}
