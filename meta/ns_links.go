package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// Link links d into the namespace in a transaction of its own, charging
// size if the namespace does not hold d yet (linkTx). Over the
// namespace's quota it fails with an error from QuotaError (wrapping
// blob.ErrQuota) and writes nothing.
func (l *Links) Link(ctx context.Context, name string, d blob.Digest, size int64) (bool, error) {
	if err := l.writable(); err != nil {
		return false, err
	}
	var linked bool
	err := l.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		linked, err = l.linkTx(ctx, tx, name, d, size, false)
		return err
	})
	return linked, err
}

// linkTx links d in tx, charging size if the namespace does not hold d
// yet (ns_usage.go): lock the namespace's row, look, admit, insert,
// count. admitted: the quota was judged already (a journaled put's,
// when the namespace had none: journal.go), and is not judged again.
func (l *Links) linkTx(ctx context.Context, tx *sql.Tx, name string, d blob.Digest, size int64, admitted bool) (bool, error) {
	u, err := l.lockNS(ctx, tx, name)
	if err != nil {
		return false, l.linkFailed(ctx, name, err)
	}
	held, err := l.isHeld(ctx, tx, name, d)
	if err != nil {
		return false, err
	}
	if !held && !admitted {
		if err := u.admit(1, size); err != nil {
			return false, err
		}
	}
	res, err := l.txExec(ctx, tx, l.linkStmt, l.q.linkIf, name, d[:], l.wall().UnixNano(), size, name)
	if err != nil {
		return false, l.linkFailed(ctx, name, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	if n == 1 && !held {
		if err := l.chargeTx(ctx, tx, name, 1, size); err != nil {
			return false, err
		}
	}
	return n == 1, nil
}

// linkFailed turns an insert's foreign-key violation (the namespace was
// removed concurrently, PostgreSQL only) into ErrNSNotFound. It re-checks
// outside the transaction, which a failed statement may have aborted.
func (l *Links) linkFailed(ctx context.Context, name string, err error) error {
	if errors.Is(err, ErrNSNotFound) {
		return err
	}
	if ok, cerr := l.exists(ctx, l.db, name); cerr == nil && !ok {
		return ErrNSNotFound
	}
	return err
}

// LinkMany links every digest of ds (sorted and deduplicated here) in one
// transaction, which locks the namespace's row, inserts linkBatch rows per
// INSERT, charges the digests the inserts added (RETURNING) less those an
// intent of the namespace held already, and admits that charge against
// the quota before it commits: a refusal rolls every insert back. The
// reference rows it did not insert (ON CONFLICT DO NOTHING) were held
// already and cost nothing, so no digest is looked up before its insert.
// It returns how many references it added.
func (l *Links) LinkMany(ctx context.Context, name string, ds []Sized) (int, error) {
	if err := l.writable(); err != nil {
		return 0, err
	}
	now := l.wall().UnixNano()
	// Inserting in key order turns random B-tree inserts into near-appends
	// on both the primary key and the digest index: 2.5× faster for random
	// batches on SQLite, 10× when the caller's batches are ordered too.
	ds = slices.Clone(ds)
	slices.SortFunc(ds, func(a, b Sized) int { return a.Digest.Compare(b.Digest) })
	ds = slices.CompactFunc(ds, func(a, b Sized) bool { return a.Digest == b.Digest })
	total := 0
	err := l.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		total = 0
		u, err := l.lockNS(ctx, tx, name)
		if err != nil {
			return err
		}
		var full *sql.Stmt
		if len(ds) >= linkBatch {
			st, err := tx.PrepareContext(ctx, l.q.linkRows)
			if err != nil {
				return err
			}
			defer st.Close()
			full = st
		}
		var added []Sized // in key order: each INSERT's rows are
		args := make([]any, 0, 4*linkBatch)
		for rest := ds; len(rest) > 0; {
			k := min(len(rest), linkBatch)
			args = args[:0]
			for i := range rest[:k] {
				args = append(args, name, rest[i].Digest[:], now, rest[i].Size)
			}
			q := ""
			if k < linkBatch {
				q = linkRowsQuery(l.dialect, k)
			}
			if added, err = l.linkRowsQuery(ctx, tx, full, q, args, added); err != nil {
				return l.linkFailed(ctx, name, err)
			}
			rest = rest[k:]
		}
		total = len(added)
		blobs, bytes, err := l.chargeOfAdded(ctx, tx, name, added)
		if err != nil || blobs == 0 {
			return err
		}
		if err := u.admit(blobs, bytes); err != nil {
			return err
		}
		return l.chargeTx(ctx, tx, name, blobs, bytes)
	})
	if err != nil {
		return 0, err
	}
	return total, nil
}

