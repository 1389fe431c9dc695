package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// The one-statement batch. Most batches' puts ask for nothing the batch
// statement cannot carry: a pin row and a namespace intent that replaces
// none (meta.NSRows.Batchable). Such a batch needs no transaction of its
// own — no BEGIN, no COMMIT, no statement per put: its statement alone
// is atomic, and it is one round trip and one transaction for the whole
// batch (before: BEGIN, an intent per put, the batch statement and
// COMMIT, a round trip each). Whether a batch is one is read off its
// puts' rows, which are values. A batch whose statement failed on the
// server (an intent for a namespace just removed fails its foreign key,
// one over its quota the statement's guard) committed nothing: it runs
// again in a transaction (attempt), and alone after that if the batch's
// transaction failed (putGroup), where meta's own statements report each
// put's error. A statement that failed otherwise — the connection reset,
// the op timeout — may have committed: every put of the batch fails, as
// at a failed COMMIT, and nothing runs again.

// fast runs jobs as a one-statement batch. It reports false, having
// changed nothing, when jobs need a transaction; true when it is done
// with them: committed, or failed with their fate unknown.
func (g *putGroup) fast(jobs []*putJob) bool {
	var pends []meta.IntentRow
	for _, j := range jobs {
		if !j.rows.NS.Batchable() {
			return false
		}
		if i := j.rows.NS.Intent; i != nil {
			pends = append(pends, *i)
		}
	}
	ctx := jobs[0].ctx
	inserted, err := g.e.insertBatch(ctx, nil, jobs, pinsOf(jobs), pends)
	var pe *pgconn.PgError
	switch {
	case err == nil:
	case errors.As(err, &pe) || pgconn.SafeToRetry(err):
		// The server refused the statement, or it was never sent:
		// nothing committed.
		return false
	default:
		for _, j := range jobs {
			j.err = err
		}
		return true
	}
	settled(jobs, inserted)
	g.fastBatches.Add(1)
	return true
}

// oneStatement runs a one-statement batch q on a pooled connection,
// calling got with each digest it returns. With names (the namespaces the
// batch's intents charge), it first locks their rows (meta.PGLockNamespaces), in one
// pgx batch with q: one network round trip and one implicit transaction,
// which commits at the batch's end (Sync) or, if either statement fails,
// rolls back.
//
// Why the lock: q charges each namespace against its counters and quota
// as read in its snapshot, and updates the ns row only if it is still
// that version (batchPendSQL). Without the lock, a batch overlapping
// another writer of its namespace — the other put runner of this mount,
// or another host's — failed that guard and ran again in a transaction,
// then put by put: four round trips a put. With the lock granted first,
// q's snapshot (READ COMMITTED: taken when q starts) sees the latest
// committed row, and no writer can change it before the commit, so the
// guard passes; overlapping batches wait for each other on the server, in
// the same round trip, instead of failing. Locks are taken namespaces
// first, then (in q) arbitration locks by digest, as the registry's
// transactions do: the GC's order (docs/gc.md) is unchanged.
func (e *Engine) oneStatement(ctx context.Context, q string, args []any, names []string, got func(blob.Digest)) error {
	if len(names) == 0 {
		rows, err := e.pool.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		return engines.ScanDigests(rows, got)
	}
	b := &pgx.Batch{}
	b.Queue(meta.PGLockNamespaces, names)
	b.Queue(q, args...)
	br := e.pool.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return err
	}
	rows, err := br.Query()
	if err == nil {
		err = engines.ScanDigests(rows, got)
		rows.Close()
	}
	if err != nil {
		br.Close()
		return err
	}
	// The commit: Close reads up to the end of the implicit transaction.
	return br.Close()
}

// reset readies jobs to run again from scratch.
func reset(jobs []*putJob) {
	for _, j := range jobs {
		j.err, j.inserted = nil, false
	}
}

// settled records which puts of a committed batch inserted their digest:
// the first put of a digest did; a repeat is a dedup.
func settled(jobs []*putJob, inserted map[blob.Digest]bool) {
	for _, j := range jobs {
		if inserted[j.d] {
			j.inserted = true
			delete(inserted, j.d)
		}
	}
}
