package namespaces

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// Usage on SQL: each ns row carries its namespace's counters (blobs,
// bytes) and quota (quota_blobs, quota_bytes), and each ns_refs and
// ns_pending row the size of its blob. A digest counts once per namespace
// while a reference or an intent of the namespace names it ("held"), so
// a write changes the counters only when it makes a digest held or
// unheld: a first link or intent charges, the last reference or intent
// to go frees, a settle (an intent becoming a reference) changes nothing.
//
// The counters change in the transaction that changes the rows, after the
// namespace's row is locked (lockNS): on PostgreSQL, FOR NO KEY UPDATE,
// which serializes every writer that may change what the namespace holds
// (links, intents, cancels, unlinks; settles and recoveries lock it in
// their statement) on every host, so that the check "is d held?", read by
// the next statement of the lock holder under READ COMMITTED, sees every
// such write committed before it; on SQLite the IMMEDIATE transaction
// serializes all writers already. The quota is checked against the
// counters read under that lock, so it holds exactly across hosts: no
// overshoot. The lock does not conflict with the foreign keys' KEY SHARE
// locks, so it orders only the writers of one namespace.

// takeRefReturning ends Unlink's statement: the size it frees, and a
// column that PostgreSQL's Watch fills with its notification
// (watch_postgres.go).
const takeRefReturning = ` RETURNING size, ''`

// nsUsageRow is a namespace's row as lockNS reads it.
type nsUsageRow struct {
	blobs, bytes int64
	quota        Quota
}

// admit returns nil if growing by blobs and bytes keeps the namespace
// within its quota, else an error wrapping blob.ErrQuota.
func (u nsUsageRow) admit(blobs, bytes int64) error {
	if blobs == 0 || u.quota.fits(u.blobs+blobs, u.bytes+bytes) {
		return nil
	}
	return errQuota(u.quota, Usage{Blobs: u.blobs, Bytes: u.bytes}, blobs, bytes)
}

func (q *queries) usageQueries(dialect string) {
	r := func(s string) string { return rebind(dialect, s) }
	lock := `SELECT blobs, bytes, quota_blobs, quota_bytes FROM ns WHERE name = ?`
	q.usage = r(lock)
	if dialect == "postgres" {
		lock += ` FOR NO KEY UPDATE`
	}
	q.lockNS = r(lock)
	q.held = r(`SELECT EXISTS (SELECT 1 FROM ns_refs WHERE ns = ? AND digest = ?) OR EXISTS (SELECT 1 FROM ns_pending WHERE ns = ? AND digest = ?)`)
	q.anyPending = r(`SELECT EXISTS (SELECT 1 FROM ns_pending WHERE ns = ?)`)
	q.pendHeld = r(`SELECT EXISTS (SELECT 1 FROM ns_pending WHERE ns = ? AND digest = ?)`)
	q.charge = r(`UPDATE ns SET blobs = blobs + ?, bytes = bytes + ? WHERE name = ?`)
	q.takeRef = r(`DELETE FROM ns_refs WHERE ns = ? AND digest = ?` + takeRefReturning)
	q.intentNS = r(`SELECT ns FROM ns_pending WHERE id = ?`)
	q.takeIntent = r(`DELETE FROM ns_pending WHERE id = ? RETURNING ns, digest, size`)
	// The digests a namespace holds, once each, with their size (a row
	// made before sizes were kept has none: it counts 0 bytes until
	// Service.FillSizes).
	held := `SELECT digest, max(size) AS size FROM (SELECT digest, size FROM ns_refs WHERE ns = ?
		UNION ALL SELECT digest, size FROM ns_pending WHERE ns = ?) h GROUP BY digest`
	q.recount = r(`SELECT count(*), coalesce(sum(size), 0) FROM (` + held + `) t`)
	q.unique = r(`SELECT count(*), coalesce(sum(size), 0) FROM (` + held + `) t
		WHERE NOT EXISTS (SELECT 1 FROM ns_refs o WHERE o.digest = t.digest AND o.ns <> ?)
		AND NOT EXISTS (SELECT 1 FROM ns_pending o WHERE o.digest = t.digest AND o.ns <> ?)`)
	q.setQuota = r(`UPDATE ns SET quota_blobs = ?, quota_bytes = ? WHERE name = ?`)
	q.setUsage = r(`UPDATE ns SET blobs = ?, bytes = ? WHERE name = ?`)
}

