package gc_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/gc"
)

// fakePool is a map pool whose Delete runs a check under the arbitration
// lock, so tests can assert the invariants at the moment of deletion.
type fakePool struct {
	mu       sync.Mutex
	m        map[blob.Digest]int64
	onDelete func(d blob.Digest)
}

func newPool() *fakePool { return &fakePool{m: make(map[blob.Digest]int64)} }

func (p *fakePool) add(d blob.Digest) {
	p.mu.Lock()
	p.m[d] = int64(d[0]) + 1
	p.mu.Unlock()
}

func (p *fakePool) has(d blob.Digest) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.m[d]
	return ok
}

func (p *fakePool) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}

func (p *fakePool) List(ctx context.Context) iter.Seq2[engines.Entry, error] {
	return func(yield func(engines.Entry, error) bool) {
		p.mu.Lock()
		es := make([]engines.Entry, 0, len(p.m))
		for d, n := range p.m {
			es = append(es, engines.Entry{Digest: d, Size: n})
		}
		p.mu.Unlock()
		slices.SortFunc(es, func(a, b engines.Entry) int { return a.Digest.Compare(b.Digest) })
		for _, e := range es {
			if !yield(e, nil) {
				return
			}
		}
	}
}

func (p *fakePool) Delete(ctx context.Context, d blob.Digest) (int64, error) {
	if p.onDelete != nil {
		p.onDelete(d)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.m[d]
	if !ok {
		return 0, blob.Wrap("delete", "fake", d, blob.ErrMissing)
	}
	delete(p.m, d)
	return n, nil
}

// setSource is a liveness source over a set.
type setSource struct {
	mu      sync.Mutex
	m       map[blob.Digest]bool
	err     error
	gate    chan struct{} // if set, Live blocks until closed
	entered chan struct{} // if set, Live signals it has started
}

func newSource(ds ...blob.Digest) *setSource {
	s := &setSource{m: make(map[blob.Digest]bool)}
	for _, d := range ds {
		s.m[d] = true
	}
	return s
}

func (s *setSource) set(d blob.Digest, live bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if live {
		s.m[d] = true
	} else {
		delete(s.m, d)
	}
}

func (s *setSource) IsLive(ctx context.Context, d blob.Digest) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[d], s.err
}

func (s *setSource) Live(ctx context.Context) iter.Seq2[blob.Digest, error] {
	return func(yield func(blob.Digest, error) bool) {
		if s.entered != nil {
			s.entered <- struct{}{}
		}
		if s.gate != nil {
			<-s.gate
		}
		s.mu.Lock()
		ds := make([]blob.Digest, 0, len(s.m))
		for d := range s.m {
			ds = append(ds, d)
		}
		err := s.err
		s.mu.Unlock()
		if err != nil {
			yield(blob.Digest{}, err)
			return
		}
		slices.SortFunc(ds, blob.Digest.Compare)
		for _, d := range ds {
			if !yield(d, nil) {
				return
			}
		}
	}
}

// fakeClock advances only when told to.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
	waiting chan struct{} // gets a value each time After is called
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

func newClock() *fakeClock {
	return &fakeClock{now: time.Unix(1_700_000_000, 0), waiting: make(chan struct{}, 16)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	ch := make(chan time.Time, 1)
	c.waiters = append(c.waiters, waiter{c.now.Add(d), ch})
	c.mu.Unlock()
	c.waiting <- struct{}{}
	return ch
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
		} else {
			kept = append(kept, w)
		}
	}
	c.waiters = kept
}

// memWindow is a durable-looking window for tests: passing a WindowHost
// in Options makes the collector use the next-sweep-executes schedule.
type memWindow struct {
	mu sync.Mutex
	m  map[blob.Digest]time.Time
}

func newWindow() *memWindow { return &memWindow{m: make(map[blob.Digest]time.Time)} }

func (w *memWindow) WindowStage(_ context.Context, cs []engines.Candidate) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range cs {
		if _, ok := w.m[c.Digest]; !ok {
			w.m[c.Digest] = c.VisibleAfter
		}
	}
	return nil
}

