package postgres

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync/atomic"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/group"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Group commit of puts (PutRows). A small blob's put through a fleet
// mount was about eleven round trips and two transactions: BEGIN, the pin
// row's arbitration lock, the pin row, the namespace intent (prepared
// again on every pooled connection, and deallocated after), the blob,
// COMMIT, and the settle at RELEASE. Concurrent puts of one engine now
// share them, through a group commit (group.Commit): each caller queues
// its put, and up to putRunners batches run at once, each taking what has
// queued meanwhile (up to putMaxBatch puts). Most batches are one
// statement (putfast.go); the others are BEGIN, each put's namespace part
// (meta.NSRows.WriteTx: a link, or an intent that replaces another), then
// one statement for every put of the batch — the arbitration locks, the pin rows and the blobs — and COMMIT.
//
// The order the GC needs holds in that statement: its pin rows and
// entries commit together, after the shared arbitration lock of every
// digest is granted (every row it inserts is built from the CTE that
// takes them), so a delete's arbitration either commits before it — and
// the put then inserts the content afresh, ON CONFLICT judging on the
// latest committed rows — or waits for its COMMIT and sees its pin rows.
// The lock and the pin rows are meta's fragments (meta.PGLockShared,
// meta.PGBatchPins): gc_pins is meta's table, and this statement only
// carries its rows. A put's namespace part is written before the lock,
// which nothing requires: an arbitration that deletes the blob first is
// undone by the put's insert, under the lock, in the same transaction as
// the link or intent. Every batch takes its locks and inserts its rows in
// digest order, so two batches never wait for each other in a cycle, nor
// a batch and an arbitration (whose locks are in key order too). A
// one-statement batch with intents locks its namespaces' rows before
// that, in name order (oneStatement), as a namespace part locks its
// namespace's row before the batch statement's arbitration locks:
// namespaces, then digests, everywhere.
//
// A put's namespace part may fail (a namespace just removed, a quota, a
// server error), and PostgreSQL then aborts the whole transaction: the
// batch rolls back, and each of its puts runs again alone, so that each
// caller gets its own answer. A put's rows are a value, written afresh
// each time. A failed BEGIN of a batch of one, or any failed COMMIT,
// fails every put of the batch; no caller is told its put committed
// before the COMMIT returned.
type putGroup struct {
	e     *Engine
	group *group.Commit[*putJob]

	fastBatches atomic.Int64 // batches committed by fast (tests)
	txBatches   atomic.Int64 // batches that took a transaction (tests)
}

// putRunners is how many batches of one engine run at once, each on a
// connection of its own: two keep the server working while a batch's
// round trip is on the way, and let puts queue behind them into batches.
const putRunners = 2

// putMaxBatch bounds the puts of one transaction.
const putMaxBatch = 64

type putJob struct {
	d        blob.Digest
	value    []byte
	rows     meta.Rows
	ctx      context.Context
	inserted bool
	err      error
}

// nowOnce is the server's clock read once per statement (see
// engines.PGNow): the intents' expiries.
const nowOnce = `(SELECT ` + engines.PGNow + `)`

func newPutGroup(e *Engine) *putGroup {
	g := &putGroup{e: e}
	g.group = group.New(group.Options{Runners: putRunners, MaxBatch: putMaxBatch}, g.runBatch)
	return g
}

// do queues j and returns once its batch committed or failed.
func (g *putGroup) do(j *putJob) {
	if err := g.group.Do(j.ctx, j, group.Eager); err != nil {
		j.err = err
	}
}

// wait runs what is queued and returns once no batch runs (Close): a put
// after it fails with group.ErrClosed.
func (g *putGroup) wait() { g.group.Close() }

// runBatch commits jobs: the group's run function.
func (g *putGroup) runBatch(jobs []*putJob) {
	// Digest order: the batch's statements take locks and insert rows in
	// the order every other batch and arbitration does.
	slices.SortStableFunc(jobs, func(a, b *putJob) int { return a.d.Compare(b.d) })
	if g.fast(jobs) {
		return
	}
	g.txBatches.Add(1)
	if g.attempt(jobs) || len(jobs) == 1 {
		return
	}
	for _, j := range jobs {
		reset([]*putJob{j})
		g.attempt([]*putJob{j})
	}
}

