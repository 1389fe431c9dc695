package namespaces

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/meta"
)

// SQL is a Registry kept in the kv engine's database (see Open), so that
// links survive restarts and can commit in the same transaction as a put
// (Join). Its rows — names, references, intents, usage counters — are
// package meta's (meta.Links: the tables, their migrations and every
// statement, per dialect); SQL checks names and sizes, names the
// operation on every error, pages the listings and watches for other
// hosts' changes.
type SQL struct {
	l *meta.Links
	// db is the engine's database, which l writes; nothing here does but
	// the tests' DamageUsage.
	db *sql.DB
	// listen and origin serve Watch on PostgreSQL (watch_postgres.go).
	listen listener
	origin string
}

var (
	_ Registry        = (*SQL)(nil)
	_ gc.BatchSource  = (*SQL)(nil)
	_ gc.SharedSource = (*SQL)(nil)
	_ Joinable        = (*SQL)(nil)
)

// OpenSQL creates the registry's tables in e's database if needed and
// returns the registry. e's dialect is "sqlite" or "postgres"; a SQLite
// engine must be an engines.RowClock (engines/sqlite is), which times the
// intents. clock stamps LinkedAt; nil means the wall clock. The registry
// does not own e's database: closing the engine closes it.
func OpenSQL(ctx context.Context, e engines.SQL, clock Clock) (*SQL, error) {
	return openSQL(ctx, e, clock, nil)
}

// openSQL is OpenSQL whose writes go through batch when it is set (the
// SQLite engine's Batcher: see Open). That includes the usage recount at
// open, when the usage columns were just added: eager Batcher jobs, which
// may share a transaction with other writers' and run again after a
// rollback; the recount is idempotent (it sets every counter afresh).
func openSQL(ctx context.Context, e engines.SQL, clock Clock, batch *meta.Batcher) (*SQL, error) {
	r := &SQL{db: e.DB()}
	r.watchOpen(e)
	l, err := meta.OpenLinks(ctx, meta.LinksConfig{Engine: e, Batch: batch, Wall: orWall(clock).Now, Origin: r.origin})
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	r.l = l
	if l.NeedsRecount() {
		// The rows made before usage was kept are counted once, now;
		// their sizes are unknown (0) until Service.FillSizes.
		if _, err := r.Recount(ctx); err != nil {
			return nil, fmt.Errorf("namespaces: open %s: count the usage of a store made before it was kept: %w", e.Dialect(), err)
		}
	}
	return r, nil
}

// Dialect is "sqlite" or "postgres".
func (r *SQL) Dialect() string { return r.l.Dialect() }

// Create implements Registry.
func (r *SQL) Create(ctx context.Context, name string) error {
	return r.create(ctx, name, nil)
}

// CreatePerm implements Registry.
func (r *SQL) CreatePerm(ctx context.Context, name string, p Perm) error {
	p = p.clean()
	return r.create(ctx, name, &meta.NSPerm{Uid: p.Uid, Gid: p.Gid, Mode: p.Mode})
}

func (r *SQL) create(ctx context.Context, name string, p *meta.NSPerm) error {
	if err := check(ctx, name); err != nil {
		return wrap("create", name, blob.Digest{}, err)
	}
	return wrap("create", name, blob.Digest{}, r.l.Create(ctx, name, p))
}

// Perm implements Registry.
func (r *SQL) Perm(ctx context.Context, name string) (Perm, bool, error) {
	if err := check(ctx, name); err != nil {
		return Perm{}, false, wrap("perm", name, blob.Digest{}, err)
	}
	p, ok, err := r.l.Perm(ctx, name)
	if err != nil || !ok {
		return Perm{}, false, wrap("perm", name, blob.Digest{}, err)
	}
	return Perm{Uid: p.Uid, Gid: p.Gid, Mode: p.Mode}.clean(), true, nil
}

// SetPerm implements Registry.
func (r *SQL) SetPerm(ctx context.Context, name string, p Perm) error {
	if err := check(ctx, name); err != nil {
		return wrap("set perm", name, blob.Digest{}, err)
	}
	p = p.clean()
	return wrap("set perm", name, blob.Digest{}, r.l.SetPerm(ctx, name, meta.NSPerm{Uid: p.Uid, Gid: p.Gid, Mode: p.Mode}))
}