// linkRowsQuery runs one multi-row link statement (st, or q when st is
// nil or q is set) and appends the references it added, with their
// sizes, to added.
func (l *Links) linkRowsQuery(ctx context.Context, tx *sql.Tx, st *sql.Stmt, q string, args []any, added []Sized) ([]Sized, error) {
	var rows *sql.Rows
	var err error
	if q != "" {
		rows, err = tx.QueryContext(ctx, q, args...)
	} else {
		rows, err = st.QueryContext(ctx, args...)
	}
	if err != nil {
		return added, err
	}
	for rows.Next() {
		var b []byte
		var size sql.NullInt64
		if err := rows.Scan(&b, &size); err != nil {
			rows.Close()
			return added, err
		}
		d, err := blob.FromBytes(b)
		if err != nil {
			rows.Close()
			return added, err
		}
		added = append(added, Sized{Digest: d, Size: size.Int64})
	}
	return added, errors.Join(rows.Err(), rows.Close())
}

// chargeOfAdded returns what the references added (new to ns_refs) cost
// the namespace: each one's blob and size, except where an intent of the
// namespace already named the digest (held through it). The namespace's
// intents are few (the files being written), so this looks among them
// only when there are any.
func (l *Links) chargeOfAdded(ctx context.Context, tx *sql.Tx, name string, added []Sized) (blobs, bytes int64, err error) {
	for _, a := range added {
		blobs, bytes = blobs+1, bytes+a.Size
	}
	if len(added) == 0 {
		return 0, 0, nil
	}
	var some bool
	if err := tx.QueryRowContext(ctx, l.q.anyPending, name).Scan(&some); err != nil || !some {
		return blobs, bytes, err
	}
	size := make(map[blob.Digest]int64, len(added))
	for _, a := range added {
		size[a.Digest] = a.Size
	}
	for lo := 0; lo < len(added); lo += hasManyBatch {
		batch := added[lo:min(len(added), lo+hasManyBatch)]
		args := make([]any, 0, len(batch)+1)
		args = append(args, name)
		for _, a := range batch {
			args = append(args, a.Digest[:])
		}
		rows, err := tx.QueryContext(ctx, pendingAmongQuery(l.dialect, len(batch)), args...)
		if err != nil {
			return 0, 0, err
		}
		err = engines.ScanDigests(rows, func(d blob.Digest) { blobs, bytes = blobs-1, bytes-size[d] })
		if err := errors.Join(err, rows.Close()); err != nil {
			return 0, 0, err
		}
	}
	return blobs, bytes, nil
}

// inTx is write, eager. f gets the context to use, which on SQLite is the
// Batcher's: a caller canceled midway must not interrupt a statement of a
// transaction other writers share (Batcher).
func (l *Links) inTx(ctx context.Context, f func(ctx context.Context, tx *sql.Tx) error) error {
	return l.write(ctx, false, f)
}

// write runs fn in a write transaction (Write: through the
// engine's Batcher when it has one, lazily if asked).
func (l *Links) write(ctx context.Context, lazy bool, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return Write(ctx, l.batch, l.db, lazy, fn)
}