func (w *memWindow) WindowDue(_ context.Context, now time.Time, after blob.Digest, limit int) ([]engines.Candidate, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []engines.Candidate
	for d, t := range w.m {
		if !t.After(now) && d.Compare(after) > 0 {
			out = append(out, engines.Candidate{Digest: d, VisibleAfter: t})
		}
	}
	slices.SortFunc(out, func(a, b engines.Candidate) int { return a.Digest.Compare(b.Digest) })
	return out[:min(limit, len(out))], nil
}

func (w *memWindow) WindowRemove(_ context.Context, ds []blob.Digest) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range ds {
		delete(w.m, d)
	}
	return nil
}

func (w *memWindow) WindowLen(context.Context) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.m), nil
}

func dg(i int) blob.Digest { return blob.Sum([]byte(fmt.Sprint("blob-", i))) }

func fill(p *fakePool, n int) []blob.Digest {
	ds := make([]blob.Digest, n)
	for i := range ds {
		ds[i] = dg(i)
		p.add(ds[i])
	}
	return ds
}

func mustSweep(t *testing.T, c *gc.Collector) gc.Report {
	t.Helper()
	r, err := c.Sweep(t.Context())
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	return r
}

func TestPinReleaseIdempotent(t *testing.T) {
	c := gc.New(newPool(), gc.Options{})
	d := dg(1)
	p1, p2 := c.Pin(d), c.Pin(d)
	p1.Release()
	p1.Release() // must not drop p2's reference
	if !c.Pinned(d) {
		t.Fatal("second pin lost after double release of the first")
	}
	p2.Release()
	if c.Pinned(d) {
		t.Fatal("still pinned after all releases")
	}
	var nilPin *gc.Pin
	nilPin.Release()
	ps := []*gc.Pin{c.Pin(d), nil, c.Pin(dg(2))}
	gc.ReleaseAll(ps)
	gc.ReleaseAll(ps)
	if d, n := c.PinCount(); d != 0 || n != 0 {
		t.Fatalf("PinCount after ReleaseAll = %d, %d", d, n)
	}
}

func TestAbortNoLivenessSources(t *testing.T) {
	p := newPool()
	fill(p, 5)
	c := gc.New(p, gc.Options{})
	r := mustSweep(t, c)
	if r.Aborted != gc.AbortNoLivenessSources || r.Deleted != 0 || r.Staged != 0 || p.len() != 5 {
		t.Fatalf("report %+v, pool %d", r, p.len())
	}
	reg := c.Register(newSource())
	reg.Deregister()
	reg.Deregister()
	if r := mustSweep(t, c); r.Aborted != gc.AbortNoLivenessSources || p.len() != 5 {
		t.Fatalf("after deregister: %+v", r)
	}
}

func TestAbortProtectFailed(t *testing.T) {
	p := newPool()
	fill(p, 5)
	w := newWindow()
	c := gc.New(p, gc.Options{Window: w})
	c.Register(newSource())
	if r := mustSweep(t, c); r.Staged != 5 {
		t.Fatalf("first sweep staged %d, want 5", r.Staged)
	}
	c.SetProtect(func(context.Context) (func(blob.Digest) bool, error) { return nil, errors.New("catalog down") })
	r := mustSweep(t, c)
	if r.Aborted != gc.AbortProtectFailed || r.Detail == "" || r.Deleted != 0 || p.len() != 5 {
		t.Fatalf("report %+v, pool %d", r, p.len())
	}
	if n, _ := w.WindowLen(t.Context()); n != 5 {
		t.Fatalf("abort touched the window: %d rows left, want 5", n)
	}
	c.SetProtect(nil)
	if r := mustSweep(t, c); r.Deleted != 5 || p.len() != 0 {
		t.Fatalf("after protect recovered: %+v", r)
	}
}