// Remove implements Registry.
func (r *SQL) Remove(ctx context.Context, name string) error {
	if err := check(ctx, name); err != nil {
		return wrap("remove", name, blob.Digest{}, err)
	}
	return wrap("remove", name, blob.Digest{}, r.l.Remove(ctx, name))
}

// Exists implements Registry.
func (r *SQL) Exists(ctx context.Context, name string) (bool, error) {
	if err := check(ctx, name); err != nil {
		return false, wrap("exists", name, blob.Digest{}, err)
	}
	ok, err := r.l.Exists(ctx, name)
	return ok, wrap("exists", name, blob.Digest{}, err)
}

// Names implements Registry.
func (r *SQL) Names(ctx context.Context, after string) iter.Seq2[string, error] {
	return paged(ctx, "names", "", func(first bool, last string) ([]string, error) {
		from := after
		if !first {
			from = last
		}
		return r.l.NamesPage(ctx, from, pageSize)
	})
}

// Link implements Registry. It runs in its own transaction; a put's link
// commits with the put's entry instead (Join).
func (r *SQL) Link(ctx context.Context, name string, d blob.Digest) (bool, error) {
	return r.LinkSized(ctx, name, d, 0)
}

// LinkSized implements Registry, in its own transaction.
func (r *SQL) LinkSized(ctx context.Context, name string, d blob.Digest, size int64) (bool, error) {
	if err := check(ctx, name); err != nil {
		return false, wrap("link", name, d, err)
	}
	if err := checkSize(size); err != nil {
		return false, wrap("link", name, d, err)
	}
	linked, err := r.l.Link(ctx, name, d, size)
	return linked, wrap("link", name, d, err)
}

// Join implements Joinable: a put's namespace part (Service.LinkRows,
// SettleRows, PendRows) written by meta in the put's transaction.
func (r *SQL) Join(part meta.NSRows) meta.NSRows { return r.l.Rows(part) }

// LinkMany implements Registry: one transaction (meta.Links.LinkMany).
func (r *SQL) LinkMany(ctx context.Context, name string, ds []blob.Digest) (int, error) {
	sized := make([]Sized, len(ds))
	for i, d := range ds {
		sized[i].Digest = d
	}
	return r.LinkManySized(ctx, name, sized)
}

// LinkManySized implements Registry: one transaction, which admits the
// charge of the digests new to the namespace against its quota before it
// commits (meta.Links.LinkMany).
func (r *SQL) LinkManySized(ctx context.Context, name string, ds []Sized) (int, error) {
	if err := check(ctx, name); err != nil {
		return 0, wrap("linkmany", name, blob.Digest{}, err)
	}
	for _, d := range ds {
		if err := checkSize(d.Size); err != nil {
			return 0, wrap("linkmany", name, d.Digest, err)
		}
	}
	n, err := r.l.LinkMany(ctx, name, ds)
	return n, wrap("linkmany", name, blob.Digest{}, err)
}

// Unlink implements Registry.
func (r *SQL) Unlink(ctx context.Context, name string, d blob.Digest) error {
	if err := check(ctx, name); err != nil {
		return wrap("unlink", name, d, err)
	}
	return wrap("unlink", name, d, r.l.Unlink(ctx, name, d))
}

// absent explains a miss: ErrNotFound if the namespace is gone, else nil.
func (r *SQL) absent(ctx context.Context, name string) error {
	ok, err := r.l.Exists(ctx, name)
	switch {
	case err != nil:
		return err
	case !ok:
		return ErrNotFound
	}
	return nil
}

// Has implements Registry.
func (r *SQL) Has(ctx context.Context, name string, d blob.Digest) (Ref, bool, error) {
	if err := check(ctx, name); err != nil {
		return Ref{}, false, wrap("has", name, d, err)
	}
	ref, ok, err := r.l.Has(ctx, name, d)
	if err == nil && !ok {
		err = r.absent(ctx, name)
	}
	return ref, ok, wrap("has", name, d, err)
}