// attempt runs jobs in one transaction. It reports false when that rolled
// back (a put's namespace part, or the batch's statement, failed),
// leaving every job an error; a failed COMMIT fails every job, and
// reports true: what committed is unknown, and nothing runs again.
func (g *putGroup) attempt(jobs []*putJob) bool {
	ctx := jobs[0].ctx
	fail := func(err error) {
		for _, j := range jobs {
			if j.err == nil {
				j.err = err
			}
		}
	}
	tx, err := g.e.db.BeginTx(ctx, nil)
	if err != nil {
		fail(err)
		return false
	}
	for _, j := range jobs {
		if j.err = j.rows.NS.WriteTx(j.ctx, tx); j.err != nil {
			tx.Rollback()
			fail(errRolledBack)
			return false
		}
	}
	inserted, err := g.e.insertBatch(ctx, tx, jobs, pinsOf(jobs), nil)
	if err != nil {
		tx.Rollback()
		fail(err)
		return false
	}
	if err := tx.Commit(); err != nil {
		fail(err)
		return true
	}
	settled(jobs, inserted)
	return true
}

// errRolledBack is the error of the puts of a batch that rolled back for
// another's failure, until they run again alone.
var errRolledBack = errors.New("postgres: put rolled back with another of its batch")

// pinsOf is the pin rows of jobs, which the batch's statement writes.
func pinsOf(jobs []*putJob) []meta.PinRow {
	var pins []meta.PinRow
	for _, j := range jobs {
		if j.rows.Pin != nil {
			pins = append(pins, *j.rows.Pin)
		}
	}
	return pins
}

// batchPutSQL takes the shared arbitration lock of every digest of the
// batch ($1, in key order), then inserts the pin rows ($2-$4) and the
// blobs ($5-$7), both from rows joined with the lock's CTE, so that no
// row goes in before every lock is granted. It returns the digests it
// inserted (not those already stored: a dedup). batchPendSQL also inserts
// the intents of a one-statement batch ($8-$13, see fast) and keeps their
// namespaces' usage, with meta's part of the statement
// (meta.PGBatchIntents, which says how), after the namespaces' rows are
// locked in the same transaction (oneStatement).
const (
	batchPutSQL  = batchLockPins + batchBlobs
	batchPendSQL = batchLockPins + `,
	` + meta.PGBatchIntents + batchPendBlobs
	batchPendBlobs = `
	INSERT INTO blobs (digest, size, value)
	SELECT u.d, u.n, u.v FROM l, g, unnest($5::bytea[], $6::bigint[], $7::bytea[]) AS u(d, n, v)
	ON CONFLICT (digest) DO NOTHING RETURNING digest`

	batchLockPins = `WITH l AS (` + meta.PGLockShared + `),
	` + meta.PGBatchPins
	batchBlobs = `
	INSERT INTO blobs (digest, size, value)
	SELECT u.d, u.n, u.v FROM l, unnest($5::bytea[], $6::bigint[], $7::bytea[]) AS u(d, n, v)
	ON CONFLICT (digest) DO NOTHING RETURNING digest`
)

// insertBatch runs batchPutSQL for jobs (in digest order), pins and
// pends: in tx, or with tx nil as a statement of its own (fast).
func (e *Engine) insertBatch(ctx context.Context, tx *sql.Tx, jobs []*putJob, pins []meta.PinRow, pends []meta.IntentRow) (map[blob.Digest]bool, error) {
	pd, po, pt := meta.PGPinArgs(pins)
	var bd, bv [][]byte
	var bn []int64
	ds := make([]blob.Digest, 0, len(jobs)+len(pins))
	for i, j := range jobs {
		ds = append(ds, j.d)
		if i > 0 && j.d == jobs[i-1].d {
			continue // one insert per digest
		}
		bd, bn, bv = append(bd, j.d[:]), append(bn, int64(len(j.value))), append(bv, j.value)
	}
	for _, p := range pins {
		ds = append(ds, p.D)
	}
	q, args := batchPutSQL, []any{meta.PGLockKeys(ds), pd, po, pt, bd, bn, bv}
	if len(pends) > 0 {
		q, args = batchPendSQL, append(args, meta.PGIntentArgs(pends)...)
	}
	inserted := make(map[blob.Digest]bool, len(jobs))
	if tx == nil {
		if err := e.oneStatement(ctx, q, args, meta.PGIntentNames(pends), func(d blob.Digest) { inserted[d] = true }); err != nil {
			return nil, e.wrap("put", err)
		}
		return inserted, nil
	}
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, e.wrap("put", err)
	}
	defer rows.Close()
	if err := engines.ScanDigests(rows, func(d blob.Digest) { inserted[d] = true }); err != nil {
		return nil, e.wrap("put", err)
	}
	return inserted, nil
}
