package gc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/group"
	"github.com/alkblobfs/alkblobfs/meta"
)

// pinEntry is the state of one pinned digest in this process.
type pinEntry struct {
	n int // in-process references
	// row: this collector's gc_pins row for the digest is committed. It
	// stays committed after n falls to 0 until the next renewal tick drops
	// it (a released row lapses instead of costing a write per release).
	row bool
	// writing is non-nil while a row write is in flight, and closed when
	// it ends; pinners of the same digest wait on it instead of writing
	// twice.
	writing chan struct{}
}

// releasedRow: the entry's row outlived its last reference, and no write
// of it is in flight; the row may be dropped.
func (e *pinEntry) releasedRow() bool { return e.n == 0 && e.row && e.writing == nil }

// pins counts in-process references per digest and tracks which have a
// committed row. Its lock is taken under the arbitration lock's read side:
// see Collector.
type pins struct {
	mu sync.Mutex
	m  map[blob.Digest]*pinEntry
}

func (p *pins) add(d blob.Digest) {
	p.mu.Lock()
	if p.m == nil {
		p.m = make(map[blob.Digest]*pinEntry)
	}
	e := p.m[d]
	if e == nil {
		e = &pinEntry{}
		p.m[d] = e
	}
	e.n++
	p.mu.Unlock()
}

func (p *pins) drop(d blob.Digest) {
	p.mu.Lock()
	if e := p.m[d]; e != nil && e.n > 0 {
		e.n--
		if e.n == 0 && !e.row && e.writing == nil {
			delete(p.m, d)
		}
	}
	p.mu.Unlock()
}

func (p *pins) has(d blob.Digest) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.m[d]
	return e != nil && e.n > 0
}

func (p *pins) count() (digests, refs int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.m {
		if e.n > 0 {
			digests++
			refs += e.n
		}
	}
	return digests, refs
}

// sorted returns the pinned digests in ascending order: a snapshot taken at
// mark time. Pins minted after it are caught by arbitration instead.
func (p *pins) sorted() []blob.Digest {
	p.mu.Lock()
	ds := make([]blob.Digest, 0, len(p.m))
	for d, e := range p.m {
		if e.n > 0 {
			ds = append(ds, d)
		}
	}
	p.mu.Unlock()
	sortDigests(ds)
	return ds
}

// ensureRows makes sure every digest of ds has a committed row. It claims
// the digests with no row that no other pinner is writing and commits them
// with one call of write; it waits for the writes of the others, and
// claims again any whose write failed. wrote reports whether write ran.
// The caller holds a reference on each digest.
func (p *pins) ensureRows(ctx context.Context, ds []blob.Digest, write func([]blob.Digest) error) (wrote bool, err error) {
	for {
		var need []blob.Digest
		var wait chan struct{}
		ch := make(chan struct{})
		p.mu.Lock()
		for _, d := range ds {
			switch e := p.m[d]; {
			case e.row, e.writing == ch: // committed, or a repeat in ds
			case e.writing != nil:
				wait = e.writing
			default:
				e.writing = ch
				need = append(need, d)
			}
		}
		p.mu.Unlock()
		if len(need) > 0 {
			err := write(need)
			wrote = true
			p.mu.Lock()
			for _, d := range need {
				e := p.m[d]
				e.writing = nil
				e.row = err == nil
			}
			close(ch)
			p.mu.Unlock()
			if err != nil {
				return wrote, err
			}
			continue
		}
		if wait == nil {
			return wrote, nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return wrote, blob.Wrap("pin", "", blob.Digest{}, ctx.Err())
		}
	}
}

// claimRow is ensureRows for one digest whose row the caller commits
// itself (a put's): it returns a claim on d's row, for the caller to end
// with rowWritten, or nil when d has a committed row; it waits for another
// pinner's write of it first. The caller holds a reference on d.
func (p *pins) claimRow(ctx context.Context, d blob.Digest) (chan struct{}, error) {
	for {
		p.mu.Lock()
		e := p.m[d]
		if e.row {
			p.mu.Unlock()
			return nil, nil
		}
		wait := e.writing
		if wait == nil {
			ch := make(chan struct{})
			e.writing = ch
			p.mu.Unlock()
			return ch, nil
		}
		p.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, blob.Wrap("pin", "", blob.Digest{}, ctx.Err())
		}
	}
}

// rowWritten ends the claim of claimRow: d's row committed (ok) or not.
func (p *pins) rowWritten(d blob.Digest, claim chan struct{}, ok bool) {
	p.mu.Lock()
	e := p.m[d]
	e.writing = nil
	e.row = ok
	close(claim)
	p.mu.Unlock()
}

