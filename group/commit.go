// Package group is the one group commit of the module: concurrent callers
// queue jobs, and runners hand what has queued to the owner's run
// function as one batch, so that many callers share one transaction, one
// statement or one round trip. Every path that commits in groups uses it:
// SQLite's write transactions (meta.Batcher), PostgreSQL's puts
// (engines/postgres) and settles (meta), the collector's first pin rows
// (gc).
//
// The group owns the queue, the runners, the bound of a batch, the linger
// of lazy jobs and the hand-back to each caller; what a batch does, and
// what each job's result is, is the owner's: run fills in its jobs (a J
// is usually a pointer to the owner's job struct), and Do returns once
// run returned for the batch that held the job, so the caller reads its
// result then.
package group

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
)

// Options shape a group.
type Options struct {
	// Runners is how many batches run at once (0: one), each in a
	// goroutine of its own that the group starts when jobs queue and
	// that ends once the queue has been empty for a while (runnerIdle)
	// or at Close. With more than one, batches may commit out of queue
	// order, and Alone orders nothing.
	Runners int
	// MaxBatch bounds the jobs of one batch (0: no bound).
	MaxBatch int
	// Linger is how long a batch of lazy jobs only waits for an eager
	// one to join it (0: it does not wait).
	Linger time.Duration
}

// Kind says when a job's batch may start.
type Kind int

const (
	// Eager: its caller waits, as a close(2) does. A batch starts as
	// soon as an eager job is queued.
	Eager Kind = iota
	// Lazy: nobody waits for it (a RELEASE). A batch of lazy jobs starts
	// Linger after the runner found the first, so that the next eager
	// job, or more lazy ones, share it; a Hurry ends the wait.
	Lazy
	// Alone: a batch of its own, after every job queued before it and
	// before every job queued after it (with one runner): for a job
	// that must see only committed work.
	Alone
)

// Commit is a group commit of jobs J, run in batches by run. Its zero
// value is not usable: New makes one.
type Commit[J any] struct {
	run      func(batch []J)
	runners  int
	maxBatch int

	mu      sync.Mutex
	linger  time.Duration
	queue   []*entry[J]
	running int // runners started and not ended, idle ones included
	// idle is how many runners wait for work (park); work wakes one
	// each (capacity: runners, so a send under mu never blocks).
	idle int
	work chan struct{}
	// changed is closed when a lingering runner should look at the queue
	// again (an eager job, a Hurry, Close); nil while none lingers.
	changed chan struct{}
	closed  bool
	wg      sync.WaitGroup // runners, for Close
}

type entry[J any] struct {
	job   J
	kind  Kind
	panic any // run's, raised again by Do
	done  chan struct{}
}

// New returns a group that runs its batches with run. run gets the jobs
// of one batch in queue order, in a slice of its own (it may reorder
// it), and must settle every job's result before it returns; a panic in
// it is raised again in every caller of the batch.
func New[J any](o Options, run func(batch []J)) *Commit[J] {
	n := max(o.Runners, 1)
	return &Commit[J]{run: run, runners: n, maxBatch: o.MaxBatch, linger: o.Linger, work: make(chan struct{}, n)}
}

// ErrClosed is the error of a job queued after Close.
var ErrClosed = fmt.Errorf("group commit: %w", blob.ErrClosed)

// Do queues j and returns once the batch that held it ran: j's result is
// then what run made it. The group keeps nothing of ctx but the Hurry it
// may carry (WithHurry), for a lazy job; run's statements use what the
// owner put in j (as a rule the caller's context without its
// cancellation: a statement is every job's of its batch).
func (c *Commit[J]) Do(ctx context.Context, j J, k Kind) error {
	wait, err := c.Start(ctx, j, k)
	if err != nil {
		return err
	}
	wait()
	return nil
}

// Start queues j as Do does and returns at once; wait returns once the
// batch that held j ran (raising again a panic of run, as Do does). Jobs
// queued by one goroutine's Starts keep its order, so a caller that must
// not wait for its job (meta's close journal, whose records apply in the
// order they were written) queues them in order and waits later, or
// never.
func (c *Commit[J]) Start(ctx context.Context, j J, k Kind) (wait func(), err error) {
	e := &entry[J]{job: j, kind: k, done: make(chan struct{})}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if h, _ := ctx.Value(hurryKey{}).(*Hurry); h != nil && k == Lazy {
		attach(h, c, e)
	}
	c.queue = append(c.queue, e)
	start := false
	switch {
	case c.idle > 0:
		c.idle--
		c.work <- struct{}{}
	case c.running < c.runners:
		start = true
		c.running++
		c.wg.Add(1)
	}
	if e.kind != Lazy {
		c.changedLocked()
	}
	c.mu.Unlock()
	if start {
		go c.runner()
	}
	return func() {
		<-e.done
		if e.panic != nil {
			panic(e.panic)
		}
	}, nil
}

// SetLinger changes how long lazy jobs wait for company, from the next
// linger on. Tests make it long, to show that nothing a program waits for
// waits it out.
func (c *Commit[J]) SetLinger(d time.Duration) {
	c.mu.Lock()
	c.linger = d
	c.mu.Unlock()
}

