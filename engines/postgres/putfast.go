package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// The one-statement batch. Most batches' puts ask for nothing the batch
// statement cannot carry: a pin row (PinRows) and a namespace intent
// (DeferPend). Such a batch needs no transaction of its own — no BEGIN, no
// COMMIT, no statement per put: its statement alone is atomic, and it is
// one round trip and one transaction for the whole batch (before: BEGIN,
// an intent per put, the batch statement and COMMIT, a round trip each).
//
// To learn whether a batch is such a batch, its jobs run first against a
// probe: a database/sql transaction on an in-process driver that runs no
// statement. PinRows and DeferPend recognize the probe's transaction as the
// batch's (batchOf) and add their rows to it; any statement a job runs on
// it fails (errDeferOnly), and so does the job. A job that fails there,
// for that or any reason, sends the whole batch to the transaction of
// attempt, where it runs again from scratch, and alone after that if the
// batch's transaction failed (putGroup): a job may run three times. So does a batch whose statement failed on the server (an
// intent for a namespace just removed fails its foreign key): that
// statement committed nothing. A statement that failed otherwise — the
// connection reset, the op timeout — may have committed: every put of the
// batch fails, as at a failed COMMIT, and nothing runs again.

// errDeferOnly is what a statement run on the probe's transaction gets.
var errDeferOnly = errors.New("postgres: a statement in a put's transaction that the batch statement cannot carry")

// probeDB opens the probe: a database/sql pool over probeConn.
func probeDB() *sql.DB {
	db := sql.OpenDB(probeConn{})
	db.SetMaxIdleConns(2 * putRunners)
	return db
}

// probeConn is a driver connection, and its connector and transaction,
// that runs nothing: Prepare fails, and database/sql prepares every
// statement it runs on a connection that has no Exec or Query of its own.
type probeConn struct{}

func (probeConn) Connect(context.Context) (driver.Conn, error) { return probeConn{}, nil }
func (probeConn) Driver() driver.Driver                        { return probeConn{} }
func (probeConn) Open(string) (driver.Conn, error)             { return probeConn{}, nil }
func (probeConn) Prepare(string) (driver.Stmt, error)          { return nil, errDeferOnly }
func (probeConn) Close() error                                 { return nil }
func (probeConn) Begin() (driver.Tx, error)                    { return probeConn{}, nil }
func (probeConn) Commit() error                                { return nil }
func (probeConn) Rollback() error                              { return nil }

// meta.Links defers the intents of puts to the put batch's statement
// through these two methods.
var _ meta.PendDeferrer = (*Engine)(nil)

// DeferPend adds an intent to the batch statement of tx, when tx is the
// probe transaction of a put's batch (see above), and reports whether it
// did: the intent (id, in namespace ns, for d, held by holder, expiring
// ttl after the statement's clock) then commits with the put, or not at
// all. Elsewhere it does nothing and reports false: the caller writes the
// intent itself. The namespace must exist (ns_pending's foreign key): a
// batch whose namespace is gone fails on the server and runs again in a
// transaction, where the caller's own statement reports it.
//
// The statement also keeps the namespaces' usage as the registry does
// (meta/ns_usage.go): size is charged to ns if no reference or
// intent of ns named d before, within its quota, after the batch locked
// ns's row (oneStatement). A batch over a quota fails on the server
// likewise, and runs again in a transaction, where the registry's
// statements charge, or refuse the intent over its quota alone.
func (e *Engine) DeferPend(tx *sql.Tx, id int64, ns string, d blob.Digest, holder string, ttl time.Duration, size int64) bool {
	b := e.puts.batchOf(tx)
	if b == nil || !b.probe {
		return false
	}
	b.pends = append(b.pends, meta.IntentRow{ID: id, NS: ns, D: d, Holder: holder, TTL: ttl, Size: size})
	return true
}

// InProbe reports whether tx is the probe of a put's batch, on which any
// statement fails: a caller about to run one (a link) can fail at once,
// and spare the round trips it would spend making sense of that failure.
func (e *Engine) InProbe(tx *sql.Tx) bool {
	b := e.puts.batchOf(tx)
	return b != nil && b.probe
}

// fast runs jobs as a one-statement batch. It reports false, having
// changed nothing and left every job as it found it, when jobs need a
// transaction; true when it is done with them: committed, or failed with
// their fate unknown.
func (g *putGroup) fast(jobs []*putJob) bool {
	ctx := jobs[0].ctx
	ptx, err := g.probe.BeginTx(ctx, nil)
	if err != nil {
		return false
	}
	b := &putBatch{probe: true}
	g.txMu.Lock()
	g.txs[ptx] = b
	g.txMu.Unlock()
	failed := false
	for _, j := range jobs {
		if j.also == nil {
			continue
		}
		if call(j, ptx); j.failed() {
			failed = true
			break
		}
	}
	g.txMu.Lock()
	delete(g.txs, ptx)
	g.txMu.Unlock()
	ptx.Rollback()
	if failed {
		reset(jobs)
		return false
	}
	inserted, err := g.e.insertBatch(ctx, nil, jobs, b.pins, b.pends)
	var pe *pgconn.PgError
	switch {
	case err == nil:
	case errors.As(err, &pe) || pgconn.SafeToRetry(err):
		// The server refused the statement, or it was never sent:
		// nothing committed.
		reset(jobs)
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
		j.err, j.panic, j.inserted = nil, nil, false
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
