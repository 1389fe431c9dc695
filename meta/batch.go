package meta

import (
	"context"
	"database/sql"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/group"
)

// Batcher commits the short write transactions of concurrent callers on
// one database as one transaction: a group commit (group.Commit) whose
// batches are transactions and whose jobs are functions of one. SQLite
// has one writer at a time, and each transaction pays a BEGIN, a COMMIT and a WAL append of
// every page it touched: a cp -r of small files into incoming/ paid two per
// file (the publish at close, the link at the last RELEASE). Batched, the
// link of one file commits with the publish of the next.
//
// A job is eager (its caller waits, as a close(2) does) or lazy (it may
// wait up to Linger for company: a RELEASE, which no program waits for).
// A batch starts as soon as one eager job is queued; a batch of lazy jobs
// only starts Linger after its first job, so that in a sequential cp the
// link of file N rides in the transaction of file N+1's publish.
//
// Every job of a batch of more than one runs inside a savepoint: a job
// that fails rolls back its own statements only, and its caller gets its
// error while the others commit. When SQLite ends the whole transaction
// instead (it does on a full disk or an I/O error, whatever the
// savepoints), the job that hit it keeps its error and every other job of
// the batch runs again in a transaction of its own, so that each caller
// gets its own answer. A failed BEGIN or COMMIT fails every job of the
// batch; nothing of it commits. No caller is told its job committed before
// the COMMIT returned. A job that panics is rolled back and the panic is
// raised again in its caller.
//
// So a job may run twice, and its first run may have seen the
// uncommitted work of jobs that then rolled back with it. A job must
// therefore start from scratch each time: build what it returns afresh,
// assign its results rather than append to them, and never compact or
// change in place a slice or map it captured. And it must do nothing a
// rollback does not undo (unlink a file, delete an object elsewhere):
// that goes after Do returns, once the decision has committed, or in
// DoAlone when it needs the write lock. Every job gets the Batcher's
// context as its parameter and must use it, never the caller's (see Do).
//
// It is meta's because a transaction is: meta owns the database's shared
// state, and no exported signature outside meta takes a *sql.Tx
// (docs/txsig_test.go). The engine opens it (NewBatcher) and hands it its
// blob statements as jobs; meta's own writes (SQLite, Links) go through
// the same one.
//
// Every write transaction of a process on the database should go through
// its Batcher: its runner begins the next transaction as soon as one
// commits, and a writer outside it, polling for SQLite's lock with
// backoff, waits far longer than one in the queue.
//
// A lazy job's linger is for throughput only: when someone comes to need
// its commit (a lookup of the file whose RELEASE it links), the caller
// that queued it can have given its context a group.Hurry
// (group.WithHurry), and the one who needs it calls its Now, which makes
// the job eager.
type Batcher struct {
	db    *sql.DB
	group *group.Commit[*batchJob]
	// journal is the database's close journal (journal.go), whose puts
	// return before their job ran; nil: none (a database opened without
	// one, and every Batcher a test makes by hand).
	journal *Journal

	batches atomic.Int64 // transactions begun (tests read it)
}

// Linger is how long a lazy job waits for an eager one to share its
// transaction: longer than the gap between one file's RELEASE and the next
// file's close in a cp -r (a LOOKUP, a CREATE and a WRITE: 100–300 µs
// here), short against anything a person waits for (a lookup of a file
// just closed waits for its link).
const Linger = 2 * time.Millisecond

// SetLinger changes how long lazy jobs wait for company, from the next
// linger on (Linger by default). Tests make it long, to show that nothing
// a program waits for waits it out.
func (b *Batcher) SetLinger(d time.Duration) { b.group.SetLinger(d) }

// maxBatch bounds the jobs of one transaction, so that one batch holds
// SQLite's write lock for milliseconds, not seconds.
const maxBatch = 256

type batchJob struct {
	fn    func(ctx context.Context, tx *sql.Tx) error
	ctx   context.Context
	err   error
	panic any // recovered from fn, raised again by Do
	// after, if set, is told the job's outcome (nil: it committed) once
	// its transaction ended, on the runner's goroutine, in queue order,
	// before the next batch begins: for a job nobody waits for (the
	// close journal's).
	after func(err error)
}

