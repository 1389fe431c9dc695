package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/alkblobfs/alkblobfs/blob"
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

// Quota is a namespace's limit: at most Bytes logical bytes and Blobs
// distinct digests, linked or pending. Zero means no limit on that
// measure; the zero Quota is none at all. Package namespaces sets it
// (namespaces.Quota); the statements here and the mem registry apply it,
// alike, through Fits.
type Quota struct {
	Bytes, Blobs int64
}

// Check refuses a negative limit.
func (q Quota) Check() error {
	if q.Bytes < 0 || q.Blobs < 0 {
		return fmt.Errorf("negative quota (%d bytes, %d blobs); 0 means no limit", q.Bytes, q.Blobs)
	}
	return nil
}

// Fits reports whether usage of blobs and bytes is within q.
func (q Quota) Fits(blobs, bytes int64) bool {
	return (q.Blobs <= 0 || blobs <= q.Blobs) && (q.Bytes <= 0 || bytes <= q.Bytes)
}

// Usage is what a namespace holds, kept exactly (not estimated): a digest
// counts once per namespace whether it is linked, pending (an intent,
// from the close that recorded it), or both; a digest in two namespaces
// counts in both. Reading it costs one row, whatever the namespace's
// size.
type Usage struct {
	// Blobs is the number of distinct digests the namespace links or
	// pends; Bytes their logical sizes' sum.
	Blobs, Bytes int64
	// Quota is the namespace's limit (SetQuota); zero fields mean none.
	Quota Quota
}

// UniqueUsage is the part of a namespace's Usage that no other namespace
// links or pends: what removing the namespace would let sweeps free. It
// is computed when asked, from every reference and intent of the
// namespace (O(its rows)), not kept: a separate call so that the surfaces
// that run often (df, /metrics, a refused put's message) never pay for
// it.
type UniqueUsage struct {
	Blobs, Bytes int64
}

// Count says n of unit, for the messages that print usage: "1 blob",
// "0 blobs", "4096 bytes" (unit is the singular; its plural adds an s).
func Count(n int64, unit string) string {
	if n == 1 {
		return "1 " + unit
	}
	return fmt.Sprintf("%d %ss", n, unit)
}

// QuotaError is the error of a link or pend refused for q, with the
// namespace at u and growing by blobs and bytes: it wraps blob.ErrQuota
// and says which limit.
func QuotaError(q Quota, u Usage, blobs, bytes int64) error {
	switch {
	case q.Blobs > 0 && u.Blobs+blobs > q.Blobs:
		return fmt.Errorf("%w: %s + %d over the limit of %d", blob.ErrQuota, Count(u.Blobs, "blob"), blobs, q.Blobs)
	case q.Bytes > 0 && u.Bytes+bytes > q.Bytes:
		return fmt.Errorf("%w: %s + %d over the limit of %d", blob.ErrQuota, Count(u.Bytes, "byte"), bytes, q.Bytes)
	}
	return blob.ErrQuota
}

// nsUsageRow is a namespace's row as lockNS reads it.
type nsUsageRow struct {
	blobs, bytes int64
	quota        Quota
}

// admit returns nil if growing by blobs and bytes keeps the namespace
// within its quota, else QuotaError's.
func (u nsUsageRow) admit(blobs, bytes int64) error {
	if blobs == 0 || u.quota.Fits(u.blobs+blobs, u.bytes+bytes) {
		return nil
	}
	return QuotaError(u.quota, Usage{Blobs: u.blobs, Bytes: u.bytes}, blobs, bytes)
}

// txQueryRow is txExec for a statement that returns a row.
func (l *Links) txQueryRow(ctx context.Context, tx *sql.Tx, st *sql.Stmt, q string, args ...any) *sql.Row {
	if l.dialect == "postgres" || st == nil {
		return tx.QueryRowContext(ctx, q, args...)
	}
	return tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
}

// lockNS locks the namespace's row in tx (PostgreSQL; SQLite's write
// lock is the transaction's) and reads its counters and quota.
// ErrNSNotFound if the namespace is absent.
func (l *Links) lockNS(ctx context.Context, tx *sql.Tx, name string) (nsUsageRow, error) {
	var u nsUsageRow
	err := l.txQueryRow(ctx, tx, l.lockStmt, l.q.lockNS, name).Scan(&u.blobs, &u.bytes, &u.quota.Blobs, &u.quota.Bytes)
	if errors.Is(err, sql.ErrNoRows) {
		return u, ErrNSNotFound
	}
	return u, err
}

// isHeld reports whether the namespace links or pends d, read in tx after
// lockNS.
func (l *Links) isHeld(ctx context.Context, tx *sql.Tx, name string, d blob.Digest) (bool, error) {
	var held bool
	err := l.txQueryRow(ctx, tx, l.heldStmt, l.q.held, name, d[:], name, d[:]).Scan(&held)
	return held, err
}