func TestAbortSweeperLock(t *testing.T) {
	p := newPool()
	fill(p, 5)
	c := gc.New(p, gc.Options{})
	src := newSource()
	src.gate = make(chan struct{})
	src.entered = make(chan struct{}, 1)
	c.Register(src)
	first := make(chan gc.Report)
	go func() { r, _ := c.Sweep(context.Background()); first <- r }()
	<-src.entered // the first sweep holds the lock, blocked in mark
	r := mustSweep(t, c)
	if r.Aborted != gc.AbortSweeperLock || r.Deleted != 0 || p.len() != 5 {
		t.Fatalf("second sweep: %+v, pool %d", r, p.len())
	}
	close(src.gate)
	if r := <-first; r.Aborted != "" || r.Deleted != 5 {
		t.Fatalf("first sweep: %+v", r)
	}
}

func TestDeleteRefusesProtected(t *testing.T) {
	p := newPool()
	ds := fill(p, 4)
	c := gc.New(p, gc.Options{})
	pin := c.Pin(ds[0])
	c.Register(newSource(ds[1]))
	c.SetProtect(func(context.Context) (func(blob.Digest) bool, error) {
		return func(d blob.Digest) bool { return d == ds[2] }, nil
	})
	for i, what := range []string{"pinned", "live in a source", "named by protect"} {
		if err := c.Delete(t.Context(), ds[i]); !errors.Is(err, blob.ErrGcRefuse) {
			t.Errorf("delete of a %s key: %v, want ErrGcRefuse", what, err)
		}
		if !p.has(ds[i]) {
			t.Errorf("%s key deleted", what)
		}
	}
	if err := c.Delete(t.Context(), ds[3]); err != nil || p.has(ds[3]) {
		t.Fatalf("delete of an unprotected key: %v", err)
	}
	if err := c.Delete(t.Context(), ds[3]); !errors.Is(err, blob.ErrMissing) {
		t.Fatalf("delete of an absent key: %v, want ErrMissing", err)
	}
	pin.Release()
	if err := c.Delete(t.Context(), ds[0]); err != nil {
		t.Fatalf("delete after release: %v", err)
	}
	c.SetProtect(func(context.Context) (func(blob.Digest) bool, error) { return nil, errors.New("boom") })
	if err := c.Delete(t.Context(), ds[2]); !errors.Is(err, blob.ErrGcRefuse) {
		t.Fatalf("delete with a failing protect callback: %v, want ErrGcRefuse", err)
	}
}

// Durable schedule at delay 0: sweep N stages, sweep N+1 executes exactly
// what was staged.
func TestTwoSweepExactCounts(t *testing.T) {
	p := newPool()
	ds := fill(p, 100)
	c := gc.New(p, gc.Options{Window: newWindow()})
	src := newSource(ds[:10]...)
	c.Register(src)
	r1 := mustSweep(t, c)
	if r1.Staged != 90 || r1.Deleted != 0 || r1.Cancelled != 0 || r1.Live != 10 || r1.Scanned != 100 || r1.Pending != 90 {
		t.Fatalf("sweep 1: %+v", r1)
	}
	// Between the sweeps: one candidate is pinned, one linked, one deleted
	// directly (vanishes).
	pin := c.Pin(ds[10])
	src.set(ds[11], true)
	if err := c.Delete(t.Context(), ds[12]); err != nil {
		t.Fatal(err)
	}
	r2 := mustSweep(t, c)
	if r2.Deleted+r2.Cancelled != 90 || r2.Cancelled != 3 || r2.Deleted != 87 || r2.Staged != 0 {
		t.Fatalf("sweep 2: %+v", r2)
	}
	pin.Release()
	src.set(ds[11], false)
	if r := mustSweep(t, c); r.Staged != 2 {
		t.Fatalf("sweep 3: %+v", r)
	}
	if r := mustSweep(t, c); r.Deleted != 2 || p.len() != 10 {
		t.Fatalf("sweep 4: %+v, pool %d", r, p.len())
	}
}