// released takes the digests whose row outlived their last reference and
// forgets their rows: the caller deletes them (under rowMu's write side).
func (p *pins) released() []blob.Digest {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ds []blob.Digest
	for d, e := range p.m {
		if e.releasedRow() {
			ds = append(ds, d)
			delete(p.m, d)
		}
	}
	return ds
}

// takeReleased is released for ds only: the rows of digests among ds whose
// last pin was released, forgotten here for the caller to delete (under
// rowMu's write side).
func (p *pins) takeReleased(ds []blob.Digest) []blob.Digest {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []blob.Digest
	for _, d := range ds {
		if e := p.m[d]; e != nil && e.releasedRow() {
			out = append(out, d)
			delete(p.m, d)
		}
	}
	return out
}

// restoreRows takes back rows that released handed out but that could not
// be deleted: they still exist, and stay this collector's until dropped.
func (p *pins) restoreRows(ds []blob.Digest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range ds {
		e := p.m[d]
		if e == nil {
			p.m[d] = &pinEntry{row: true}
		} else if e.writing == nil {
			e.row = true
		}
	}
}

// forgetRows marks ds as having no committed row, so that their next pin
// writes one.
func (p *pins) forgetRows(ds []blob.Digest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range ds {
		if e := p.m[d]; e != nil && e.writing == nil {
			e.row = false
			if e.n == 0 {
				delete(p.m, d)
			}
		}
	}
}

// forgetReleased forgets the rows of the digests among ds that no
// reference holds (and none is writing), and returns the rest.
func (p *pins) forgetReleased(ds []blob.Digest) []blob.Digest {
	p.mu.Lock()
	defer p.mu.Unlock()
	held := ds[:0]
	for _, d := range ds {
		switch e := p.m[d]; {
		case e == nil: // taken by a sweep's arbitration meanwhile
			continue
		case e.releasedRow():
			delete(p.m, d)
			continue
		}
		held = append(held, d)
	}
	return held
}

// strays lists the digests of got (rows of this collector's owner that
// the database holds) that this process does not know it has a row for,
// and is not writing one for: a row write that reported failure although
// it committed. A candidate list only: adoptStrays decides under rowMu.
func (p *pins) strays(got map[blob.Digest]bool) []blob.Digest {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ds []blob.Digest
	for d := range got {
		if e := p.m[d]; e == nil || (!e.row && e.writing == nil) {
			ds = append(ds, d)
		}
	}
	return ds
}

// adoptStrays settles the stray rows among ds, with no row write in
// flight (the caller holds rowMu's write side): a digest still held takes
// its row for its own (adopted); the rows of the others are returned, for
// the caller to delete (and restoreRows, if that fails).
func (p *pins) adoptStrays(ds []blob.Digest) (adopted int, drop []blob.Digest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range ds {
		switch e := p.m[d]; {
		case e == nil:
			drop = append(drop, d)
		case e.row || e.writing != nil: // committed since strays looked
		case e.n > 0:
			e.row = true
			adopted++
		default:
			delete(p.m, d)
			drop = append(drop, d)
		}
	}
	return adopted, drop
}

// withRows lists the digests that hold a committed row.
func (p *pins) withRows() []blob.Digest {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ds []blob.Digest
	for d, e := range p.m {
		if e.row {
			ds = append(ds, d)
		}
	}
	return ds
}

// Pin is one reference that protects a digest from deletion: in this
// process always, and in every process sharing the pool where the store
// keeps pin rows. Release it exactly when the protection is no longer
// needed; Release is idempotent and safe for concurrent use.
type Pin struct {
	c        *Collector
	d        blob.Digest
	released atomic.Bool
}

// Digest is the pinned key.
func (p *Pin) Digest() blob.Digest { return p.d }

// Release drops the reference. Calls after the first do nothing. A nil Pin
// releases nothing, so error paths can release unconditionally.
func (p *Pin) Release() {
	if p == nil || !p.released.CompareAndSwap(false, true) {
		return
	}
	p.c.pins.drop(p.d)
}

// Clone mints a second, independent pin on the same digest (for handing a
// reference to another owner without transferring this one). The digest is
// pinned already, so this never touches the database: the clone protects
// in other processes only what p does, and the pin of a linked
// BeginPublish protects nothing there (its callers release it at once and
// never clone it).
func (p *Pin) Clone() *Pin {
	p.c.arb.RLock()
	p.c.pins.add(p.d)
	p.c.arb.RUnlock()
	return &Pin{c: p.c, d: p.d}
}