// Unlink drops the namespace's reference to d and frees its charge unless
// an intent of the namespace still names d. blob.ErrMissing if there is no
// such reference, ErrNSNotFound if no such namespace.
func (l *Links) Unlink(ctx context.Context, name string, d blob.Digest) error {
	if err := l.writable(); err != nil {
		return err
	}
	return l.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := l.lockNS(ctx, tx, name); err != nil {
			return err
		}
		var size sql.NullInt64
		var note string
		err := tx.QueryRowContext(ctx, l.q.takeRef, name, d[:]).Scan(&size, &note)
		if errors.Is(err, sql.ErrNoRows) {
			return blob.ErrMissing
		}
		if err != nil {
			return err
		}
		held, err := l.pendHeld(ctx, tx, name, d)
		if err != nil || held {
			return err
		}
		return l.chargeTx(ctx, tx, name, -1, -size.Int64)
	})
}

// Has returns the namespace's reference to d; ok is false when there is
// none (whether or not the namespace exists: see Exists).
func (l *Links) Has(ctx context.Context, name string, d blob.Digest) (Ref, bool, error) {
	if err := l.batch.Visible(ctx); err != nil {
		return Ref{}, false, err
	}
	var at int64
	err := l.db.QueryRowContext(ctx, l.q.has, name, d[:]).Scan(&at)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Ref{}, false, nil
	case err != nil:
		return Ref{}, false, err
	}
	return Ref{Digest: d, LinkedAt: time.Unix(0, at)}, true, nil
}

// hasManyBatch bounds the IN list of one HasMany query.
const hasManyBatch = 500

// HasMany returns which digests of ds the namespace references, with
// IN-list queries of up to hasManyBatch digests.
func (l *Links) HasMany(ctx context.Context, name string, ds []blob.Digest) (map[blob.Digest]bool, error) {
	if err := l.batch.Visible(ctx); err != nil {
		return nil, err
	}
	found := make(map[blob.Digest]bool, len(ds))
	for lo := 0; lo < len(ds); lo += hasManyBatch {
		batch := ds[lo:min(len(ds), lo+hasManyBatch)]
		args := make([]any, 0, len(batch)+1)
		args = append(args, name)
		for _, d := range batch {
			args = append(args, d[:])
		}
		rows, err := l.db.QueryContext(ctx, refsAmongQuery(l.dialect, len(batch)), args...)
		if err != nil {
			return nil, err
		}
		err = engines.ScanDigests(rows, func(d blob.Digest) { found[d] = true })
		if err := errors.Join(err, rows.Close()); err != nil {
			return nil, err
		}
	}
	return found, nil
}

// Count counts the namespace's references: its primary-key range,
// O(references).
func (l *Links) Count(ctx context.Context, name string) (int64, error) {
	if err := l.batch.Visible(ctx); err != nil {
		return 0, err
	}
	var n int64
	err := l.db.QueryRowContext(ctx, l.q.count, name).Scan(&n)
	return n, err
}

// EntriesPage returns up to n of the namespace's references in ascending
// digest order, after *after (nil: from the start).
func (l *Links) EntriesPage(ctx context.Context, name string, after *blob.Digest, n int) ([]Ref, error) {
	if err := l.batch.Visible(ctx); err != nil {
		return nil, err
	}
	rows, err := l.db.QueryContext(ctx, l.q.entries, name, nsKey(after), n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]Ref, 0, n)
	for rows.Next() {
		var b []byte
		var at int64
		if err := rows.Scan(&b, &at); err != nil {
			return nil, err
		}
		d, err := blob.FromBytes(b)
		if err != nil {
			return nil, err
		}
		out = append(out, Ref{Digest: d, LinkedAt: time.Unix(0, at)})
	}
	return out, rows.Err()
}

