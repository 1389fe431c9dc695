package gc_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/gc/gctest"
	"github.com/alkblobfs/alkblobfs/meta/metatest"
)

func dg(i int) blob.Digest { return blob.Sum([]byte(fmt.Sprint("blob-", i))) }

func fill(p *gctest.Pool, n int) []blob.Digest {
	ds := make([]blob.Digest, n)
	for i := range ds {
		ds[i] = dg(i)
		p.Add(ds[i])
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
	c := gctest.NewPool(gc.Options{}).C
	d := dg(1)
	p1, p2 := mustPin(t, c, d), mustPin(t, c, d)
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
	ps := []*gc.Pin{mustPin(t, c, d), nil, mustPin(t, c, dg(2))}
	gc.ReleaseAll(ps)
	gc.ReleaseAll(ps)
	if d, n := c.PinCount(); d != 0 || n != 0 {
		t.Fatalf("PinCount after ReleaseAll = %d, %d", d, n)
	}
}

func TestAbortNoLivenessSources(t *testing.T) {
	p := gctest.NewPool(gc.Options{})
	fill(p, 5)
	c := p.C
	r := mustSweep(t, c)
	if r.Aborted != gc.AbortNoLivenessSources || r.Deleted != 0 || r.Queued != 0 || p.Len() != 5 {
		t.Fatalf("report %+v, pool %d", r, p.Len())
	}
	reg := c.Register(gctest.NewSource())
	reg.Deregister()
	reg.Deregister()
	if r := mustSweep(t, c); r.Aborted != gc.AbortNoLivenessSources || p.Len() != 5 {
		t.Fatalf("after deregister: %+v", r)
	}
	if tot := c.Totals(); tot.Runs != 2 || tot.Aborted[gc.AbortNoLivenessSources] != 2 {
		t.Fatalf("totals %+v", tot)
	}
}

// TestMemWindow: the in-process window keeps the meta.Window contract, on
// the real clock and on a test's.
func TestMemWindow(t *testing.T) {
	metatest.Window(t, gc.NewMemWindow(nil))
	clock := gctest.NewClock()
	w := gc.NewMemWindow(clock)
	d := dg(1)
	if err := w.WindowQueue(t.Context(), []blob.Digest{d}, time.Minute); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute - time.Nanosecond)
	if due, err := w.WindowDue(t.Context(), blob.Digest{}, 10); len(due) != 0 || err != nil {
		t.Fatalf("due a nanosecond before its delay on the collector's clock: %v, %v", due, err)
	}
	clock.Advance(time.Nanosecond)
	if due, err := w.WindowDue(t.Context(), blob.Digest{}, 10); len(due) != 1 || err != nil {
		t.Fatalf("not due at its delay on the collector's clock: %v, %v", due, err)
	}
}

func TestAbortProtectFailed(t *testing.T) {
	w := gc.NewMemWindow(nil)
	p := gctest.NewPool(gc.Options{Window: w})
	fill(p, 5)
	c := p.C
	c.Register(gctest.NewSource())
	if r := mustSweep(t, c); r.Queued != 5 {
		t.Fatalf("first sweep queued %d, want 5", r.Queued)
	}
	c.SetProtect(func(context.Context) (func(blob.Digest) bool, error) { return nil, errors.New("catalog down") })
	r := mustSweep(t, c)
	if r.Aborted != gc.AbortProtectFailed || r.Detail == "" || r.Deleted != 0 || p.Len() != 5 {
		t.Fatalf("report %+v, pool %d", r, p.Len())
	}
	if n, _ := w.WindowLen(t.Context()); n != 5 {
		t.Fatalf("abort touched the window: %d rows left, want 5", n)
	}
	c.SetProtect(nil)
	if r := mustSweep(t, c); r.Deleted != 5 || p.Len() != 0 {
		t.Fatalf("after protect recovered: %+v", r)
	}
}