// txQueryRow is txExec for a statement that returns a row.
func (r *SQL) txQueryRow(ctx context.Context, tx *sql.Tx, st *sql.Stmt, q string, args ...any) *sql.Row {
	if r.dialect == "postgres" || st == nil {
		return tx.QueryRowContext(ctx, q, args...)
	}
	return tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
}

// lockNS locks the namespace's row in tx (PostgreSQL; SQLite's write
// lock is the transaction's) and reads its counters and quota.
// ErrNotFound if the namespace is absent.
func (r *SQL) lockNS(ctx context.Context, tx *sql.Tx, name string) (nsUsageRow, error) {
	var u nsUsageRow
	err := r.txQueryRow(ctx, tx, r.lockStmt, r.q.lockNS, name).Scan(&u.blobs, &u.bytes, &u.quota.Blobs, &u.quota.Bytes)
	if errors.Is(err, sql.ErrNoRows) {
		return u, ErrNotFound
	}
	return u, err
}

// isHeld reports whether the namespace links or pends d, read in tx after
// lockNS.
func (r *SQL) isHeld(ctx context.Context, tx *sql.Tx, name string, d blob.Digest) (bool, error) {
	var held bool
	err := r.txQueryRow(ctx, tx, r.heldStmt, r.q.held, name, d[:], name, d[:]).Scan(&held)
	return held, err
}

// pendHeld reports whether an intent of the namespace names d.
func (r *SQL) pendHeld(ctx context.Context, tx *sql.Tx, name string, d blob.Digest) (bool, error) {
	var held bool
	err := r.txQueryRow(ctx, tx, r.pendHeldStmt, r.q.pendHeld, name, d[:]).Scan(&held)
	return held, err
}

// chargeTx adds blobs and bytes (negative to free) to the namespace's
// counters in tx, which has locked its row.
func (r *SQL) chargeTx(ctx context.Context, tx *sql.Tx, name string, blobs, bytes int64) error {
	_, err := r.txExec(ctx, tx, r.chargeStmt, r.q.charge, blobs, bytes, name)
	return err
}

// cancelTx drops intent i in tx and frees its charge if nothing else of
// its namespace names its digest. An intent already gone is not an error.
func (r *SQL) cancelTx(ctx context.Context, tx *sql.Tx, i Intent) error {
	var name string
	err := r.txQueryRow(ctx, tx, nil, r.q.intentNS, int64(i)).Scan(&name)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := r.lockNS(ctx, tx, name); err != nil {
		return err
	}
	var b []byte
	var size sql.NullInt64
	err = r.txQueryRow(ctx, tx, r.unpendStmt, r.q.takeIntent, int64(i)).Scan(&name, &b, &size)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // settled or canceled since it was read
	}
	if err != nil {
		return err
	}
	d, err := blob.FromBytes(b)
	if err != nil {
		return err
	}
	held, err := r.isHeld(ctx, tx, name, d)
	if err != nil || held {
		return err
	}
	return r.chargeTx(ctx, tx, name, -1, -size.Int64)
}

// Usage implements Registry.
func (r *SQL) Usage(ctx context.Context, name string) (Usage, error) {
	if err := check(ctx, name); err != nil {
		return Usage{}, wrap("usage", name, blob.Digest{}, err)
	}
	if r.noUsage {
		return Usage{}, wrap("usage", name, blob.Digest{}, errNoUsage)
	}
	var u Usage
	err := r.db.QueryRowContext(ctx, r.q.usage, name).Scan(&u.Blobs, &u.Bytes, &u.Quota.Blobs, &u.Quota.Bytes)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Usage{}, wrap("usage", name, blob.Digest{}, ErrNotFound)
	case err != nil:
		return Usage{}, wrap("usage", name, blob.Digest{}, err)
	}
	return u, nil
}