// The race across the delay: a put landing during the window survives its
// execution; the unpinned twin is deleted; once unpinned and unreferenced
// the survivor goes too.
func TestRaceAcrossDelay(t *testing.T) {
	clock := newClock()
	p := newPool()
	a, b := dg(1), dg(2)
	p.add(a)
	p.add(b)
	c := gc.New(p, gc.Options{Window: newWindow(), Delay: time.Minute, Clock: clock})
	c.Register(newSource())
	if r := mustSweep(t, c); r.Staged != 2 {
		t.Fatalf("sweep 1: %+v", r)
	}
	if r := mustSweep(t, c); r.Deleted != 0 || r.Cancelled != 0 || r.Pending != 2 {
		t.Fatalf("a sweep inside the window executed: %+v", r)
	}
	// A put of a's content lands during the window: pin, then (dedup)
	// publish.
	pin := c.Pin(a)
	p.add(a)
	clock.Advance(time.Minute)
	r := mustSweep(t, c)
	if r.Deleted != 1 || r.Cancelled != 1 || !p.has(a) || p.has(b) {
		t.Fatalf("after the window: %+v, a=%v b=%v", r, p.has(a), p.has(b))
	}
	pin.Release()
	mustSweep(t, c) // stages a again
	clock.Advance(time.Minute)
	if r := mustSweep(t, c); r.Deleted != 1 || p.has(a) {
		t.Fatalf("unpinned survivor not collected: %+v", r)
	}
}

// The in-process window executes within the same sweep once the delay has
// passed on the clock.
func TestInlineWindowWithDelay(t *testing.T) {
	clock := newClock()
	p := newPool()
	ds := fill(p, 3)
	c := gc.New(p, gc.Options{Delay: time.Hour, Clock: clock})
	c.Register(newSource())
	done := make(chan gc.Report)
	go func() { r, _ := c.Sweep(context.Background()); done <- r }()
	<-clock.waiting     // the sweep staged and is waiting out the delay
	pin := c.Pin(ds[0]) // a put lands during the delay
	clock.Advance(time.Hour)
	r := <-done
	if r.Staged != 3 || r.Deleted != 2 || r.Cancelled != 1 || !p.has(ds[0]) || r.Pending != 0 {
		t.Fatalf("report %+v", r)
	}
	pin.Release()
	if r, ok := c.LastReport(); !ok || r.Deleted != 2 {
		t.Fatalf("LastReport = %+v, %v", r, ok)
	}
}

func TestInlineWindowDelayZero(t *testing.T) {
	p := newPool()
	ds := fill(p, 50)
	c := gc.New(p, gc.Options{})
	c.Register(newSource(ds[:5]...))
	r := mustSweep(t, c)
	if r.Staged != 45 || r.Deleted != 45 || r.BytesFreed == 0 || p.len() != 5 {
		t.Fatalf("report %+v", r)
	}
}

func TestSourceErrorIsOperational(t *testing.T) {
	p := newPool()
	fill(p, 3)
	c := gc.New(p, gc.Options{})
	src := newSource()
	src.err = errors.New("db gone")
	c.Register(src)
	if _, err := c.Sweep(t.Context()); err == nil {
		t.Fatal("sweep with a failing source returned no error")
	}
	if p.len() != 3 {
		t.Fatal("failed sweep deleted")
	}
}

func TestSourceNotAscending(t *testing.T) {
	p := newPool()
	fill(p, 3)
	c := gc.New(p, gc.Options{})
	c.Register(unsorted{})
	if _, err := c.Sweep(t.Context()); err == nil || p.len() != 3 {
		t.Fatalf("unsorted source: err=%v pool=%d", err, p.len())
	}
}

type unsorted struct{}

func (unsorted) IsLive(context.Context, blob.Digest) (bool, error) { return false, nil }
func (unsorted) Live(context.Context) iter.Seq2[blob.Digest, error] {
	return func(yield func(blob.Digest, error) bool) {
		hi, lo := blob.Digest{0, 0, 2}, blob.Digest{0, 0, 1}
		_ = yield(hi, nil) && yield(lo, nil)
	}
}