func TestAbortSweeperLock(t *testing.T) {
	p := gctest.NewPool(gc.Options{})
	fill(p, 5)
	c := p.C
	src := gctest.NewSource()
	src.Gate = make(chan struct{})
	src.Entered = make(chan struct{}, 1)
	c.Register(src)
	first := make(chan gc.Report)
	go func() { r, _ := c.Sweep(context.Background()); first <- r }()
	<-src.Entered // the first sweep holds the lock, blocked in mark
	r := mustSweep(t, c)
	if r.Aborted != gc.AbortSweeperLock || r.Deleted != 0 || p.Len() != 5 {
		t.Fatalf("second sweep: %+v, pool %d", r, p.Len())
	}
	close(src.Gate)
	if r := <-first; r.Aborted != "" || r.Deleted != 5 {
		t.Fatalf("first sweep: %+v", r)
	}
	if tot := c.Totals(); tot.Runs != 2 || tot.Aborted[gc.AbortSweeperLock] != 1 || tot.Deleted != 5 {
		t.Fatalf("totals %+v", tot)
	}
}

func TestDeleteRefusesProtected(t *testing.T) {
	p := gctest.NewPool(gc.Options{})
	ds := fill(p, 4)
	c := p.C
	pin := mustPin(t, c, ds[0])
	c.Register(gctest.NewSource(ds[1]))
	c.SetProtect(func(context.Context) (func(blob.Digest) bool, error) {
		return func(d blob.Digest) bool { return d == ds[2] }, nil
	})
	for i, what := range []string{"pinned", "live in a source", "named by protect"} {
		if err := c.Delete(t.Context(), ds[i]); !errors.Is(err, blob.ErrGcRefuse) {
			t.Errorf("delete of a %s key: %v, want ErrGcRefuse", what, err)
		}
		if !p.Holds(ds[i]) {
			t.Errorf("%s key deleted", what)
		}
	}
	if err := c.Delete(t.Context(), ds[3]); err != nil || p.Holds(ds[3]) {
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

// Durable schedule at delay 0: sweep N queues, sweep N+1 executes exactly
// what was queued.
func TestTwoSweepExactCounts(t *testing.T) {
	p := gctest.NewPool(gc.Options{Window: gc.NewMemWindow(nil)})
	ds := fill(p, 100)
	c := p.C
	src := gctest.NewSource(ds[:10]...)
	c.Register(src)
	r1 := mustSweep(t, c)
	if r1.Queued != 90 || r1.Deleted != 0 || r1.Cancelled != 0 || r1.Live != 10 || r1.Scanned != 100 || r1.Pending != 90 {
		t.Fatalf("sweep 1: %+v", r1)
	}
	// Between the sweeps: one candidate is pinned, one linked, one deleted
	// directly (vanishes).
	pin := mustPin(t, c, ds[10])
	src.Set(ds[11], true)
	if err := c.Delete(t.Context(), ds[12]); err != nil {
		t.Fatal(err)
	}
	r2 := mustSweep(t, c)
	if r2.Deleted+r2.Cancelled != 90 || r2.Cancelled != 3 || r2.Deleted != 87 || r2.Queued != 0 {
		t.Fatalf("sweep 2: %+v", r2)
	}
	pin.Release()
	src.Set(ds[11], false)
	r3 := mustSweep(t, c)
	if r3.Queued != 2 {
		t.Fatalf("sweep 3: %+v", r3)
	}
	r4 := mustSweep(t, c)
	if r4.Deleted != 2 || p.Len() != 10 {
		t.Fatalf("sweep 4: %+v, pool %d", r4, p.Len())
	}
	tot := c.Totals()
	if tot.Runs != 4 || tot.Failed != 0 || len(tot.Aborted) != 0 || tot.Queued != 92 || tot.Deleted != 89 ||
		tot.Cancelled != 3 || tot.Scanned != r1.Scanned+r2.Scanned+r3.Scanned+r4.Scanned ||
		tot.BytesFreed != r2.BytesFreed+r4.BytesFreed {
		t.Fatalf("totals %+v", tot)
	}
}

// The race across the delay: a put landing during the window survives its
// execution; the unpinned twin is deleted; once unpinned and unreferenced
// the survivor goes too.
func TestRaceAcrossDelay(t *testing.T) {
	clock := gctest.NewClock()
	a, b := dg(1), dg(2)
	p := gctest.NewPool(gc.Options{Window: gc.NewMemWindow(clock), Delay: time.Minute, Clock: clock}, a, b)
	c := p.C
	c.Register(gctest.NewSource())
	if r := mustSweep(t, c); r.Queued != 2 {
		t.Fatalf("sweep 1: %+v", r)
	}
	if r := mustSweep(t, c); r.Deleted != 0 || r.Cancelled != 0 || r.Pending != 2 {
		t.Fatalf("a sweep inside the window executed: %+v", r)
	}
	// A put of a's content lands during the window: pin, then (dedup)
	// publish.
	pin := mustPin(t, c, a)
	p.Add(a)
	clock.Advance(time.Minute)
	r := mustSweep(t, c)
	if r.Deleted != 1 || r.Cancelled != 1 || !p.Holds(a) || p.Holds(b) {
		t.Fatalf("after the window: %+v, a=%v b=%v", r, p.Holds(a), p.Holds(b))
	}
	pin.Release()
	mustSweep(t, c) // queues a again
	clock.Advance(time.Minute)
	if r := mustSweep(t, c); r.Deleted != 1 || p.Holds(a) {
		t.Fatalf("unpinned survivor not collected: %+v", r)
	}
}

// The in-process window executes within the same sweep once the delay has
// passed on the clock.
func TestInlineWindowWithDelay(t *testing.T) {
	clock := gctest.NewClock()
	p := gctest.NewPool(gc.Options{Delay: time.Hour, Clock: clock})
	ds := fill(p, 3)
	c := p.C
	c.Register(gctest.NewSource())
	done := make(chan gc.Report)
	go func() { r, _ := c.Sweep(context.Background()); done <- r }()
	<-clock.Waiting             // the sweep queued and is waiting out the delay
	pin := mustPin(t, c, ds[0]) // a put lands during the delay
	clock.Advance(time.Hour)
	r := <-done
	if r.Queued != 3 || r.Deleted != 2 || r.Cancelled != 1 || !p.Holds(ds[0]) || r.Pending != 0 {
		t.Fatalf("report %+v", r)
	}
	pin.Release()
	if r, ok := c.LastReport(); !ok || r.Deleted != 2 {
		t.Fatalf("LastReport = %+v, %v", r, ok)
	}
}

func TestInlineWindowDelayZero(t *testing.T) {
	p := gctest.NewPool(gc.Options{})
	ds := fill(p, 50)
	c := p.C
	c.Register(gctest.NewSource(ds[:5]...))
	r := mustSweep(t, c)
	if r.Queued != 45 || r.Deleted != 45 || r.BytesFreed == 0 || p.Len() != 5 {
		t.Fatalf("report %+v", r)
	}
}

func TestSourceErrorIsOperational(t *testing.T) {
	p := gctest.NewPool(gc.Options{})
	fill(p, 3)
	c := p.C
	src := gctest.NewSource()
	src.Err = errors.New("db gone")
	c.Register(src)
	if _, err := c.Sweep(t.Context()); err == nil {
		t.Fatal("sweep with a failing source returned no error")
	}
	if p.Len() != 3 {
		t.Fatal("failed sweep deleted")
	}
}

func TestSourceNotAscending(t *testing.T) {
	p := gctest.NewPool(gc.Options{})
	fill(p, 3)
	c := p.C
	c.Register(unsorted{})
	if _, err := c.Sweep(t.Context()); err == nil || p.Len() != 3 {
		t.Fatalf("unsorted source: err=%v pool=%d", err, p.Len())
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

func mustPin(t testing.TB, c *gc.Collector, d blob.Digest) *gc.Pin {
	t.Helper()
	p, err := c.Pin(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