// pendHeld reports whether an intent of the namespace names d.
func (l *Links) pendHeld(ctx context.Context, tx *sql.Tx, name string, d blob.Digest) (bool, error) {
	var held bool
	err := l.txQueryRow(ctx, tx, l.pendHeldStmt, l.q.pendHeld, name, d[:]).Scan(&held)
	return held, err
}

// chargeTx adds blobs and bytes (negative to free) to the namespace's
// counters in tx, which has locked its row.
func (l *Links) chargeTx(ctx context.Context, tx *sql.Tx, name string, blobs, bytes int64) error {
	_, err := l.txExec(ctx, tx, l.chargeStmt, l.q.charge, blobs, bytes, name)
	return err
}

// cancelTx drops intent id in tx and frees its charge if nothing else of
// its namespace names its digest. An intent already gone is not an error.
func (l *Links) cancelTx(ctx context.Context, tx *sql.Tx, id int64) error {
	var name string
	err := l.txQueryRow(ctx, tx, nil, l.q.intentNS, id).Scan(&name)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := l.lockNS(ctx, tx, name); err != nil {
		return err
	}
	var b []byte
	var size sql.NullInt64
	err = l.txQueryRow(ctx, tx, l.unpendStmt, l.q.takeIntent, id).Scan(&name, &b, &size)
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
	held, err := l.isHeld(ctx, tx, name, d)
	if err != nil || held {
		return err
	}
	return l.chargeTx(ctx, tx, name, -1, -size.Int64)
}

// Usage returns the namespace's counters and quota. ErrNSNotFound if it
// is absent.
func (l *Links) Usage(ctx context.Context, name string) (Usage, error) {
	if l.noUsage {
		return Usage{}, errNoUsage
	}
	if err := l.batch.Visible(ctx); err != nil {
		return Usage{}, err
	}
	var u Usage
	err := l.db.QueryRowContext(ctx, l.q.usage, name).Scan(&u.Blobs, &u.Bytes, &u.Quota.Blobs, &u.Quota.Bytes)
	if errors.Is(err, sql.ErrNoRows) {
		return Usage{}, ErrNSNotFound
	}
	return u, err
}

// Unique counts what the namespace alone holds. The namespace's row is
// read first, so that an absent namespace is ErrNSNotFound rather than
// zero figures.
func (l *Links) Unique(ctx context.Context, name string) (UniqueUsage, error) {
	if _, err := l.Usage(ctx, name); err != nil {
		return UniqueUsage{}, err
	}
	var u UniqueUsage
	err := l.db.QueryRowContext(ctx, l.q.unique, name, name, name, name).Scan(&u.Blobs, &u.Bytes)
	return u, err
}

// SetQuota records the namespace's quota (checked by the caller).
// ErrNSNotFound if it is absent.
func (l *Links) SetQuota(ctx context.Context, name string, q Quota) error {
	if l.noUsage {
		return errNoUsage
	}
	// The close journal judges its puts' quotas when it takes them: the
	// records taken before count in the usage the quota applies to, and
	// every put taken after this returns sees the new quota
	// (journal_guard.go).
	return l.journal().Guard(ctx, true, func() error { return l.updateNS(ctx, l.q.setQuota, q.Blobs, q.Bytes, name) })
}

// Recount fixes one namespace's counters from its rows, in one
// transaction that locks its row, and reports whether they were wrong. A
// namespace removed meanwhile is not an error.
func (l *Links) Recount(ctx context.Context, name string) (fixed bool, err error) {
	if l.noUsage {
		return false, errNoUsage
	}
	err = l.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		fixed = false
		u, err := l.lockNS(ctx, tx, name)
		if errors.Is(err, ErrNSNotFound) {
			return nil // removed since listed
		}
		if err != nil {
			return err
		}
		var blobs, bytes int64
		if err := tx.QueryRowContext(ctx, l.q.recount, name, name).Scan(&blobs, &bytes); err != nil {
			return err
		}
		if blobs == u.blobs && bytes == u.bytes {
			return nil
		}
		if _, err := tx.ExecContext(ctx, l.q.setUsage, blobs, bytes, name); err != nil {
			return err
		}
		fixed = true
		return nil
	})
	return fixed, err
}

// unlimited reports whether the namespace exists and has no quota, read
// outside any transaction: what lets the close journal take a put into it
// (journal.go). Not for PostgreSQL, which has no journal.
func (l *Links) unlimited(ctx context.Context, name string) (bool, error) {
	if l.noUsage || l.dialect != "sqlite" {
		return false, nil
	}
	var q Quota
	err := l.quotaStmt.QueryRowContext(ctx, name).Scan(&q.Blobs, &q.Bytes)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil && q == Quota{}, err
}