// failed reports whether fn returned an error or panicked.
func (j *batchJob) failed() bool { return j.err != nil || j.panic != nil }

// NewBatcher starts the group commit of db's write transactions: one
// runner, since SQLite has one writer; Close stops it.
func NewBatcher(db *sql.DB) *Batcher {
	b := &Batcher{db: db}
	b.group = group.New(group.Options{Runners: 1, MaxBatch: maxBatch, Linger: Linger}, b.run)
	return b
}

// ErrBatcherClosed is the error of a job queued after Close.
var ErrBatcherClosed = fmt.Errorf("batched transaction: %w", blob.ErrClosed)

// Do runs fn in a write transaction shared with other callers' jobs, and
// returns after that transaction committed (nil, or fn's own error) or
// failed. fn must use the context it is given, never one of its own: a
// statement canceled midway would make SQLite roll back the other jobs'
// work too, so the context fn sees carries ctx's values without its
// cancellation. fn must not wait for anything another batch would do.
func (b *Batcher) Do(ctx context.Context, lazy bool, fn func(ctx context.Context, tx *sql.Tx) error) error {
	k := group.Eager
	if lazy {
		k = group.Lazy
	}
	return b.do(ctx, fn, k)
}

// Write runs fn in a write transaction of db: through b when there is
// one (a writable SQLite database, whose writers — puts, deletes, pin,
// window and namespace rows, the sweep's arbitration — then share its
// queue instead of polling SQLite's lock behind it), lazily if asked (see
// Do); in a transaction of its own otherwise (b nil: a read-only
// database, where it fails, or a database without a group commit). fn
// gets the context to use, which through b is the Batcher's.
func Write(ctx context.Context, b *Batcher, db *sql.DB, lazy bool, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if b != nil {
		return b.Do(ctx, lazy, fn)
	}
	return InTx(ctx, db, nil, func(tx *sql.Tx) error { return fn(ctx, tx) })
}

// DoAlone runs fn once in a write transaction of its own, in the queue
// with the other jobs: never shared, so fn reads only committed work and
// its own, and never run again. It is for a transaction that serves as a
// lock around work outside the database, which no rollback undoes (the
// GC's unlinks of large-tier files under SQLite's write lock): fn should
// write nothing whose loss matters, since an error after fn ran (a failed
// COMMIT) is returned with that outside work done. fn gets the Batcher's
// context, as in Do.
func (b *Batcher) DoAlone(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return b.do(ctx, fn, group.Alone)
}

func (b *Batcher) do(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error, k group.Kind) error {
	j := &batchJob{fn: fn, ctx: context.WithoutCancel(ctx)}
	if err := b.group.Do(ctx, j, k); err != nil {
		return ErrBatcherClosed
	}
	if j.panic != nil {
		panic(j.panic)
	}
	return j.err
}

// Queued reports how many jobs wait for a transaction (not those of the
// batch running now): for stats, and for tests that order their callers.
func (b *Batcher) Queued() int { return b.group.Queued() }

// Close runs what is queued and stops. Jobs queued after it fail with
// ErrBatcherClosed.
func (b *Batcher) Close() { b.group.Close() }

// run commits one batch: the group's run function. A job that runs alone
// (group.Alone) is a batch of one.
func (b *Batcher) run(jobs []*batchJob) {
	defer tell(jobs)
	if len(jobs) == 1 {
		b.runAlone(jobs[0])
		return
	}
	b.batches.Add(1)
	tx, err := b.db.BeginTx(jobs[0].ctx, nil)
	if err != nil {
		for _, j := range jobs {
			j.err = err
		}
		return
	}
	for k, j := range jobs {
		if err := b.runSaved(tx, j); err != nil {
			// SQLite rolled the whole transaction back (a full disk, an
			// I/O error): j keeps its own error, and the jobs this took
			// with it, or that never ran, run again each in its own.
			tx.Rollback()
			if !j.failed() {
				j.err = err
			}
			for i, o := range jobs {
				if i != k {
					o.err, o.panic = nil, nil
					b.runAlone(o)
				}
			}
			return
		}
	}
	if err := tx.Commit(); err != nil {
		for _, j := range jobs {
			if !j.failed() {
				j.err = err
			}
		}
	}
}