// IsLive reports whether a reference or an intent names d: one index
// probe on ns_refs(digest) and, if that misses, one on
// ns_pending(digest).
func (l *Links) IsLive(ctx context.Context, d blob.Digest) (bool, error) {
	if err := l.batch.Visible(ctx); err != nil {
		return false, err
	}
	var one int
	err := l.db.QueryRowContext(ctx, l.q.isLive, d[:], d[:]).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// LiveAmong returns which of ds a reference or an intent names, in one
// query.
func (l *Links) LiveAmong(ctx context.Context, ds []blob.Digest) (map[blob.Digest]bool, error) {
	if err := l.batch.Visible(ctx); err != nil {
		return nil, err
	}
	return l.liveAmong(ctx, l.db, ds)
}

// liveAmongTx implements Liveness: LiveAmong inside an arbitration's
// transaction tx (Host.Arbitrate), so that a link committed by any process
// before the arbitration's key locks were granted is seen.
// Its errors name the engine and the operation, as namespaces.SQL's
// (which wraps LiveAmong's) do: no registry stands between it and the
// collector.
func (l *Links) liveAmongTx(ctx context.Context, tx *sql.Tx, ds []blob.Digest) (map[blob.Digest]bool, error) {
	live, err := l.liveAmong(ctx, tx, ds)
	if err != nil {
		return nil, fmt.Errorf("namespaces of %s: islive (references and intents of %d digests): %w", l.name, len(ds), err)
	}
	return live, nil
}

func (l *Links) liveAmong(ctx context.Context, q engines.Querier, ds []blob.Digest) (map[blob.Digest]bool, error) {
	live := make(map[blob.Digest]bool)
	if len(ds) == 0 {
		return live, nil
	}
	args := make([]any, 2*len(ds))
	for i, d := range ds {
		args[i], args[len(ds)+i] = d[:], d[:]
	}
	rows, err := q.QueryContext(ctx, liveAmongQuery(l.dialect, len(ds)), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	if err := engines.ScanDigests(rows, func(d blob.Digest) { live[d] = true }); err != nil {
		return nil, err
	}
	return live, nil
}

// liveAmongQuery selects which of n digests (each given twice: the refs'
// list, then the intents') a reference or an intent names, with a probe
// of ns_refs(digest) and one of ns_pending(digest) per digest.
func liveAmongQuery(dialect string, n int) string {
	in := inList(n)
	return rebindNS(dialect, "SELECT digest FROM ns_refs WHERE digest IN "+in+" UNION SELECT digest FROM ns_pending WHERE digest IN "+in)
}

// LivePage returns up to n digests, ascending after *after (nil: from the
// start), that a reference or an intent names: the union of the
// ns_refs(digest) and ns_pending(digest) indexes, by key.
func (l *Links) LivePage(ctx context.Context, after *blob.Digest, n int) ([]blob.Digest, error) {
	if err := l.batch.Visible(ctx); err != nil {
		return nil, err
	}
	from := nsKey(after)
	rows, err := l.db.QueryContext(ctx, l.q.live, from, from, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]blob.Digest, 0, n)
	err = engines.ScanDigests(rows, func(d blob.Digest) { out = append(out, d) })
	return out, err
}

// UnsizedPage returns up to n digests, after *after in ascending order
// (nil: from the start), that a reference or an intent made before sizes
// were kept names.
func (l *Links) UnsizedPage(ctx context.Context, after *blob.Digest, n int) ([]blob.Digest, error) {
	rows, err := l.db.QueryContext(ctx, l.q.unsized, nsKey(after), nsKey(after), n)
	if err != nil {
		return nil, err
	}
	var out []blob.Digest
	err = engines.ScanDigests(rows, func(d blob.Digest) { out = append(out, d) })
	return out, errors.Join(err, rows.Close())
}

// SetSize records d's size in the rows that lack it.
func (l *Links) SetSize(ctx context.Context, d blob.Digest, size int64) error {
	return l.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		for _, q := range []string{l.q.refsSetSize, l.q.pendingSetSize} {
			if _, err := tx.ExecContext(ctx, q, size, d[:]); err != nil {
				return err
			}
		}
		return nil
	})
}