// Unique implements Registry. The namespace's row is read first, so that
// an absent namespace is ErrNotFound rather than zero figures.
func (r *SQL) Unique(ctx context.Context, name string) (UniqueUsage, error) {
	if err := check(ctx, name); err != nil {
		return UniqueUsage{}, wrap("unique usage", name, blob.Digest{}, err)
	}
	if r.noUsage {
		return UniqueUsage{}, wrap("unique usage", name, blob.Digest{}, errNoUsage)
	}
	var row nsUsageRow
	err := r.db.QueryRowContext(ctx, r.q.usage, name).Scan(&row.blobs, &row.bytes, &row.quota.Blobs, &row.quota.Bytes)
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	var u UniqueUsage
	if err == nil {
		err = r.db.QueryRowContext(ctx, r.q.unique, name, name, name, name).Scan(&u.Blobs, &u.Bytes)
	}
	if err != nil {
		return UniqueUsage{}, wrap("unique usage", name, blob.Digest{}, err)
	}
	return u, nil
}

// errNoUsage: an older store opened on read-only media has no usage
// columns, and cannot be given them.
var errNoUsage = fmt.Errorf("%w: the store predates namespace usage; open it writable once to add it", blob.ErrReadOnly)

// SetQuota implements Registry.
func (r *SQL) SetQuota(ctx context.Context, name string, q Quota) error {
	if err := check(ctx, name); err != nil {
		return wrap("set quota", name, blob.Digest{}, err)
	}
	if err := q.check(); err != nil {
		return wrap("set quota", name, blob.Digest{}, err)
	}
	if r.noUsage {
		return wrap("set quota", name, blob.Digest{}, errNoUsage)
	}
	res, err := r.db.ExecContext(ctx, r.q.setQuota, q.Blobs, q.Bytes, name)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil {
		return wrap("set quota", name, blob.Digest{}, err)
	}
	if n == 0 {
		return wrap("set quota", name, blob.Digest{}, ErrNotFound)
	}
	return nil
}

// Recount implements Registry: per namespace, one transaction that locks
// its row, counts the digests its rows hold and fixes the counters if
// they differ.
func (r *SQL) Recount(ctx context.Context) (int, error) {
	if r.noUsage {
		return 0, wrap("recount", "", blob.Digest{}, errNoUsage)
	}
	fixed := 0
	for name, err := range r.Names(ctx, "") {
		if err != nil {
			return fixed, wrap("recount", "", blob.Digest{}, err)
		}
		err := r.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			u, err := r.lockNS(ctx, tx, name)
			if errors.Is(err, ErrNotFound) {
				return nil // removed since listed
			}
			if err != nil {
				return err
			}
			var blobs, bytes int64
			if err := tx.QueryRowContext(ctx, r.q.recount, name, name).Scan(&blobs, &bytes); err != nil {
				return err
			}
			if blobs == u.blobs && bytes == u.bytes {
				return nil
			}
			if _, err := tx.ExecContext(ctx, r.q.setUsage, blobs, bytes, name); err != nil {
				return err
			}
			fixed++
			return nil
		})
		if err != nil {
			return fixed, wrap("recount", name, blob.Digest{}, err)
		}
	}
	return fixed, nil
}

// unsizedPage returns up to n digests, after `after` in ascending order,
// that a reference or an intent made before sizes were kept names.
func (r *SQL) unsizedPage(ctx context.Context, after blob.Digest, n int) ([]blob.Digest, error) {
	q := rebind(r.dialect, `SELECT digest FROM ns_refs WHERE size IS NULL AND digest > ?
		UNION SELECT digest FROM ns_pending WHERE size IS NULL AND digest > ? ORDER BY 1 LIMIT ?`)
	rows, err := r.db.QueryContext(ctx, q, key(after), key(after), n)
	if err != nil {
		return nil, err
	}
	var out []blob.Digest
	err = engines.ScanDigests(rows, func(d blob.Digest) { out = append(out, d) })
	return out, errors.Join(err, rows.Close())
}

// setSize records d's size in the rows that lack it.
func (r *SQL) setSize(ctx context.Context, d blob.Digest, size int64) error {
	return r.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		for _, table := range []string{"ns_refs", "ns_pending"} {
			if _, err := tx.ExecContext(ctx, rebind(r.dialect, `UPDATE `+table+` SET size = ? WHERE digest = ? AND size IS NULL`), size, d[:]); err != nil {
				return err
			}
		}
		return nil
	})
}