// HasMany implements Registry.
func (r *SQL) HasMany(ctx context.Context, name string, ds []blob.Digest) ([]bool, error) {
	if err := check(ctx, name); err != nil {
		return nil, wrap("has", name, blob.Digest{}, err)
	}
	found, err := r.l.HasMany(ctx, name, ds)
	if err != nil {
		return nil, wrap("has", name, blob.Digest{}, err)
	}
	out := make([]bool, len(ds))
	for i, d := range ds {
		out[i] = found[d]
	}
	if len(found) == 0 {
		// Nothing found: the namespace may be absent.
		if err := r.absent(ctx, name); err != nil {
			return nil, wrap("has", name, blob.Digest{}, err)
		}
	}
	return out, nil
}

// Count implements Registry. It counts the namespace's primary-key range,
// O(references); see the package doc.
func (r *SQL) Count(ctx context.Context, name string) (int64, error) {
	if err := check(ctx, name); err != nil {
		return 0, wrap("count", name, blob.Digest{}, err)
	}
	n, err := r.l.Count(ctx, name)
	if err == nil && n == 0 {
		err = r.absent(ctx, name)
	}
	return n, wrap("count", name, blob.Digest{}, err)
}

// Entries implements Registry.
func (r *SQL) Entries(ctx context.Context, name string, after blob.Digest) iter.Seq2[Ref, error] {
	if err := ValidName(name); err != nil {
		return fail[Ref](wrap("entries", name, blob.Digest{}, err))
	}
	return paged(ctx, "entries", name, func(first bool, last Ref) ([]Ref, error) {
		if !first {
			return r.l.EntriesPage(ctx, name, &last.Digest, pageSize)
		}
		out, err := r.l.EntriesPage(ctx, name, from(after), pageSize)
		if err == nil && len(out) == 0 {
			err = r.absent(ctx, name)
		}
		return out, err
	})
}

// from is where a listing that starts after d begins: the zero digest
// lists from the start, itself included.
func from(d blob.Digest) *blob.Digest {
	if d.IsZero() {
		return nil
	}
	return &d
}

// IsLive implements gc.Source with one index probe on ns_refs(digest) and,
// if that misses, one on ns_pending(digest).
func (r *SQL) IsLive(ctx context.Context, d blob.Digest) (bool, error) {
	ok, err := r.l.IsLive(ctx, d)
	return ok, wrap("islive", "", d, err)
}

// LiveAmong implements gc.BatchSource: which of ds any namespace
// references or pends, in one query.
func (r *SQL) LiveAmong(ctx context.Context, ds []blob.Digest) (map[blob.Digest]bool, error) {
	live, err := r.l.LiveAmong(ctx, ds)
	return live, wrap("islive", "", blob.Digest{}, err)
}

// Shared implements gc.SharedSource: the references and intents, which
// the host reads inside its arbitration transaction (meta.Links), so that
// a link committed by any process before the arbitration's key locks
// were granted is seen.
func (r *SQL) Shared() meta.Liveness { return r.l }

// Live implements gc.Source: the digests references and intents name,
// paged by key.
func (r *SQL) Live(ctx context.Context) iter.Seq2[blob.Digest, error] {
	return paged(ctx, "live", "", func(first bool, last blob.Digest) ([]blob.Digest, error) {
		if first {
			return r.l.LivePage(ctx, nil, pageSize)
		}
		return r.l.LivePage(ctx, &last, pageSize)
	})
}

// Pend implements Registry, in its own transaction. When the intent was
// written and the COMMIT then failed, Pend returns the intent with the
// error: the COMMIT may have reached the server and its answer been lost
// (a connection reset), so the row may exist. The caller, which reports
// the failure, drops it (Lease.Abandon); otherwise it would stay pending
// under a live holder, renewed, and be linked at the lease's Close — a
// close that failed published at unmount.
func (r *SQL) Pend(ctx context.Context, name string, d blob.Digest, p Pending) (Intent, error) {
	if err := checkPend(ctx, name, p); err != nil {
		return 0, wrap("pend", name, d, err)
	}
	i, err := r.l.Pend(ctx, name, d, p.row())
	return Intent(i), wrap("pend", name, d, err)
}

// checkPend refuses an intent with a bad name, no holder or a negative
// size.
func checkPend(ctx context.Context, name string, p Pending) error {
	if err := check(ctx, name); err != nil {
		return err
	}
	if p.Holder == "" {
		return errors.New("an intent needs a holder")
	}
	return checkSize(p.Size)
}