// ReleaseAll releases every pin in ps (nil entries allowed).
func ReleaseAll(ps []*Pin) {
	for _, p := range ps {
		p.Release()
	}
}

// Pin mints a pin on d. Mint it before the entry it protects becomes
// visible (pin-before-publish); pinning an absent digest is allowed. Where
// the store keeps pin rows, the first pin of a digest in this process
// commits a row before Pin returns, so another process's arbitration sees
// it; later pins of a held digest cost no database write.
func (c *Collector) Pin(ctx context.Context, d blob.Digest) (*Pin, error) {
	pub, row, err := c.BeginPublish(ctx, d, false)
	if err != nil {
		return nil, err
	}
	if row != nil {
		err = c.rows.write(ctx, d)
	}
	return pub.Done(err)
}

// Publish is a pin being minted with the put that publishes its digest
// (BeginPublish), until Done.
type Publish struct {
	pin *Pin
	// claim is closed by Done: the pin row this put commits, which other
	// pinners of the digest wait for instead of writing it twice; nil
	// when the put commits none.
	claim chan struct{}
	// locked: the put holds rowMu's read side until Done, so that a
	// renewal tick never drops a row it writes, and Close waits for it.
	locked bool
}

// BeginPublish mints a pin on d for a put that commits the pin's row in
// its own transaction, with the entry it protects (the joint put): it
// returns the row for the put to commit (meta.Rows.Pin), or nil where the
// put needs none — this process holds a row for d already, or the store
// keeps no rows. The caller runs the put and then calls Done exactly
// once with its outcome.
//
// linked is the caller's promise that the put's transaction also writes
// what keeps d live in every process (a namespace reference or intent,
// which every arbitration reads in its own transaction: SharedSource), and
// that it releases the pin as soon as the put returns, neither keeping
// nor cloning it (store.ReleasesPinAtOnce). Where the host serializes
// arbitrations with whole write transactions (meta.SerialHost: SQLite),
// the link then protects d from the moment the entry is visible, and the
// put writes no pin row — on SQLite, two b-tree writes of every small
// close and a delete of each at the next renewal (docs/gc.md, "What a
// small close writes"). The pin is then this process's reference only,
// for its own sweeps: it protects nothing in another process, so a caller
// that hands it on (a pin token, a clone) must not pass linked. On
// PostgreSQL the arbitration lock is per digest and taken by pin rows, so
// linked changes nothing there.
func (c *Collector) BeginPublish(ctx context.Context, d blob.Digest, linked bool) (*Publish, *meta.PinRow, error) {
	if c.closed.Load() {
		return nil, nil, blob.Wrap("pin", "", d, blob.ErrClosed)
	}
	// Counted under the arbitration lock's read side: an arbitration in
	// this process either sees the reference or finishes its delete first.
	c.arb.RLock()
	c.pins.add(d)
	c.arb.RUnlock()
	pub := &Publish{pin: &Pin{c: c, d: d}}
	if c.host == nil {
		return pub, nil, nil
	}
	// Row writes (and a rowless put's transaction) hold rowMu's read side,
	// so that a renewal tick dropping released rows never deletes one
	// written meanwhile, and Close waits for them.
	c.rowMu.RLock()
	if c.closed.Load() {
		c.rowMu.RUnlock()
		pub.pin.Release()
		return nil, nil, blob.Wrap("pin", "", d, blob.ErrClosed)
	}
	if sh, ok := c.host.(meta.SerialHost); linked && ok && sh.SerialArbitration() {
		pub.locked = true
		return pub, nil, nil
	}
	claim, err := c.pins.claimRow(ctx, d)
	if err != nil || claim == nil {
		c.rowMu.RUnlock()
		if err != nil {
			pub.pin.Release()
			return nil, nil, err
		}
		return pub, nil, nil
	}
	pub.claim, pub.locked = claim, true
	return pub, &meta.PinRow{D: d, Owner: c.owner, TTL: c.ttl}, nil
}

// Done ends the publish with the put's outcome err: nil, and the pin row
// BeginPublish handed out is this process's, committed, so later pins of
// the digest write none; an error, and no pin is held, and the next pin
// of the digest writes its row. It returns the pin, or err.
func (p *Publish) Done(err error) (*Pin, error) {
	c := p.pin.c
	if p.claim != nil {
		c.pins.rowWritten(p.pin.d, p.claim, err == nil)
	}
	if p.locked {
		c.rowMu.RUnlock()
	}
	if err != nil {
		p.pin.Release()
		return nil, err
	}
	return p.pin, nil
}

