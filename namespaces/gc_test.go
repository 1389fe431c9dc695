package namespaces_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/gc/gctest"
	"github.com/alkblobfs/alkblobfs/meta"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// registries lists the implementations every composition test runs over.
var registries = []struct {
	name string
	open func(t *testing.T) namespaces.Registry
}{
	{"mem", func(t *testing.T) namespaces.Registry { return namespaces.NewMem(nil) }},
	{"sqlite", func(t *testing.T) namespaces.Registry { return openSQLite(t, nil) }},
}

func forEachRegistry(t *testing.T, f func(t *testing.T, r namespaces.Registry)) {
	for _, rc := range registries {
		t.Run(rc.name, func(t *testing.T) { f(t, rc.open(t)) })
	}
}

func sweep(t *testing.T, p *gctest.Pool) gc.Report {
	t.Helper()
	r, err := p.C.Sweep(context.Background())
	if err != nil || r.Aborted != "" {
		t.Fatalf("sweep: %+v, %v", r, err)
	}
	return r
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func survives(t *testing.T, p *gctest.Pool, d blob.Digest, want bool, when string) {
	t.Helper()
	if got := p.Holds(d); got != want {
		t.Fatalf("%s: pool holds %s = %v, want %v", when, d.Short(), got, want)
	}
}

// TestGCDurableWindow: the registry as the collector's liveness source, with
// a durable window (staged by one sweep, executed by the next).
func TestGCDurableWindow(t *testing.T) {
	forEachRegistry(t, func(t *testing.T, r namespaces.Registry) {
		ctx := t.Context()
		d, junk, late := blob.Sum([]byte("shared")), blob.Sum([]byte("junk")), blob.Sum([]byte("late"))
		p := gctest.NewPool(gc.Options{Window: gc.NewMemWindow(nil)}, d, junk, late)
		p.C.Register(r)
		svc := namespaces.NewService(r, p)
		mustDo(t, r.Create(ctx, "a"))
		mustDo(t, r.Create(ctx, "b"))
		for _, ns := range []string{"a", "b"} {
			if _, err := svc.Link(ctx, ns, d); err != nil {
				t.Fatal(err)
			}
		}

		// Unlinked from a, still referenced by b: survives.
		mustDo(t, r.Unlink(ctx, "a", d))
		rep := sweep(t, p) // stages junk and late
		if rep.Queued != 2 || rep.Live != 1 {
			t.Fatalf("first sweep: %+v; want 2 staged, 1 live", rep)
		}

		// late is linked while the window is open: after the sweep that
		// staged it, before the one that executes it.
		if _, err := svc.Link(ctx, "a", late); err != nil {
			t.Fatal(err)
		}
		rep = sweep(t, p) // executes: junk deleted, late cancelled by arbitration
		if rep.Deleted != 1 || rep.Cancelled != 1 {
			t.Fatalf("second sweep: %+v; want 1 deleted, 1 cancelled", rep)
		}
		survives(t, p, junk, false, "unreferenced after two sweeps")
		survives(t, p, late, true, "linked while its delete was staged")
		survives(t, p, d, true, "still referenced by b")

		// Unlinked from b too: staged by one sweep, gone after the next.
		mustDo(t, r.Unlink(ctx, "b", d))
		rep = sweep(t, p)
		if rep.Queued != 1 || rep.Deleted != 0 {
			t.Fatalf("sweep after the last unlink: %+v; want 1 staged, 0 deleted", rep)
		}
		survives(t, p, d, true, "staged, not yet executed")
		rep = sweep(t, p)
		if rep.Deleted != 1 {
			t.Fatalf("executing sweep: %+v; want 1 deleted", rep)
		}
		survives(t, p, d, false, "unreferenced after two sweeps")
		survives(t, p, late, true, "still referenced by a")
	})
}

// TestGCInProcessWindow: with the in-process window (Options.Window nil),
// a sweep executes what it staged once the delay has passed.
func TestGCInProcessWindow(t *testing.T) {
	forEachRegistry(t, func(t *testing.T, r namespaces.Registry) {
		ctx := t.Context()
		d := blob.Sum([]byte("shared"))
		p := gctest.NewPool(gc.Options{}, d) // delay 0: staged and executed by one sweep
		p.C.Register(r)
		mustDo(t, r.Create(ctx, "a"))
		mustDo(t, r.Create(ctx, "b"))
		for _, ns := range []string{"a", "b"} {
			if _, err := r.Link(ctx, ns, d); err != nil {
				t.Fatal(err)
			}
		}
		mustDo(t, r.Unlink(ctx, "a", d))
		sweep(t, p)
		survives(t, p, d, true, "referenced by b")
		mustDo(t, r.Unlink(ctx, "b", d))
		if rep := sweep(t, p); rep.Deleted != 1 {
			t.Fatalf("sweep: %+v; want 1 deleted", rep)
		}
		survives(t, p, d, false, "unreferenced after a sweep")
	})
}

// TestGCLinkDuringInProcessWindow: a sweep with a delay stages, waits, and
// executes; a link made while it waits keeps the digest.
func TestGCLinkDuringInProcessWindow(t *testing.T) {
	forEachRegistry(t, func(t *testing.T, r namespaces.Registry) {
		ctx := t.Context()
		d := blob.Sum([]byte("late"))
		clock := gctest.NewClock()
		p := gctest.NewPool(gc.Options{Delay: time.Minute, Clock: clock}, d)
		p.C.Register(r)
		mustDo(t, r.Create(ctx, "a"))
		svc := namespaces.NewService(r, p)

		done := make(chan gc.Report)
		go func() {
			rep, err := p.C.Sweep(ctx)
			if err != nil {
				t.Error(err)
			}
			done <- rep
		}()
		var delay time.Duration
		select {
		case delay = <-clock.Waiting: // d is staged; the window is open
		case <-time.After(10 * time.Second):
			t.Fatal("sweep never reached its delete window")
		}
		if _, err := svc.Link(ctx, "a", d); err != nil {
			t.Fatal(err)
		}
		clock.Advance(delay)
		rep := <-done
		if rep.Queued != 1 || rep.Cancelled != 1 || rep.Deleted != 0 {
			t.Fatalf("sweep: %+v; want 1 staged, 1 cancelled, 0 deleted", rep)
		}
		survives(t, p, d, true, "linked inside the delete window")
	})
}

// TestServiceLinkPinsAcrossCheck: a sweep that runs between a Service link's
// pool check and its link — with d staged and due — must not delete d, or
// the namespace would reference nothing.
func TestServiceLinkPinsAcrossCheck(t *testing.T) {
	forEachRegistry(t, func(t *testing.T, r namespaces.Registry) {
		ctx := t.Context()
		d := blob.Sum([]byte("raced"))
		p := gctest.NewPool(gc.Options{Window: gc.NewMemWindow(nil)}, d)
		p.C.Register(r)
		mustDo(t, r.Create(ctx, "a"))
		sweep(t, p) // stages d: due at the next sweep

		var rep gc.Report
		p.AfterHas = func(blob.Digest) {
			p.AfterHas = nil
			rep = sweep(t, p)
		}
		if _, err := namespaces.NewService(r, p).Link(ctx, "a", d); err != nil {
			t.Fatal(err)
		}
		if rep.Cancelled != 1 || rep.Deleted != 0 {
			t.Fatalf("sweep between check and link: %+v; want the candidate cancelled", rep)
		}
		survives(t, p, d, true, "linked while a sweep ran between check and link")
		if n, pins := p.C.PinCount(); n != 0 || pins != 0 {
			t.Fatalf("Link left %d pins behind", pins)
		}
		sweep(t, p)
		sweep(t, p)
		survives(t, p, d, true, "linked, after two more sweeps")
	})
}

// TestServiceRefusesAbsent: a Service links only what the pool holds, and a
// refusal changes nothing and leaks no pin; CommitRows refuses a part
// that mixes a link and an intent.
func TestServiceRefusesAbsent(t *testing.T) {
	forEachRegistry(t, func(t *testing.T, r namespaces.Registry) {
		ctx := t.Context()
		in, out := blob.Sum([]byte("in")), blob.Sum([]byte("out"))
		p := gctest.NewPool(gc.Options{}, in)
		svc := namespaces.NewService(r, p)
		mustDo(t, r.Create(ctx, "a"))

		if _, err := svc.Link(ctx, "a", out); !errors.Is(err, blob.ErrMissing) {
			t.Fatalf("Link of a digest not in the pool = %v, want ErrMissing", err)
		}
		if _, err := svc.LinkMany(ctx, "a", []blob.Digest{in, out}); !errors.Is(err, blob.ErrMissing) {
			t.Fatalf("LinkMany with a digest not in the pool = %v, want ErrMissing", err)
		}
		link, err := svc.LinkRows("a")
		mustDo(t, err)
		if err := svc.CommitRows(ctx, link.For(out, 0)); !errors.Is(err, blob.ErrMissing) {
			t.Fatalf("CommitRows of a link to a digest not in the pool = %v, want ErrMissing", err)
		}
		mixed := link.For(in, 0)
		mixed.Intent = &meta.IntentRow{ID: meta.NewIntentID(), NS: "a", D: in, Holder: "h", TTL: time.Minute}
		if err := svc.CommitRows(ctx, mixed); !errors.Is(err, meta.ErrNSRowsMixed) {
			t.Fatalf("CommitRows of a link with an intent = %v, want ErrNSRowsMixed", err)
		}
		if _, err := svc.Link(ctx, "bad/name", in); !errors.Is(err, namespaces.ErrBadName) {
			t.Fatalf("Link with a bad name = %v", err)
		}
		if n, err := r.Count(ctx, "a"); err != nil || n != 0 {
			t.Fatalf("refused links changed the registry: Count = %d, %v", n, err)
		}
		if _, pins := p.C.PinCount(); pins != 0 {
			t.Fatalf("refused links leaked %d pins", pins)
		}

		if linked, err := svc.Link(ctx, "a", in); err != nil || !linked {
			t.Fatalf("Link of a pooled digest = %v, %v", linked, err)
		}
		mustDo(t, svc.CommitRows(ctx, link.For(in, 0)))
		if n, err := svc.LinkMany(ctx, "a", []blob.Digest{in}); err != nil || n != 0 {
			t.Fatalf("LinkMany of a linked digest = %d, %v", n, err)
		}
		if _, pins := p.C.PinCount(); pins != 0 {
			t.Fatalf("links leaked %d pins", pins)
		}
	})
}

// TestLinkRowsNeedsJoinable: a registry that keeps its rows outside the
// kv engine's database fails a put whose namespace part must commit with
// the entry, instead of linking outside its transaction.
func TestLinkRowsNeedsJoinable(t *testing.T) {
	ctx := t.Context()
	_, e := openSQLiteEngine(t, t.TempDir()+"/kv.db", nil)
	r := namespaces.NewMem(nil)
	mustDo(t, r.Create(ctx, "a"))
	svc := namespaces.NewService(r, gctest.NewPool(gc.Options{}))
	v := []byte("v")
	link, err := svc.LinkRows("a")
	mustDo(t, err)
	_, err = e.PutRows(ctx, blob.Sum(v), v, meta.Rows{NS: link.For(blob.Sum(v), int64(len(v)))})
	if !errors.Is(err, meta.ErrNSRowsElsewhere) {
		t.Fatalf("a put linking through a Mem registry = %v; want meta.ErrNSRowsElsewhere", err)
	}
	if n, _ := r.Count(ctx, "a"); n != 0 {
		t.Fatal("linked outside the transaction")
	}
	if ok, _ := e.Has(ctx, blob.Sum(v)); ok {
		t.Fatal("the entry committed although its link failed")
	}
}