// row is p as meta records it.
func (p Pending) row() meta.NSIntent {
	return meta.NSIntent{ID: int64(p.ID), Holder: p.Holder, TTL: p.TTL, Replaces: int64(p.Replaces), Size: p.Size}
}

// Settle implements Registry.
func (r *SQL) Settle(ctx context.Context, i Intent) (bool, error) {
	linked, err := r.l.Settle(ctx, int64(i))
	return linked, wrap("settle", "", blob.Digest{}, err)
}

// Cancel implements Registry, in its own transaction.
func (r *SQL) Cancel(ctx context.Context, i Intent) error {
	return wrap("cancel", "", blob.Digest{}, r.l.Cancel(ctx, int64(i)))
}

// Renew implements Registry.
func (r *SQL) Renew(ctx context.Context, holder string, ttl time.Duration) error {
	return wrap("renew", "", blob.Digest{}, r.l.Renew(ctx, holder, ttl))
}

// Recover implements Registry, in one transaction (one statement on
// PostgreSQL). Lapse is judged on the row clock; the references it makes
// are stamped with the registry's Clock.
func (r *SQL) Recover(ctx context.Context, holder string) (int, error) {
	n, err := r.l.Recover(ctx, holder)
	if err != nil {
		return 0, wrap("recover", "", blob.Digest{}, err)
	}
	return n, nil
}

// Holders implements Registry.
func (r *SQL) Holders(ctx context.Context) ([]string, error) {
	h, err := r.l.Holders(ctx)
	if err != nil {
		return nil, wrap("holders", "", blob.Digest{}, err)
	}
	return h, nil
}

// Usage implements Registry.
func (r *SQL) Usage(ctx context.Context, name string) (Usage, error) {
	if err := check(ctx, name); err != nil {
		return Usage{}, wrap("usage", name, blob.Digest{}, err)
	}
	u, err := r.l.Usage(ctx, name)
	return u, wrap("usage", name, blob.Digest{}, err)
}

// Unique implements Registry.
func (r *SQL) Unique(ctx context.Context, name string) (UniqueUsage, error) {
	if err := check(ctx, name); err != nil {
		return UniqueUsage{}, wrap("unique usage", name, blob.Digest{}, err)
	}
	u, err := r.l.Unique(ctx, name)
	if err != nil {
		return UniqueUsage{}, wrap("unique usage", name, blob.Digest{}, err)
	}
	return u, nil
}

// SetQuota implements Registry.
func (r *SQL) SetQuota(ctx context.Context, name string, q Quota) error {
	if err := check(ctx, name); err != nil {
		return wrap("set quota", name, blob.Digest{}, err)
	}
	if err := q.Check(); err != nil {
		return wrap("set quota", name, blob.Digest{}, err)
	}
	return wrap("set quota", name, blob.Digest{}, r.l.SetQuota(ctx, name, q))
}

// Recount implements Registry: per namespace, one transaction that locks
// its row, counts the digests its rows hold and fixes the counters if
// they differ.
func (r *SQL) Recount(ctx context.Context) (int, error) {
	if err := r.l.UsageKept(); err != nil {
		return 0, wrap("recount", "", blob.Digest{}, err)
	}
	fixed := 0
	for name, err := range r.Names(ctx, "") {
		if err != nil {
			return fixed, wrap("recount", "", blob.Digest{}, err)
		}
		ok, err := r.l.Recount(ctx, name)
		if err != nil {
			return fixed, wrap("recount", name, blob.Digest{}, err)
		}
		if ok {
			fixed++
		}
	}
	return fixed, nil
}

// unsizedPage returns up to n digests, after `after` in ascending order,
// that a reference or an intent made before sizes were kept names.
func (r *SQL) unsizedPage(ctx context.Context, after blob.Digest, n int) ([]blob.Digest, error) {
	return r.l.UnsizedPage(ctx, from(after), n)
}

// setSize records d's size in the rows that lack it.
func (r *SQL) setSize(ctx context.Context, d blob.Digest, size int64) error {
	return r.l.SetSize(ctx, d, size)
}
