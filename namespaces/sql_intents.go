package namespaces

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
)

// Pend implements Registry, in its own transaction. When the intent was
// written and the COMMIT then failed, Pend returns the intent with the
// error: the COMMIT may have reached the server and its answer been lost
// (a connection reset), so the row may exist. The caller, which reports
// the failure, drops it (Lease.Abandon); otherwise it would stay pending
// under a live holder, renewed, and be linked at the lease's Close — a
// close that failed published at unmount.
func (r *SQL) Pend(ctx context.Context, name string, d blob.Digest, p Pending) (Intent, error) {
	var i Intent
	err := r.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		i, err = r.PendTx(ctx, tx, name, d, p)
		return err
	})
	if err != nil && i == 0 {
		return 0, err
	}
	return i, err
}

// pendDeferrer is an engine whose puts' transactions can carry an intent
// in the put's own statement (engines/postgres.Engine.DeferPend): it
// reports false where tx is not such a transaction.
type pendDeferrer interface {
	DeferPend(tx *sql.Tx, id int64, ns string, d blob.Digest, holder string, ttl time.Duration, size int64) bool
	// InProbe reports whether tx only probes what the batch's jobs ask
	// for; a statement on it fails, and the batch then takes a
	// transaction.
	InProbe(tx *sql.Tx) bool
}

// errNeedsTx fails a link on a batch's probe (pendDeferrer.InProbe): the
// link runs again in the batch's transaction.
var errNeedsTx = errors.New("namespaces: a link needs the put's transaction")

// PendTx implements TxLinker: the intent commits or rolls back with tx,
// and so does the removal of the one it replaces.
func (r *SQL) PendTx(ctx context.Context, tx *sql.Tx, name string, d blob.Digest, p Pending) (Intent, error) {
	if err := check(ctx, name); err != nil {
		return 0, wrap("pend", name, d, err)
	}
	if p.Holder == "" {
		return 0, wrap("pend", name, d, errors.New("an intent needs a holder"))
	}
	if err := errors.Join(checkSize(p.Size), r.writable()); err != nil {
		return 0, wrap("pend", name, d, err)
	}
	if p.Replaces == 0 && r.pends != nil {
		// Carried by the put's batch statement, which fails as a whole
		// (and runs again with this statement) if the namespace is gone
		// or the intent is over its quota.
		if i := newIntent(); r.pends.DeferPend(tx, int64(i), name, d, p.Holder, p.TTL, p.Size) {
			return i, nil
		}
	}
	if p.Replaces != 0 {
		if err := r.CancelTx(ctx, tx, p.Replaces); err != nil {
			return 0, err
		}
	}
	i, err := r.pendTx(ctx, tx, name, d, p)
	if err != nil {
		return 0, wrap("pend", name, d, err)
	}
	return i, nil
}

// pendTx records the intent in tx, charging p.Size if the namespace does
// not hold d yet (sql_usage.go).
func (r *SQL) pendTx(ctx context.Context, tx *sql.Tx, name string, d blob.Digest, p Pending) (Intent, error) {
	u, err := r.lockNS(ctx, tx, name)
	if err != nil {
		return 0, r.linkFailed(ctx, name, err)
	}
	held, err := r.isHeld(ctx, tx, name, d)
	if err != nil {
		return 0, err
	}
	if !held {
		if err := u.admit(1, p.Size); err != nil {
			return 0, err
		}
	}
	i := newIntent()
	res, err := r.txExec(ctx, tx, r.pendStmt, r.q.pend, r.args(int64(i), name, d[:], p.Holder, nowArg{}, int64(p.TTL), p.Size, name)...)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	} else {
		err = r.linkFailed(ctx, name, err)
	}
	if err == nil && n == 0 {
		err = ErrNotFound
	}
	if err == nil && !held {
		err = r.chargeTx(ctx, tx, name, 1, p.Size)
	}
	if err != nil {
		return 0, err
	}
	return i, nil
}

