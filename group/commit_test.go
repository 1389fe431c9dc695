package group

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// job is a test job: its key, and the batch it ran in (its number, from
// 1), which run sets.
type job struct {
	key   string
	batch int
}

// recorder is a run function that keeps every batch's keys, and can be
// held: while held, a batch that starts waits until release.
type recorder struct {
	mu      sync.Mutex
	batches [][]string
	hold    chan struct{} // nil: not held
	started chan struct{} // a held batch started
	running atomic.Int32
	most    atomic.Int32 // the most batches that ran at once
}

func (r *recorder) run(batch []*job) {
	n := r.running.Add(1)
	defer r.running.Add(-1)
	for m := r.most.Load(); n > m && !r.most.CompareAndSwap(m, n); m = r.most.Load() {
	}
	r.mu.Lock()
	hold, started := r.hold, r.started
	keys := make([]string, len(batch))
	for i, j := range batch {
		keys[i] = j.key
	}
	r.batches = append(r.batches, keys)
	k := len(r.batches)
	r.mu.Unlock()
	if hold != nil {
		select {
		case started <- struct{}{}:
		default:
		}
		<-hold
	}
	for _, j := range batch {
		j.batch = k
	}
}

// held makes the batches that start from now wait until the returned
// release is called, or the test ends (a failed test's deferred Close
// would wait for them for ever).
func (r *recorder) held(t *testing.T) (release func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	hold := make(chan struct{})
	r.hold, r.started = hold, make(chan struct{}, 1)
	release = sync.OnceFunc(func() {
		r.mu.Lock()
		r.hold = nil
		r.mu.Unlock()
		close(hold)
	})
	t.Cleanup(release)
	return release
}

func (r *recorder) seen() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.batches)
}

// do runs Do in a goroutine; the channel gets its error.
func do[J any](c *Commit[J], ctx context.Context, j J, k Kind) chan error {
	done := make(chan error, 1)
	go func() { done <- c.Do(ctx, j, k) }()
	return done
}

// queued waits until n jobs wait in c's queue.
func queued[J any](t *testing.T, c *Commit[J], n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); c.Queued() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d jobs queued after 10 s, want %d", c.Queued(), n)
		}
	}
}

// await waits for done's error, at most 10 s.
func await(t *testing.T, what string, done chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not done after 10 s", what)
	}
}

// started waits until a held batch of r has started.
func started(t *testing.T, r *recorder) {
	t.Helper()
	r.mu.Lock()
	ch := r.started
	r.mu.Unlock()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no batch started within 10 s")
	}
}

// TestCommitGroupsQueued: the jobs that queue while a batch runs go
// together in the next, in queue order, up to MaxBatch a batch, and each
// caller returns once its batch ran.
func TestCommitGroupsQueued(t *testing.T) {
	var r recorder
	c := New(Options{MaxBatch: 3}, r.run)
	t.Cleanup(c.Close)
	release := r.held(t)
	first := &job{key: "first"}
	done := []chan error{do(c, t.Context(), first, Eager)}
	started(t, &r)
	var jobs []*job
	for i := range 5 {
		j := &job{key: fmt.Sprint(i)}
		jobs = append(jobs, j)
		done = append(done, do(c, t.Context(), j, Eager))
		queued(t, c, i+1)
	}
	release()
	for i, d := range done {
		await(t, fmt.Sprint("job ", i), d)
	}
	want := [][]string{{"first"}, {"0", "1", "2"}, {"3", "4"}}
	if got := r.seen(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("batches %v, want %v", got, want)
	}
	if first.batch != 1 || jobs[0].batch != 2 || jobs[4].batch != 3 {
		t.Errorf("a caller returned before its batch ran: batches %d, %d, %d", first.batch, jobs[0].batch, jobs[4].batch)
	}
}

// TestCommitRunners: with Runners 2, two batches run at once and a third
// waits; with 1, never two.
func TestCommitRunners(t *testing.T) {
	for _, runners := range []int{1, 2} {
		t.Run(fmt.Sprint(runners), func(t *testing.T) {
			var r recorder
			c := New(Options{Runners: runners, MaxBatch: 1}, r.run)
			t.Cleanup(c.Close)
			release := r.held(t)
			var done []chan error
			for i := range 4 {
				done = append(done, do(c, t.Context(), &job{key: fmt.Sprint(i)}, Eager))
			}
			for deadline := time.Now().Add(10 * time.Second); int(r.running.Load()) < runners || c.Queued() > 4-runners; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("after 10 s, %d batches run and %d jobs queued; want %d and %d", r.running.Load(), c.Queued(), runners, 4-runners)
				}
			}
			release()
			for i, d := range done {
				await(t, fmt.Sprint("job ", i), d)
			}
			if n := int(r.most.Load()); n != runners {
				t.Errorf("at most %d batches ran at once, want %d", n, runners)
			}
		})
	}
}

