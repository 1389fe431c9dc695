package meta

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/group"
)

// Pend records an intent for d in the namespace, in a transaction of its
// own, and returns its id. When the intent was written and the COMMIT
// then failed, it returns the id with the error: the COMMIT may have
// reached the server and its answer been lost (a connection reset), so
// the row may exist, and the caller drops it (namespaces' Lease.Abandon).
func (l *Links) Pend(ctx context.Context, name string, d blob.Digest, p NSIntent) (int64, error) {
	if err := l.writable(); err != nil {
		return 0, err
	}
	var id int64
	err := l.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		if p.Replaces != 0 {
			// The replaced intent goes first, so that its charge is
			// freed before this one's is admitted.
			if err := l.cancelTx(ctx, tx, p.Replaces); err != nil {
				return err
			}
		}
		id, err = l.pendTx(ctx, tx, name, d, p)
		return err
	})
	if err != nil && id == 0 {
		return 0, err
	}
	return id, err
}

// pendTx records the intent in tx, charging p.Size if the namespace does
// not hold d yet (ns_usage.go).
func (l *Links) pendTx(ctx context.Context, tx *sql.Tx, name string, d blob.Digest, p NSIntent) (int64, error) {
	u, err := l.lockNS(ctx, tx, name)
	if err != nil {
		return 0, l.linkFailed(ctx, name, err)
	}
	held, err := l.isHeld(ctx, tx, name, d)
	if err != nil {
		return 0, err
	}
	if !held && !p.admitted {
		if err := u.admit(1, p.Size); err != nil {
			return 0, err
		}
	}
	id := p.ID
	if id == 0 {
		id = NewIntentID()
	}
	res, err := l.txExec(ctx, tx, l.pendStmt, l.q.pend, l.args(id, name, d[:], p.Holder, nowArg{}, int64(p.TTL), p.Size, name)...)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	} else {
		err = l.linkFailed(ctx, name, err)
	}
	if err == nil && n == 0 {
		err = ErrNSNotFound
	}
	if err == nil && !held {
		err = l.chargeTx(ctx, tx, name, 1, p.Size)
	}
	if err != nil {
		return 0, err
	}
	return id, nil
}

// Settle turns intent id into a reference, stamped now on the wall clock,
// and reports whether that linked (false: the namespace linked the digest
// already, or the intent is gone). The namespace held the digest through
// the intent and holds it through the reference: the counters do not
// change.
func (l *Links) Settle(ctx context.Context, id int64) (bool, error) {
	if err := l.writable(); err != nil {
		return false, err
	}
	now := l.wall().UnixNano()
	if l.dialect == "postgres" {
		return l.settles.do(ctx, id, now)
	}
	if l.journal().settle(id) {
		// Its record has not applied yet: it applies as the link.
		return true, nil
	}
	var linked bool
	settle := func(ctx context.Context, tx *sql.Tx) error {
		var name string
		var b []byte
		var size sql.NullInt64
		err := tx.StmtContext(ctx, l.settleTakeStmt).QueryRowContext(ctx, id).Scan(&name, &b, &size)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		res, err := tx.StmtContext(ctx, l.settleLinkStmt).ExecContext(ctx, name, b, now, size)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		linked = n == 1
		return err
	}
	// Lazy: nobody waits for a RELEASE, and a sequential writer's next
	// close commits this link with its own publish.
	if err := l.write(ctx, true, settle); err != nil {
		return false, err
	}
	return linked, nil
}

// Cancel drops intent id, in a transaction of its own, and frees its
// charge if nothing else of its namespace names its digest. An intent
// already gone is not an error.
func (l *Links) Cancel(ctx context.Context, id int64) error {
	if err := l.writable(); err != nil {
		return err
	}
	if err := l.journal().cancel(id); err != nil {
		return err
	}
	return l.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return l.cancelTx(ctx, tx, id) })
}

// txExec runs a hot statement of a put's transaction: st, prepared once,
// on SQLite; on PostgreSQL its text q, which pgx prepares once per pooled
// connection and keeps in that connection's statement cache. A
// database/sql Stmt would cost two round trips more per put there: the
// pool hands database/sql a fresh driver connection for every
// transaction, on which st is prepared again, and deallocated when the
// transaction ends.
func (l *Links) txExec(ctx context.Context, tx *sql.Tx, st *sql.Stmt, q string, args ...any) (sql.Result, error) {
	if l.dialect == "postgres" {
		return tx.ExecContext(ctx, q, args...)
	}
	return tx.StmtContext(ctx, st).ExecContext(ctx, args...)
}

// Renew sets every intent of holder to expire ttl from now on the row
// clock: one UPDATE, over the holder's index on PostgreSQL; on SQLite a
// scan of ns_pending, which holds only the intents of files being written
// (see nsDDL).
func (l *Links) Renew(ctx context.Context, holder string, ttl time.Duration) error {
	_, err := l.db.ExecContext(ctx, l.q.renew, l.args(nowArg{}, int64(ttl), holder)...)
	return err
}