// Settle implements Registry.
func (r *SQL) Settle(ctx context.Context, i Intent) (bool, error) {
	if err := r.writable(); err != nil {
		return false, wrap("settle", "", blob.Digest{}, err)
	}
	now := r.clock.Now().UnixNano()
	if r.dialect == "postgres" {
		linked, err := r.settles.do(ctx, i, now)
		if err != nil {
			return false, wrap("settle", "", blob.Digest{}, err)
		}
		return linked, nil
	}
	var linked bool
	settle := func(ctx context.Context, tx *sql.Tx) error {
		// The namespace held the digest through the intent and holds it
		// through the reference: the counters do not change.
		var name string
		var b []byte
		var size sql.NullInt64
		err := tx.StmtContext(ctx, r.settleTakeStmt).QueryRowContext(ctx, int64(i)).Scan(&name, &b, &size)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		res, err := tx.StmtContext(ctx, r.settleLinkStmt).ExecContext(ctx, name, b, now, size)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		linked = n == 1
		return err
	}
	// Lazy: nobody waits for a RELEASE, and a sequential writer's next
	// close commits this link with its own publish.
	if err := r.write(ctx, true, settle); err != nil {
		return false, wrap("settle", "", blob.Digest{}, err)
	}
	return linked, nil
}

// Cancel implements Registry, in its own transaction (cancelTx).
func (r *SQL) Cancel(ctx context.Context, i Intent) error {
	if err := r.writable(); err != nil {
		return wrap("cancel", "", blob.Digest{}, err)
	}
	err := r.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return r.cancelTx(ctx, tx, i) })
	if err != nil {
		return wrap("cancel", "", blob.Digest{}, err)
	}
	return nil
}

// CancelTx implements TxLinker.
func (r *SQL) CancelTx(ctx context.Context, tx *sql.Tx, i Intent) error {
	if err := r.writable(); err != nil {
		return wrap("cancel", "", blob.Digest{}, err)
	}
	if err := r.cancelTx(ctx, tx, i); err != nil {
		return wrap("cancel", "", blob.Digest{}, err)
	}
	return nil
}

// txExec runs a hot statement of a put's transaction: st, prepared once,
// on SQLite; on PostgreSQL its text q, which pgx prepares once per pooled
// connection and keeps in that connection's statement cache. A
// database/sql Stmt would cost two round trips more per put there: the
// pool hands database/sql a fresh driver connection for every
// transaction, on which st is prepared again, and deallocated when the
// transaction ends.
func (r *SQL) txExec(ctx context.Context, tx *sql.Tx, st *sql.Stmt, q string, args ...any) (sql.Result, error) {
	if r.dialect == "postgres" {
		return tx.ExecContext(ctx, q, args...)
	}
	return tx.StmtContext(ctx, st).ExecContext(ctx, args...)
}

// Renew implements Registry: one UPDATE, over the holder's index on
// PostgreSQL; on SQLite a scan of ns_pending, which holds only the
// intents of files being written (see ddl).
func (r *SQL) Renew(ctx context.Context, holder string, ttl time.Duration) error {
	if _, err := r.db.ExecContext(ctx, r.q.renew, r.args(nowArg{}, int64(ttl), holder)...); err != nil {
		return wrap("renew", "", blob.Digest{}, err)
	}
	return nil
}

// Recover implements Registry, in one transaction (one statement on
// PostgreSQL). Lapse is judged on the row clock; the references it makes
// are stamped with the registry's Clock.
func (r *SQL) Recover(ctx context.Context, holder string) (int, error) {
	linkedAt := r.clock.Now().UnixNano()
	var n int64
	var err error
	if r.dialect == "postgres" {
		err = r.db.QueryRowContext(ctx, r.q.recoverTake, holder, linkedAt).Scan(&n)
	} else {
		err = r.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			// One reading for both statements: an intent that lapsed
			// between them would be taken without being linked.
			now := r.rows.RowNow()
			if _, err := tx.ExecContext(ctx, r.q.recoverLink, linkedAt, holder, now); err != nil {
				return err
			}
			res, err := tx.ExecContext(ctx, r.q.recoverTake, holder, now)
			if err == nil {
				n, err = res.RowsAffected()
			}
			return err
		})
	}
	if err != nil {
		return 0, wrap("recover", "", blob.Digest{}, err)
	}
	return int(n), nil
}