// TestCommitLazyRidesWithEager: a lazy job waits for company; an eager
// job that comes within the linger runs with it, at once; alone, a lazy
// job runs once its linger is over.
func TestCommitLazyRidesWithEager(t *testing.T) {
	var r recorder
	c := New(Options{Linger: time.Hour}, r.run)
	t.Cleanup(c.Close)
	lazy := do(c, t.Context(), &job{key: "lazy"}, Lazy)
	queued(t, c, 1)
	select {
	case err := <-lazy:
		t.Fatalf("a lazy job alone ran before its linger: %v", err)
	case <-time.After(50 * time.Millisecond): // lingering: a batch now would be early
	}
	await(t, "the eager job", do(c, t.Context(), &job{key: "eager"}, Eager))
	await(t, "the lazy job", lazy)
	if got, want := r.seen(), [][]string{{"lazy", "eager"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("batches %v, want %v", got, want)
	}

	// A fresh group, whose runner starts with the job: a runner that has
	// just finished a batch takes what queued meanwhile at once, by
	// design, so the job must not queue while one is finishing.
	c = New(Options{Linger: 20 * time.Millisecond}, r.run)
	t.Cleanup(c.Close)
	start := time.Now()
	await(t, "a lazy job alone", do(c, t.Context(), &job{key: "alone"}, Lazy))
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Errorf("a lazy job alone ran after %v, before its linger of 20 ms", d)
	}
}

// TestCommitAlone: an Alone job is a batch of its own, after the jobs
// queued before it and before those queued after it.
func TestCommitAlone(t *testing.T) {
	var r recorder
	c := New(Options{Linger: time.Hour}, r.run)
	t.Cleanup(c.Close)
	release := r.held(t)
	done := []chan error{do(c, t.Context(), &job{key: "hold"}, Eager)}
	started(t, &r)
	for i, k := range []struct {
		key  string
		kind Kind
	}{{"a", Lazy}, {"b", Eager}, {"alone", Alone}, {"c", Lazy}, {"d", Eager}} {
		done = append(done, do(c, t.Context(), &job{key: k.key}, k.kind))
		queued(t, c, i+1)
	}
	release()
	for i, d := range done {
		await(t, fmt.Sprint("job ", i), d)
	}
	want := [][]string{{"hold"}, {"a", "b"}, {"alone"}, {"c", "d"}}
	if got := r.seen(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("batches %v, want %v", got, want)
	}
}

// TestCommitPanic: a panic in run is raised again in every caller of the
// batch, and the group goes on.
func TestCommitPanic(t *testing.T) {
	var r recorder
	c := New(Options{}, func(batch []*job) {
		if batch[0].key == "boom" {
			panic("run failed")
		}
		r.run(batch)
	})
	t.Cleanup(c.Close)
	caught := func() (p any) {
		defer func() { p = recover() }()
		c.Do(t.Context(), &job{key: "boom"}, Eager)
		return nil
	}()
	if s, _ := caught.(string); !strings.Contains(s, "run failed") {
		t.Fatalf("Do of a batch whose run panicked: recovered %v, want the panic", caught)
	}
	if err := c.Do(t.Context(), &job{key: "after"}, Eager); err != nil {
		t.Fatal(err)
	}
	if got := r.seen(); len(got) != 1 {
		t.Errorf("batches after the panic %v, want one", got)
	}
}

// TestCommitClose: Close runs what is queued without waiting out a
// linger, and refuses jobs after it.
func TestCommitClose(t *testing.T) {
	var r recorder
	c := New(Options{Linger: time.Hour}, r.run)
	done := do(c, t.Context(), &job{key: "queued"}, Lazy)
	queued(t, c, 1)
	c.Close()
	await(t, "the job queued before Close", done)
	if err := c.Do(t.Context(), &job{key: "late"}, Eager); !errors.Is(err, ErrClosed) {
		t.Errorf("Do after Close: %v, want ErrClosed", err)
	}
	c.Close() // twice is fine
	if got := r.seen(); len(got) != 1 {
		t.Errorf("batches %v, want the queued job's", got)
	}

	// A runner waiting for work (runnerIdle) ends at Close, at once.
	c = New(Options{}, r.run)
	if err := c.Do(t.Context(), &job{key: "then idle"}, Eager); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.Close()
	if d := time.Since(start); d > runnerIdle/2 {
		t.Errorf("Close with an idle runner took %v: it waited out the runner's idle time (%v)", d, runnerIdle)
	}
}

// TestCommitHurry: a lazy job whose context carries a Hurry runs as soon
// as Hurry.Now is called, queued already or not, instead of waiting out
// its linger; a lazy job without one still lingers, and a spent Hurry
// hurries nothing.
func TestCommitHurry(t *testing.T) {
	var r recorder
	c := New(Options{Linger: time.Hour}, r.run)
	t.Cleanup(c.Close)
	lazy := func(c *Commit[*job], key string, h *Hurry) chan error {
		ctx := t.Context()
		if h != nil {
			ctx = WithHurry(ctx, h)
		}
		return do(c, ctx, &job{key: key}, Lazy)
	}

	var queuedFirst Hurry
	done := lazy(c, "queued", &queuedFirst)
	queued(t, c, 1)
	queuedFirst.Now()
	await(t, "hurried once queued", done)

	var nowFirst Hurry
	nowFirst.Now()
	await(t, "hurried before it was queued", lazy(c, "now first", &nowFirst))

	// A fresh group for the job without a Hurry: c's runner may still be
	// in the turn that ran "now first", and a job queued then joins that
	// turn's next batch at once, linger or not.
	c.Close()
	c = New(Options{Linger: time.Hour}, r.run)
	t.Cleanup(c.Close)
	plain := lazy(c, "plain", nil)
	queued(t, c, 1)
	queuedFirst.Now() // spent: it hurries no other job
	select {
	case err := <-plain:
		t.Fatalf("a lazy job without a Hurry ran before its linger: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	c.Close()
	await(t, "closing", plain)
}