// Recover links every intent of holder, and every intent lapsed on the
// row clock, stamping the references now on the wall clock, and drops
// them; it returns how many intents it took. One transaction (one
// statement on PostgreSQL).
func (l *Links) Recover(ctx context.Context, holder string) (int, error) {
	if err := l.replayJournals(ctx); err != nil {
		return 0, err
	}
	linkedAt := l.wall().UnixNano()
	var n int64
	var err error
	if l.dialect == "postgres" {
		err = l.db.QueryRowContext(ctx, l.q.recoverTake, holder, linkedAt).Scan(&n)
	} else {
		err = l.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			// One reading for both statements: an intent that lapsed
			// between them would be taken without being linked.
			now := l.rows.RowNow()
			if _, err := tx.ExecContext(ctx, l.q.recoverLink, linkedAt, holder, now); err != nil {
				return err
			}
			res, err := tx.ExecContext(ctx, l.q.recoverTake, holder, now)
			if err == nil {
				n, err = res.RowsAffected()
			}
			return err
		})
	}
	return int(n), err
}

// replayJournals applies what dead processes left in the database's close
// journal (Journal.ReplayDead), and waits for this process's: so that
// what Recover and Holders read includes every close that returned 0.
func (l *Links) replayJournals(ctx context.Context) error {
	if l.batch == nil || l.batch.journal == nil {
		return nil
	}
	if _, err := l.batch.journal.ReplayDead(ctx); err != nil {
		return err
	}
	return l.batch.Visible(ctx)
}

// holdersQuery is Holders' statement.
const holdersQuery = `SELECT DISTINCT holder FROM ns_pending`

// Holders lists the holders that have intents.
func (l *Links) Holders(ctx context.Context) ([]string, error) {
	if err := l.replayJournals(ctx); err != nil {
		return nil, err
	}
	rows, err := l.db.QueryContext(ctx, holdersQuery)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var h string
		if err := rows.Scan(&h); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// AnyPending reports whether the namespace has an intent.
func (l *Links) AnyPending(ctx context.Context, name string) (bool, error) {
	var some bool
	err := l.db.QueryRowContext(ctx, l.q.anyPending, name).Scan(&some)
	return some, err
}

// settleGroup settles the intents of concurrent callers in one statement
// on PostgreSQL (settleManySQL), through a group commit (group.Commit): a
// cp -r of small files settles one per file at its RELEASE, and a
// statement each was a round trip and a transaction each. One statement
// runs at a time; the settles that arrive meanwhile go together in the
// next. The statement is one transaction, so it links every intent of
// the group or none: a failure is every caller's, and each retries
// (namespaces' Lease).
type settleGroup struct {
	db    *sql.DB
	group *group.Commit[*settleJob]
}

type settleJob struct {
	id     int64
	now    int64 // linked_at
	ctx    context.Context
	linked bool
	err    error
}

// settleGroupMax bounds the intents of one statement.
const settleGroupMax = 256

func newSettleGroup(db *sql.DB) *settleGroup {
	g := &settleGroup{db: db}
	g.group = group.New(group.Options{Runners: 1, MaxBatch: settleGroupMax}, g.settle)
	return g
}

// settleManySQL takes the intents $1 and links their (namespace, digest)
// pairs, inserted in key order (two hosts' groups never wait for each
// other in a cycle), stamped $2. It returns, for each pair it linked anew,
// the smallest of the intents that named it: that settle linked, the
// others found it linked.
//
// It first locks the rows of the namespaces it settles into (k), in name
// order, as every writer that changes what a namespace holds does
// (ns_usage.go).
const settleManySQL = `WITH k AS (SELECT name FROM ns WHERE name IN (SELECT ns FROM ns_pending WHERE id = ANY($1::bigint[])) ORDER BY name FOR NO KEY UPDATE),
	p AS (DELETE FROM ns_pending WHERE id = ANY($1::bigint[]) AND ns IN (SELECT name FROM k) RETURNING id, ns, digest, size),
	l AS (INSERT INTO ns_refs (ns, digest, linked_at, size)
		SELECT ns, digest, $2::bigint, max(size) FROM p GROUP BY ns, digest ORDER BY ns, digest
		ON CONFLICT (ns, digest) DO NOTHING RETURNING ns, digest)
	SELECT min(p.id) FROM p JOIN l ON p.ns = l.ns AND p.digest = l.digest GROUP BY p.ns, p.digest`

// do settles id with the next group and reports whether it linked. The
// statement runs with the context of the group's first caller, without
// its cancellation: it is the other callers' statement too.
func (g *settleGroup) do(ctx context.Context, id, now int64) (bool, error) {
	j := &settleJob{id: id, now: now, ctx: context.WithoutCancel(ctx)}
	if err := g.group.Do(ctx, j, group.Eager); err != nil {
		return false, err
	}
	return j.linked, j.err
}

// settle runs one group's statement: the group's run function.
func (g *settleGroup) settle(jobs []*settleJob) {
	ids := make([]int64, len(jobs))
	for k, j := range jobs {
		ids[k] = j.id
	}
	linked := make(map[int64]bool)
	rows, err := g.db.QueryContext(jobs[0].ctx, settleManySQL, ids, jobs[0].now)
	if err == nil {
		for rows.Next() {
			var id int64
			if err = rows.Scan(&id); err != nil {
				break
			}
			linked[id] = true
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	for _, j := range jobs {
		j.linked, j.err = err == nil && linked[j.id], err
		delete(linked, j.id) // an intent settled twice links once
	}
}