// tell gives each job that has one its after, in queue order.
func tell(jobs []*batchJob) {
	for _, j := range jobs {
		if j.after == nil {
			continue
		}
		err := j.err
		if j.panic != nil {
			err = fmt.Errorf("panicked: %v", j.panic)
		}
		j.after(err)
	}
}

// Visible returns once every job queued before it in this process has
// committed or failed, if the database's close journal has puts not yet
// applied (at once otherwise): a read of this process must see what a
// put it made returned for, even one that returned before its
// transaction ran (journal.go). nil b: nothing to wait for.
func (b *Batcher) Visible(ctx context.Context) error {
	if b == nil || b.journal == nil || b.journal.unapplied.Load() == 0 {
		return nil
	}
	return b.Do(ctx, false, func(context.Context, *sql.Tx) error { return nil })
}

// runAlone runs j in a transaction of its own.
func (b *Batcher) runAlone(j *batchJob) {
	b.batches.Add(1)
	tx, err := b.db.BeginTx(j.ctx, nil)
	if err != nil {
		j.err = err
		return
	}
	if b.call(j, tx); j.failed() {
		tx.Rollback()
		return
	}
	j.err = tx.Commit()
}

// runSaved runs j inside a savepoint, rolling back to it when j fails. Its
// error is the transaction's, when the savepoint could not be rolled back
// or released (SQLite has rolled the whole transaction back).
func (b *Batcher) runSaved(tx *sql.Tx, j *batchJob) error {
	if _, err := tx.ExecContext(j.ctx, "SAVEPOINT job"); err != nil {
		return err
	}
	if b.call(j, tx); j.failed() {
		if _, err := tx.ExecContext(j.ctx, "ROLLBACK TO job"); err != nil {
			return err
		}
	}
	_, err := tx.ExecContext(j.ctx, "RELEASE job")
	return err
}

// call runs j's function, keeping a panic for Do to raise again in the
// caller's goroutine: a bug in one job must cost that request (the
// mount's panic handler answers it EIO), not every job of the batch and
// the daemon.
func (b *Batcher) call(j *batchJob, tx *sql.Tx) {
	defer func() {
		if r := recover(); r != nil {
			j.panic = fmt.Sprintf("%v\n\n(in a batched transaction)\n%s", r, debug.Stack())
		}
	}()
	j.err = j.fn(j.ctx, tx)
}

// Batching is an SQL engine whose short write transactions share commits
// (Batcher): SQLite, whose writers take turns on one lock, so that a
// commit per small file is the cost of ingest. Registries in the engine's
// database use the same Batcher for their hot writes.
type Batching interface {
	Batcher() *Batcher
}

// InTx runs fn in a transaction of db and commits it. An error of fn rolls
// the transaction back and is returned as it is; an error beginning or
// committing goes through wrap (the engine's error wrapper; nil: none)
// first. A panic in fn rolls the transaction back too, then goes on up
// as it was: a transaction never ended keeps its connection out of the
// pool and its locks held (SQLite's write lock, PostgreSQL's row and
// advisory locks) until its context ends, for ever under a Background
// one, and a caller that recovers (the mount answers EIO and goes on)
// would be left with a database no one can write.
func InTx(ctx context.Context, db *sql.DB, wrap func(error) error, fn func(tx *sql.Tx) error) error {
	if wrap == nil {
		wrap = func(err error) error { return err }
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return wrap(err)
	}
	done := false
	defer func() {
		if !done {
			tx.Rollback() // fn panicked: the panic goes on up as it was
		}
	}()
	err = fn(tx)
	done = true
	if err != nil {
		tx.Rollback() // fn's error is the one to report
		return err
	}
	if err := tx.Commit(); err != nil {
		return wrap(err)
	}
	return nil
}
