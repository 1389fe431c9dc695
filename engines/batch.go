package engines

import (
	"context"
	"database/sql"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
)

// Batcher commits the short write transactions of concurrent callers on
// one database as one transaction (group commit). SQLite has one writer at
// a time, and each transaction pays a BEGIN, a COMMIT and a WAL append of
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
// Every write transaction of a process on the database should go through
// its Batcher: the loop begins its next transaction as soon as one
// commits, and a writer outside it, polling for SQLite's lock with
// backoff, waits far longer than one in the queue.
//
// A lazy job's linger is for throughput only: when someone comes to need
// its commit (a lookup of the file whose RELEASE it links), the caller
// that queued it can have given its context a Hurry (WithHurry), and the
// one who needs it calls Hurry.Now, which makes the job eager.
type Batcher struct {
	db     *sql.DB
	linger time.Duration

	mu      sync.Mutex
	queue   []*batchJob
	kick    chan struct{} // the loop is told of a job (capacity 1)
	closed  bool
	stopped chan struct{}

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
func (b *Batcher) SetLinger(d time.Duration) {
	b.mu.Lock()
	b.linger = d
	b.mu.Unlock()
}

// maxBatch bounds the jobs of one transaction, so that one batch holds
// SQLite's write lock for milliseconds, not seconds.
const maxBatch = 256

type batchJob struct {
	fn    func(ctx context.Context, tx *sql.Tx) error
	ctx   context.Context
	lazy  bool
	alone bool // DoAlone: never shares a transaction, never runs again
	err   error
	panic any // recovered from fn, raised again by Do
	done  chan struct{}
}

// failed reports whether fn returned an error or panicked.
func (j *batchJob) failed() bool { return j.err != nil || j.panic != nil }

// NewBatcher starts the loop that commits db's batches; Close stops it.
func NewBatcher(db *sql.DB) *Batcher {
	b := &Batcher{db: db, linger: Linger, kick: make(chan struct{}, 1), stopped: make(chan struct{})}
	go b.loop()
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
	return b.do(&batchJob{fn: fn, ctx: context.WithoutCancel(ctx), lazy: lazy, done: make(chan struct{})})
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
	return b.do(&batchJob{fn: fn, ctx: context.WithoutCancel(ctx), alone: true, done: make(chan struct{})})
}

func (b *Batcher) do(j *batchJob) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrBatcherClosed
	}
	if h, _ := j.ctx.Value(hurryKey{}).(*Hurry); h != nil && j.lazy {
		h.attach(b, j)
	}
	b.queue = append(b.queue, j)
	b.mu.Unlock()
	b.wake()
	<-j.done
	if j.panic != nil {
		panic(j.panic)
	}
	return j.err
}

// Queued reports how many jobs wait for a transaction (not those of the
// batch running now): for stats, and for tests that order their callers.
func (b *Batcher) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// Hurry lets whoever needs a lazy job's commit end its linger: the caller
// of Do passes a context carrying h (WithHurry), and Now makes that job
// eager, whether it is queued yet or not (a Now before the Do makes the
// job eager from the start). One Hurry is for one job; its zero value is
// ready to use.
type Hurry struct {
	mu  sync.Mutex
	now bool
	b   *Batcher // the job's batcher, once queued and until Now
	j   *batchJob
}

type hurryKey struct{}

// WithHurry returns ctx carrying h, for a lazy Do (or a call that reaches
// one) that someone may later need committed at once.
func WithHurry(ctx context.Context, h *Hurry) context.Context {
	return context.WithValue(ctx, hurryKey{}, h)
}

// Now makes h's job eager: its batch starts at once instead of lingering.
func (h *Hurry) Now() {
	h.mu.Lock()
	if h.now {
		h.mu.Unlock()
		return
	}
	h.now = true
	b, j := h.b, h.j
	h.b, h.j = nil, nil
	h.mu.Unlock()
	if b == nil {
		return // not queued yet: it will be queued eager
	}
	b.mu.Lock()
	j.lazy = false // harmless when its batch has run already
	b.mu.Unlock()
	b.wake()
}

// attach ties h to j as b queues it (under b.mu).
func (h *Hurry) attach(b *Batcher, j *batchJob) {
	h.mu.Lock()
	if h.now {
		j.lazy = false
	} else {
		h.b, h.j = b, j
	}
	h.mu.Unlock()
}

// Close runs what is queued and stops the loop. Jobs queued after it
// fail with ErrBatcherClosed.
func (b *Batcher) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		<-b.stopped
		return
	}
	b.closed = true
	b.mu.Unlock()
	b.wake()
	<-b.stopped
}

// wake tells the loop that the queue or the state changed.
func (b *Batcher) wake() {
	select {
	case b.kick <- struct{}{}:
	default: // the loop has been told already
	}
}

func (b *Batcher) loop() {
	defer close(b.stopped)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		<-b.kick
		b.mu.Lock()
		if len(b.queue) > 0 && !b.ready() {
			// Only lazy jobs: give an eager one Linger to join.
			deadline := time.Now().Add(b.linger)
			for !b.ready() {
				wait := time.Until(deadline)
				if wait <= 0 {
					break
				}
				b.mu.Unlock()
				timer.Reset(wait) // Go 1.23 timers: no stale tick to drain
				select {
				case <-timer.C:
				case <-b.kick:
					timer.Stop()
				}
				b.mu.Lock()
			}
		}
		for len(b.queue) > 0 {
			n := min(len(b.queue), maxBatch)
			// A job that runs alone ends the batch before it, in queue
			// order, or is a batch of its own.
			switch k := slices.IndexFunc(b.queue[:n], func(j *batchJob) bool { return j.alone }); k {
			case -1:
			case 0:
				n = 1
			default:
				n = k
			}
			jobs := b.queue[:n:n]
			b.queue = b.queue[n:]
			b.mu.Unlock()
			b.run(jobs)
			b.mu.Lock()
		}
		closed := b.closed
		b.mu.Unlock()
		if closed {
			return
		}
	}
}

// ready reports whether the queued jobs should start now: an eager job
// waits, the batch is full, or the batcher is closing.
func (b *Batcher) ready() bool {
	return b.closed || len(b.queue) >= maxBatch || slices.ContainsFunc(b.queue, func(j *batchJob) bool { return !j.lazy })
}

// run commits one batch and tells its callers.
func (b *Batcher) run(jobs []*batchJob) {
	defer func() {
		for _, j := range jobs {
			close(j.done)
		}
	}()
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