// PinMany mints a pin on each digest of ds, writing the rows this process
// lacks in one transaction. On error no pin is held.
func (c *Collector) PinMany(ctx context.Context, ds []blob.Digest) ([]*Pin, error) {
	if c.closed.Load() {
		return nil, blob.Wrap("pin", "", blob.Digest{}, blob.ErrClosed)
	}
	ps := make([]*Pin, len(ds))
	c.arb.RLock()
	for i, d := range ds {
		c.pins.add(d)
		ps[i] = &Pin{c: c, d: d}
	}
	c.arb.RUnlock()
	if c.host == nil {
		return ps, nil
	}
	// One transaction for every digest without a row; digests another
	// pinner is writing are waited for.
	c.rowMu.RLock()
	defer c.rowMu.RUnlock()
	if c.closed.Load() {
		ReleaseAll(ps)
		return nil, blob.Wrap("pin", "", blob.Digest{}, blob.ErrClosed)
	}
	_, err := c.pins.ensureRows(ctx, ds, func(need []blob.Digest) error {
		return c.host.PinRows(ctx, c.owner, need, c.ttl)
	})
	if err != nil {
		ReleaseAll(ps)
		return nil, err
	}
	return ps, nil
}

// renewLoop keeps this collector's rows alive: every TTL/3 it drops the
// rows whose last reference was released, then renews the rest in one
// statement (one per owner, not one per pin). It ends when stop closes.
//
// Design point (renewal lifecycle): one loop per collector, not a task
// per pin — a mount may hold 100 000 open files, and one UPDATE per owner
// renews them all. It starts with the collector and stops in Close, which
// waits for it (no leaked goroutine). Failure posture: a failed tick is
// logged and the next one retries; the rows' expiry is the protection, so a
// missed renewal degrades to expiry, never to an error on a put or an open.
//
// The cadence is real time even under an injected Clock: a test clock
// that stands still must not stop renewal. The rows themselves are timed by
// the row clock (meta.Host: the database server's on PostgreSQL),
// which renewal asks for a fresh TTL.
// Tests tick by hand with Renew.
func (c *Collector) renewLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(max(c.ttl/3, time.Millisecond))
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel() // a tick stuck on the database must not hold up Close
	}()
	// Cut off from the database (every tick failing), this process can
	// tell when its rows have lapsed before it can reach them again: a
	// TTL after the last renewal that committed. It says so then, once
	// per outage; the rows themselves are counted and re-pinned by the
	// first tick that gets through (Renew). Monotonic time: this process
	// alone compares it.
	renewed, told := time.Now(), false
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		err := c.Renew(ctx)
		switch {
		case err == nil:
			renewed, told = time.Now(), false
		case ctx.Err() != nil:
			// A tick that Close cut short is no failure to report: a
			// command would print it on its way out.
		default:
			c.log.Warn("renew pin rows", "err", err, "owner", c.owner)
			if cut := time.Since(renewed); cut > c.ttl && !told {
				told = true
				digests, _ := c.pins.count()
				c.log.Error("pin rows lapsing: no renewal reached the database for longer than the pin TTL; other hosts may now delete blobs that only this process holds (reads of those fail with EIO; the rest are re-pinned on reconnect)",
					"owner", c.owner, "since_renewal", cut.Round(time.Millisecond), "ttl", c.ttl, "held", digests)
			}
		}
	}
}

// Renew is one renewal tick (see renewLoop): drop released rows, renew the
// held ones, and pin afresh what lapsed.
func (c *Collector) Renew(ctx context.Context) error {
	if c.host == nil {
		return nil
	}
	c.rowMu.Lock()
	gone := c.pins.released()
	err := c.host.DropPins(ctx, c.owner, gone)
	if err != nil {
		// The rows are still there: keep them ours, to drop next tick.
		c.pins.restoreRows(gone)
	}
	c.rowMu.Unlock()
	if err != nil {
		c.log.Warn("drop released pin rows; retrying at the next tick", "err", err, "rows", len(gone))
	}
	held := c.pins.withRows()
	got, err := c.host.RenewPins(ctx, c.owner, c.ttl)
	if err != nil {
		return err
	}
	c.settleStrays(ctx, got)
	// Compared digest by digest: rows written since withRows are renewed
	// too and must not hide a lapse.
	var lapsed []blob.Digest
	for _, d := range held {
		if !got[d] {
			lapsed = append(lapsed, d)
		}
	}
	// A lapsed row of a digest released meanwhile (its drop failed, the
	// database being out of reach) has nothing left to protect: forget
	// it rather than pin it afresh.
	lapsed = c.pins.forgetReleased(lapsed)
	if len(lapsed) == 0 {
		return nil
	}
	// These rows expired before this tick (a pause or an outage longer
	// than the TTL), and renewal never revives an expired row: another
	// process may have swept what they protected. Pin afresh what is still
	// held — a new pin, not a renewal — and say so.
	c.lapsed.Add(int64(len(lapsed)))
	c.log.Error("pin rows lapsed before renewal; re-pinning the digests still held (blobs deleted meanwhile stay deleted)",
		"owner", c.owner, "lapsed", len(lapsed), "held", len(held))
	c.rowMu.RLock()
	defer c.rowMu.RUnlock()
	if err := c.host.PinRows(ctx, c.owner, lapsed, c.ttl); err != nil {
		c.pins.forgetRows(lapsed) // the next pin of each writes its row
		return fmt.Errorf("re-pin %d digests: %w", len(lapsed), err)
	}
	return nil
}