// Holders implements Registry.
func (r *SQL) Holders(ctx context.Context) ([]string, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT DISTINCT holder FROM ns_pending`)
	if err != nil {
		return nil, wrap("holders", "", blob.Digest{}, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var h string
		if err := rows.Scan(&h); err != nil {
			return nil, wrap("holders", "", blob.Digest{}, err)
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("holders", "", blob.Digest{}, err)
	}
	return out, nil
}

func (r *SQL) anyPending(ctx context.Context, name string) (bool, error) {
	var one int
	err := r.db.QueryRowContext(ctx, rebind(r.dialect, `SELECT 1 FROM ns_pending WHERE ns = ? LIMIT 1`), name).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// settleGroup settles the intents of concurrent callers in one statement
// on PostgreSQL (settleManySQL): a cp -r of small files settles one per
// file at its RELEASE, and a statement each was a round trip and a
// transaction each. One statement runs at a time; the settles that arrive
// meanwhile go together in the next. The statement is one transaction, so
// it links every intent of the group or none: a failure is every caller's,
// and each retries (Lease).
type settleGroup struct {
	db *sql.DB

	mu      sync.Mutex
	queue   []*settleJob
	running bool
}

type settleJob struct {
	i      Intent
	now    int64 // linked_at
	ctx    context.Context
	linked bool
	err    error
	done   chan struct{}
}

// settleGroupMax bounds the intents of one statement.
const settleGroupMax = 256

// settleManySQL takes the intents $1 and links their (namespace, digest)
// pairs, inserted in key order (two hosts' groups never wait for each
// other in a cycle), stamped $2. It returns, for each pair it linked anew,
// the smallest of the intents that named it: that settle linked, the
// others found it linked.
//
// It first locks the rows of the namespaces it settles into (k), in name
// order, as every writer that changes what a namespace holds does
// (sql_usage.go).
const settleManySQL = `WITH k AS (SELECT name FROM ns WHERE name IN (SELECT ns FROM ns_pending WHERE id = ANY($1::bigint[])) ORDER BY name FOR NO KEY UPDATE),
	p AS (DELETE FROM ns_pending WHERE id = ANY($1::bigint[]) AND ns IN (SELECT name FROM k) RETURNING id, ns, digest, size),
	l AS (INSERT INTO ns_refs (ns, digest, linked_at, size)
		SELECT ns, digest, $2::bigint, max(size) FROM p GROUP BY ns, digest ORDER BY ns, digest
		ON CONFLICT (ns, digest) DO NOTHING RETURNING ns, digest)
	SELECT min(p.id) FROM p JOIN l ON p.ns = l.ns AND p.digest = l.digest GROUP BY p.ns, p.digest`

// do settles i with the next group and reports whether it linked. The
// statement runs with the context of the group's first caller, without
// its cancellation: it is the other callers' statement too.
func (g *settleGroup) do(ctx context.Context, i Intent, now int64) (bool, error) {
	j := &settleJob{i: i, now: now, ctx: context.WithoutCancel(ctx), done: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, j)
	start := !g.running
	g.running = true
	g.mu.Unlock()
	if start {
		go g.run()
	}
	<-j.done
	return j.linked, j.err
}

func (g *settleGroup) run() {
	for {
		g.mu.Lock()
		if len(g.queue) == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		n := min(len(g.queue), settleGroupMax)
		jobs := slices.Clone(g.queue[:n])
		g.queue = slices.Delete(g.queue, 0, n)
		g.mu.Unlock()
		g.settle(jobs)
	}
}

func (g *settleGroup) settle(jobs []*settleJob) {
	defer func() {
		for _, j := range jobs {
			close(j.done)
		}
	}()
	ids := make([]int64, len(jobs))
	for k, j := range jobs {
		ids[k] = int64(j.i)
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
		j.linked, j.err = err == nil && linked[int64(j.i)], err
		delete(linked, int64(j.i)) // an intent settled twice links once
	}
}