// Queued reports how many jobs wait for a batch (not those of the batches
// running now): for stats, and for tests that order their callers.
func (c *Commit[J]) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// Close runs what is queued, without waiting out a linger, and returns
// once no batch runs. Jobs queued after it fail with ErrClosed. Safe to
// call more than once, and from more than one goroutine.
func (c *Commit[J]) Close() {
	c.mu.Lock()
	c.closed = true
	c.changedLocked()
	for ; c.idle > 0; c.idle-- {
		c.work <- struct{}{}
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// changedLocked tells a lingering runner to look at the queue again.
func (c *Commit[J]) changedLocked() {
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
}

// runner runs batches until the queue is empty, then waits up to
// runnerIdle for more before it ends. A batch of lazy jobs only waits
// for company when the runner starts or wakes: the jobs that queue while
// a batch runs have waited for it, and go in the next at once.
func (c *Commit[J]) runner() {
	defer c.wg.Done()
	idle := time.NewTimer(runnerIdle)
	defer idle.Stop()
	c.mu.Lock()
	for {
		if len(c.queue) > 0 && !c.ready() && c.linger > 0 {
			c.lingerLocked()
		}
		for len(c.queue) > 0 {
			n := min(len(c.queue), c.batchMax())
			// A job that runs alone ends the batch before it, in queue
			// order, or is a batch of its own.
			switch k := slices.IndexFunc(c.queue[:n], func(e *entry[J]) bool { return e.kind == Alone }); k {
			case -1:
			case 0:
				n = 1
			default:
				n = k
			}
			es := c.queue[:n:n]
			c.queue = c.queue[n:]
			c.mu.Unlock()
			c.runBatch(es)
			c.mu.Lock()
		}
		if c.closed || !c.parkLocked(idle) {
			c.running--
			c.mu.Unlock()
			return
		}
	}
}

// runnerIdle is how long a runner waits for work before it ends. A
// runner that stays keeps its goroutine's grown stack (a SQLite
// statement's is deep): a sequential writer's next job, 100–300 µs later
// in a cp -r, reuses it instead of growing a fresh goroutine's again.
const runnerIdle = time.Second

// parkLocked waits, c.mu held, until Do or Close hands the runner work,
// and reports whether one did (false: runnerIdle passed, and the runner
// is no longer counted idle).
func (c *Commit[J]) parkLocked(timer *time.Timer) bool {
	c.idle++
	c.mu.Unlock()
	timer.Reset(runnerIdle)
	select {
	case <-c.work:
		timer.Stop()
		c.mu.Lock()
		return true
	case <-timer.C:
	}
	c.mu.Lock()
	select {
	case <-c.work: // handed work as the timer fired
		return true
	default:
		c.idle--
		return false
	}
}

// lingerLocked waits, c.mu held, until the queue is ready or Linger has
// passed.
func (c *Commit[J]) lingerLocked() {
	deadline := time.Now().Add(c.linger)
	timer := time.NewTimer(c.linger)
	defer timer.Stop()
	for !c.ready() {
		wait := time.Until(deadline)
		if wait <= 0 {
			return
		}
		if c.changed == nil {
			c.changed = make(chan struct{})
		}
		changed := c.changed
		c.mu.Unlock()
		timer.Reset(wait) // Go 1.23 timers: no stale tick to drain
		select {
		case <-timer.C:
		case <-changed:
		}
		c.mu.Lock()
	}
}

func (c *Commit[J]) batchMax() int {
	if c.maxBatch > 0 {
		return c.maxBatch
	}
	return len(c.queue)
}

// ready reports whether the queued jobs should start now: a job that is
// not lazy waits, the batch is full, or the group is closing.
func (c *Commit[J]) ready() bool {
	return c.closed || (c.maxBatch > 0 && len(c.queue) >= c.maxBatch) ||
		slices.ContainsFunc(c.queue, func(e *entry[J]) bool { return e.kind != Lazy })
}

// runBatch runs one batch and tells its callers. A panic in run is every
// caller's: a bug in a batch must cost its requests (the mount's panic
// handler answers them EIO), not the runner and the daemon.
func (c *Commit[J]) runBatch(es []*entry[J]) {
	defer func() {
		if r := recover(); r != nil {
			p := fmt.Sprintf("%v\n\n(in a group commit's batch)\n%s", r, debug.Stack())
			for _, e := range es {
				e.panic = p
			}
		}
		for _, e := range es {
			close(e.done)
		}
	}()
	jobs := make([]J, len(es))
	for i, e := range es {
		jobs[i] = e.job
	}
	c.run(jobs)
}

// Hurry lets whoever needs a lazy job's commit end its linger: the caller
// of Do passes a context carrying h (WithHurry), and Now makes that job
// eager, whether it is queued yet or not (a Now before the Do makes the
// job eager from the start). One Hurry is for one job; its zero value is
// ready to use.
type Hurry struct {
	mu  sync.Mutex
	now bool
	// eager makes the queued job eager; nil until it is queued, and
	// after Now.
	eager func()
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
	eager := h.eager
	h.eager = nil
	h.mu.Unlock()
	if eager != nil {
		eager()
	}
}

// attach ties h to e as c queues it (c.mu held).
func attach[J any](h *Hurry, c *Commit[J], e *entry[J]) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.now {
		e.kind = Eager
		return
	}
	h.eager = func() {
		c.mu.Lock()
		e.kind = Eager // harmless when its batch has run already
		c.changedLocked()
		c.mu.Unlock()
	}
}