// settleStrays deals with the rows renewal found under this collector's
// owner that no pin of this process accounts for. A row write whose
// COMMIT reached the server but whose answer was lost (a connection reset,
// an op timeout) reports failure: the pin fails, its reference goes, and
// the process forgets the digest — while the row stays in the database,
// renewed by every tick (RenewPins renews the owner's rows, not a list),
// and keeps the blob from every sweep for as long as this process lives.
// Such a row is dropped here, or taken over if the digest is held again;
// a drop that fails is retried at the next tick.
func (c *Collector) settleStrays(ctx context.Context, got map[blob.Digest]bool) {
	cand := c.pins.strays(got)
	if len(cand) == 0 {
		return
	}
	c.rowMu.Lock()
	adopted, drop := c.pins.adoptStrays(cand)
	err := c.host.DropPins(ctx, c.owner, drop)
	if err != nil {
		c.pins.restoreRows(drop) // ours now: released() retries the drop
	}
	c.rowMu.Unlock()
	if adopted+len(drop) == 0 {
		return
	}
	sortDigests(drop)
	var first string
	if len(drop) > 0 {
		first = drop[0].String()
	}
	c.strays.Add(int64(adopted + len(drop)))
	c.log.Warn("pin rows found that no pin of this process accounts for (a row write reported failure but committed); released rows dropped, held ones kept",
		"owner", c.owner, "dropped", len(drop), "adopted", adopted, "first_dropped", first, "drop_err", err)
}

// Strays counts the pin rows renewal found that no pin of this process
// accounted for (see settleStrays).
func (c *Collector) Strays() int64 { return c.strays.Load() }

// Close stops renewing and deletes this collector's pin rows: nothing it
// pinned stays protected by it. Pins minted after Close fail. Idempotent.
func (c *Collector) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	if c.host == nil {
		return nil
	}
	close(c.stopRenew)
	<-c.renewDone
	// Row writes in flight hold rowMu's read side; later ones see closed.
	c.rowMu.Lock()
	c.rows.group.Close()
	c.rowMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if err := c.host.DropOwner(ctx, c.owner); err != nil {
		return fmt.Errorf("drop pin rows of %s (they lapse in %s): %w", c.owner, c.ttl, err)
	}
	return nil
}

// rowWriter commits the rows of first pins (Pin without a put), coalescing
// the pins that arrive while a commit is in flight into the next one: a
// group commit (group.Commit). Readers opening many blobs at once
// (ls | xargs cat -P4) then share transactions instead of queueing one
// each on the database's write lock.
type rowWriter struct {
	c     *Collector
	group *group.Commit[*rowReq]
}

type rowReq struct {
	d   blob.Digest
	ctx context.Context
	err error
}

func newRowWriter(c *Collector) *rowWriter {
	w := &rowWriter{c: c}
	w.group = group.New(group.Options{Runners: 1}, w.flush)
	return w
}

// write returns once d's row is committed, or the commit failed.
func (w *rowWriter) write(ctx context.Context, d blob.Digest) error {
	// Not abandoned on ctx: the row may commit regardless, and the caller
	// must know whether it did.
	r := &rowReq{d: d, ctx: context.WithoutCancel(ctx)}
	if err := w.group.Do(ctx, r, group.Eager); err != nil {
		return err
	}
	return r.err
}

// flush commits the rows of one batch, with its first caller's context:
// the group's run function.
func (w *rowWriter) flush(batch []*rowReq) {
	ds := make([]blob.Digest, len(batch))
	for i, r := range batch {
		ds[i] = r.d
	}
	err := w.c.host.PinRows(batch[0].ctx, w.c.owner, ds, w.c.ttl)
	for _, r := range batch {
		r.err = err
	}
}
