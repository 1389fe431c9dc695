package gc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
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

// SharedSource is a Source kept in the host's database (namespace
// links, an embedder's liveness table). With a host, arbitration has the
// host read it inside the arbitration transaction, after the key locks
// are held, so a reference committed before the delete is always seen.
type SharedSource interface {
	Source
	// Shared is the source's table as the host reads it
	// (meta.Arbitration.Live).
	Shared() meta.Liveness
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

// OutsidePool is the Pool capability a collector with a host needs. The
// host deletes the kv tier's rows itself, in its arbitration transaction
// (meta.Host.Arbitrate), which may roll back and, on SQLite, run again.
// DeleteOutside deletes ds from the tiers outside the host's database (the
// large tier: files, large objects, S3 objects), which no rollback
// restores: the collector calls it only once the transaction that decided
// ds has committed, in a second hold of the arbitration lock that checks
// ds again (meta.Arbitration.Outside). It returns each digest's size, or
// -1 for one no such tier holds. Outside reports whether there is such a
// tier.
type OutsidePool interface {
	Outside() bool
	DeleteOutside(ctx context.Context, ds []blob.Digest) ([]int64, error)
}

// Clock times what the collector does in its own process: how long a sweep
// with the in-process window waits, that window's rows, the times in a
// Report. It never times a row another process reads — pin expiries and the
// durable window are the host's and the window host's clock (see
// meta.Host), given TTLs and delays — so a process whose clock is
// wrong, or jumps, misjudges nothing of another's. Injected so that the
// in-process window is tested without sleeping.
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
	// Window, when non-nil, is the durable delete window (a meta.Window:
	// an SQL database's gc_window table): candidates queued by one sweep
	// are executed by a later one. When nil, an in-process window is used and each sweep
	// executes its own candidates once Delay has passed.
	Window meta.Window
	// Delay is the delete window: candidates become executable at
	// mark_end + Delay.
	Delay time.Duration
	// Host, when non-nil, holds the GC state every process and host of the
	// pool shares: pins become gc_pins rows, deletes are arbitrated in its
	// transactions under its arbitration lock, and sweeps take its lease.
	// Nil keeps everything in this process (a mem store). With a host,
	// the host deletes the kv tier's rows, and the pool must be an
	// OutsidePool.
	Host meta.Host
	// PinTTL is how long a pin row lives unless renewed; rows are renewed
	// every PinTTL/3. 0 means DefaultPinTTL.
	PinTTL time.Duration
	// Clock defaults to RealClock.
	Clock Clock
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// DefaultPinTTL is the life of an unrenewed pin row: long enough that a
// renewal every 20 s rides out a database failover, short enough that a
// crashed process's pins are gone within a minute.
const DefaultPinTTL = 60 * time.Second

// closeTimeout bounds the database work of Close.
const closeTimeout = 10 * time.Second

// arbitrateTimeout bounds one arbitration transaction (a batch of
// arbitrateBatch candidates): far above its normal milliseconds.
const arbitrateTimeout = 2 * time.Minute

// Collector owns all GC state of one store instance.
type Collector struct {
	pool    Pool
	window  meta.Window
	durable bool
	delay   time.Duration
	clock   Clock
	log     *slog.Logger

	// arb is the in-process arbitration lock. Pin takes the read side to
	// count its reference, a delete's check-then-delete takes the write
	// side, so no in-process pin can appear between an arbitration's check
	// and its delete. Across processes the host's arbitration lock does
	// the same for pin rows.
	arb  sync.RWMutex
	pins pins

	// Shared state (host non-nil).
	host  meta.Host
	owner string
	ttl   time.Duration
	// rowMu orders row writes (read side) against a renewal tick's drop of
	// released rows (write side).
	rowMu     sync.RWMutex
	rows      *rowWriter
	stopRenew chan struct{}
	renewDone chan struct{}
	lapsed    atomic.Int64
	strays    atomic.Int64
	closed    atomic.Bool

	srcMu   sync.Mutex
	sources map[*Registration]Source
	protect Protect

	sweeping sync.Mutex // held for a whole sweep; TryLock → AbortSweeperLock

	lastMu sync.Mutex
	last   *Report
	totals Totals // under lastMu
}

// New returns a collector over pool. With o.Host set, it renews its pin
// rows until Close.
func New(pool Pool, o Options) *Collector {
	c := &Collector{
		pool:    pool,
		window:  o.Window,
		durable: o.Window != nil,
		delay:   o.Delay,
		clock:   o.Clock,
		log:     o.Logger,
		host:    o.Host,
		owner:   NewOwner(),
		ttl:     o.PinTTL,
		sources: make(map[*Registration]Source),
	}
	if c.clock == nil {
		c.clock = RealClock
	}
	if c.window == nil {
		c.window = newMemWindow(c.clock)
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	if c.ttl <= 0 {
		c.ttl = DefaultPinTTL
	}
	c.rows = newRowWriter(c)
	if c.host != nil {
		c.stopRenew, c.renewDone = make(chan struct{}), make(chan struct{})
		go c.renewLoop(c.stopRenew, c.renewDone)
	}
	return c
}

// NewOwner returns a fresh owner id: host name, pid and 64 random bits, so
// that an operator reading gc_pins can tell who holds what.
func NewOwner() string {
	host, _ := os.Hostname()
	var b [8]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// Owner is the owner id of this collector's pin rows.
func (c *Collector) Owner() string { return c.owner }

// Shared reports whether pins and arbitration are shared through the
// database (see Options.Host).
func (c *Collector) Shared() bool { return c.host != nil }

// PinTTL is the life of an unrenewed pin row.
func (c *Collector) PinTTL() time.Duration { return c.ttl }

// Lapsed counts pin rows found expired at renewal (see renewLoop).
func (c *Collector) Lapsed() int64 { return c.lapsed.Load() }

// Durable reports whether queued candidates survive a restart.
func (c *Collector) Durable() bool { return c.durable }

// Delay is the configured delete window.
func (c *Collector) Delay() time.Duration { return c.delay }

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

// Outcomes of arbitratedDeleteMany besides a size: the host's
// (meta.Host.Arbitrate), whose answers the collector passes on as they are.
const (
	outcomeMissing   = meta.NotHeld
	outcomeProtected = meta.Protected
)

// arbitratedDeleteMany deletes each digest of ds that nothing protects at
// the moment of its delete, and returns out[i] = ds[i]'s size,
// outcomeMissing or outcomeProtected. The two arbitration domains compose
// in one order:
//
// Design point (two-domain composition): in-process first — pins, the
// protect predicate and in-process sources, under the write side of arb,
// cheap and without I/O — then, with a host, the shared domain in one
// operation of the host (meta.Host.Arbitrate), one transaction that holds
// the key locks: every owner's unexpired pin rows (this process's too,
// which it wrote before releasing arb), every SharedSource (namespace
// links, liveness tables), and the delete itself, so a pin, link or put
// committed by any process is either seen or ordered after the delete.
func (c *Collector) arbitratedDeleteMany(ctx context.Context, ds []blob.Digest, sources []Source, protected func(blob.Digest) bool) ([]int64, error) {
	out := make([]int64, len(ds))
	c.arb.Lock()
	locked := true
	defer func() {
		if locked {
			c.arb.Unlock()
		}
	}()
	var idx []int // candidates still unprotected
	for i, d := range ds {
		if c.pins.has(d) || protected(d) {
			out[i] = outcomeProtected
		} else {
			idx = append(idx, i)
		}
	}
	var shared []meta.Liveness
	for _, s := range sources {
		if ss, ok := s.(SharedSource); ok && c.host != nil {
			shared = append(shared, ss.Shared())
			continue
		}
		if len(idx) == 0 {
			break
		}
		live, err := liveAmong(ctx, s, ds, idx)
		if err != nil {
			return nil, fmt.Errorf("liveness query: %w", err)
		}
		idx = meta.KeepLive(ds, idx, out, live)
	}
	if len(idx) == 0 {
		return out, nil
	}
	if c.host == nil {
		return out, c.deleteIdx(ctx, ds, idx, out)
	}
	op, ok := c.pool.(OutsidePool)
	if !ok {
		return nil, errors.New("gc: the pool cannot say what it keeps outside the host's database (OutsidePool)")
	}
	batch := meta.Pick(ds, idx)
	// Design point (leaving the in-process lock): this process's rows of
	// candidates it no longer pins go now, still under arb; from here on
	// any pin of a candidate, ours included, writes a row under the key
	// lock, and the host's check counts every owner's rows. So arb need
	// not be held while the large tier deletes: a large put waiting for
	// arb holds a pglo connection that those deletes may need.
	c.rowMu.Lock()
	own := c.pins.takeReleased(batch)
	err := c.host.DropPins(ctx, c.owner, own)
	if err != nil {
		c.pins.restoreRows(own)
	}
	c.rowMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("drop released pin rows: %w", err)
	}
	c.arb.Unlock()
	locked = false
	// The timeout is a backstop: a transaction that cannot finish must not
	// hold its key locks.
	actx, cancel := context.WithTimeout(ctx, arbitrateTimeout)
	defer cancel()
	// Design point (what a rollback cannot take back): the first hold of
	// the lock decides and deletes the kv rows, in a transaction the host
	// may share with other writers' jobs and, when that one rolls back,
	// run again (SQLite's Batcher) — so it deletes nothing a rollback does
	// not restore, and the host's answer is the run that committed. A
	// first run may have seen a link removal that then rolled back: a file
	// unlinked on its strength was a linked blob lost. The files and
	// objects of the large tier go only after that decision committed, in
	// a second hold of the lock (Arbitration.Outside), alone and once,
	// that checks the survivors again: a pin row committed in between (a
	// put that found the file and deduped on it) or a link keeps the
	// file. A crash between the two leaves unreferenced large-tier blobs,
	// which the next sweeps queue and delete like any other.
	res, err := c.host.Arbitrate(actx, meta.Arbitration{Digests: batch, Live: shared})
	if err != nil {
		return nil, err
	}
	if op.Outside() {
		var dead []int // of batch: the decided, whatever the kv tier held
		for k, n := range res {
			if n != outcomeProtected {
				dead = append(dead, k)
			}
		}
		if len(dead) > 0 {
			got, err := c.host.Arbitrate(actx, meta.Arbitration{Digests: meta.Pick(batch, dead), Live: shared, Outside: op.DeleteOutside})
			if err != nil {
				// The kv rows are gone, the large tier's blobs are not:
				// they are unreferenced, and a later sweep deletes them.
				return nil, err
			}
			for j, k := range dead {
				switch n := got[j]; {
				case n >= 0:
					res[k] = max(res[k], 0) + n
				case n == outcomeProtected && res[k] < 0:
					// Pinned or linked since: the large tier's copy, the
					// only one, stays. (A kv copy deleted beside it counts
					// as deleted.)
					res[k] = outcomeProtected
				}
			}
		}
	}
	for k, i := range idx {
		out[i] = res[k]
	}
	return out, nil
}

// deleteIdx deletes ds[idx] through the pool, in-process form.
func (c *Collector) deleteIdx(ctx context.Context, ds []blob.Digest, idx []int, out []int64) error {
	if bp, ok := c.pool.(BatchPool); ok {
		sizes, err := bp.DeleteMany(ctx, meta.Pick(ds, idx))
		if err != nil {
			return err
		}
		for k, i := range idx {
			out[i] = sizes[k]
		}
		return nil
	}
	for _, i := range idx {
		n, err := c.pool.Delete(ctx, ds[i])
		switch {
		case errors.Is(err, blob.ErrMissing):
			out[i] = outcomeMissing
		case err != nil:
			return err
		default:
			out[i] = n
		}
	}
	return nil
}

func liveAmong(ctx context.Context, s Source, ds []blob.Digest, idx []int) (map[blob.Digest]bool, error) {
	if bs, ok := s.(BatchSource); ok {
		return bs.LiveAmong(ctx, meta.Pick(ds, idx))
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
// is pinned (by any process, where pins are shared), live in a registered
// source, or named by the protect callback, and returns blob.ErrMissing for
// an absent key. With no source registered nothing can be proven dead, so
// it refuses everything; ForceDelete is the explicit override.
func (c *Collector) Delete(ctx context.Context, d blob.Digest) error {
	return c.delete(ctx, d, false)
}

// ForceDelete is Delete that does not require a liveness source: for
// stores that keep none, where the operator vouches that nothing refers to
// d. Pins and the protect callback still refuse it.
func (c *Collector) ForceDelete(ctx context.Context, d blob.Digest) error {
	return c.delete(ctx, d, true)
}

func (c *Collector) delete(ctx context.Context, d blob.Digest, force bool) error {
	if c.closed.Load() {
		return blob.Wrap("delete", "", d, blob.ErrClosed)
	}
	sources, p := c.snapshot()
	if len(sources) == 0 && !force {
		return blob.Wrap("delete", "", d, fmt.Errorf("%w: no liveness source is registered, so nothing can prove it unreferenced", blob.ErrGcRefuse))
	}
	protected, err := consult(ctx, p)
	if err != nil {
		return blob.Wrap("delete", "", d, fmt.Errorf("%w: protect callback failed: %v", blob.ErrGcRefuse, err))
	}
	out, err := c.arbitratedDeleteMany(ctx, []blob.Digest{d}, sources, protected)
	switch {
	case err != nil:
		return blob.Wrap("delete", "", d, err)
	case out[0] == outcomeProtected:
		return blob.Wrap("delete", "", d, blob.ErrGcRefuse)
	case out[0] < 0:
		return blob.Wrap("delete", "", d, blob.ErrMissing)
	}
	return nil
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

// Totals sums the sweeps this collector ran (or tried to run) since it was
// made: the mount's stats and the metrics both read it.
type Totals struct {
	Runs   int64 `json:"runs"`
	Failed int64 `json:"failed"` // ended with an operational error
	// Aborted counts the runs that deliberately did nothing, by cause.
	Aborted    map[AbortCause]int64 `json:"aborted,omitempty"`
	Scanned    int64                `json:"scanned"`
	Queued     int64                `json:"candidates_queued"`
	Deleted    int64                `json:"deleted"`
	Cancelled  int64                `json:"cancelled_by_arbitration"`
	BytesFreed int64                `json:"bytes_freed"`
	Reaped     int64                `json:"pins_reaped"`
}

// Totals returns the sums of every sweep so far.
func (c *Collector) Totals() Totals {
	c.lastMu.Lock()
	defer c.lastMu.Unlock()
	t := c.totals
	t.Aborted = maps.Clone(t.Aborted)
	return t
}

// count adds one sweep's report to the totals.
func (c *Collector) count(r Report, err error) {
	c.lastMu.Lock()
	defer c.lastMu.Unlock()
	t := &c.totals
	t.Runs++
	if err != nil {
		t.Failed++
	}
	if r.Aborted != "" {
		if t.Aborted == nil {
			t.Aborted = make(map[AbortCause]int64)
		}
		t.Aborted[r.Aborted]++
	}
	t.Scanned += r.Scanned
	t.Queued += int64(r.Queued)
	t.Deleted += int64(r.Deleted)
	t.Cancelled += int64(r.Cancelled)
	t.BytesFreed += r.BytesFreed
	t.Reaped += r.Reaped
}

// WindowLen counts candidates waiting in the window.
func (c *Collector) WindowLen(ctx context.Context) (int, error) { return c.window.WindowLen(ctx) }

func sortDigests(ds []blob.Digest) {
	slices.SortFunc(ds, func(a, b blob.Digest) int { return a.Compare(b) })
}
