// Package nstest is the conformance suite every namespaces.Registry runs,
// in one line:
//
//	func TestMem(t *testing.T) {
//		nstest.Run(t, func(t *testing.T, c namespaces.Clock) namespaces.Registry { return namespaces.NewMem(c) })
//	}
//
// open must return a fresh, empty registry stamping linked_at from c, and
// arrange its own cleanup with t.Cleanup.
package nstest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

func testLiveness(t *testing.T, open Opener) {
	ctx := context.Background()
	r, _ := fresh(t, open)
	if got := live(t, r); len(got) != 0 {
		t.Fatalf("empty registry: Live = %d digests", len(got))
	}
	create(t, r, "a", "b", "c")
	d1, d2, d3, d4, d5 := D(1), D(2), D(3), D(4), D(5)
	link(t, r, "a", d1, d2, d3)
	link(t, r, "b", d2, d4)
	isLive := func(d blob.Digest, want bool) {
		t.Helper()
		if ok, err := r.IsLive(ctx, d); err != nil || ok != want {
			t.Fatalf("IsLive(%s) = %v, %v; want %v", d.Short(), ok, err, want)
		}
	}
	if got, want := live(t, r), sorted([]blob.Digest{d1, d2, d3, d4}); !slices.Equal(got, want) {
		t.Fatalf("Live = %v, want %v (ascending, distinct)", got, want)
	}
	for _, d := range []blob.Digest{d1, d2, d3, d4} {
		isLive(d, true)
	}
	isLive(d5, false)
	must(t, r.Unlink(ctx, "a", d2))
	isLive(d2, true) // b still holds it
	must(t, r.Unlink(ctx, "b", d2))
	isLive(d2, false)
	if got, want := live(t, r), sorted([]blob.Digest{d1, d3, d4}); !slices.Equal(got, want) {
		t.Fatalf("Live after unlinks = %v, want %v", got, want)
	}
	// The zero digest is a key like any other: Live starts with it.
	link(t, r, "c", blob.Digest{})
	isLive(blob.Digest{}, true)
	if got, want := live(t, r), sorted([]blob.Digest{{}, d1, d3, d4}); !slices.Equal(got, want) {
		t.Fatalf("Live with the zero digest = %v, want %v", got, want)
	}
}

func testLiveDistinctPaged(t *testing.T, open Opener) {
	ctx := context.Background()
	r, _ := fresh(t, open)
	create(t, r, "a", "b", "c")
	shared, onlyB := ds(0, 800), ds(800, 1300) // 1 300 distinct: two pages
	for _, tc := range []struct {
		ns string
		ds []blob.Digest
	}{{"a", shared}, {"b", shared}, {"b", onlyB}, {"c", shared[:10]}} {
		_, err := r.LinkMany(ctx, tc.ns, tc.ds)
		must(t, err)
	}
	want := sorted(append(slices.Clone(shared), onlyB...))
	if got := live(t, r); !slices.Equal(got, want) {
		t.Fatalf("Live: %d digests, want %d distinct ascending", len(got), len(want))
	}
}

func testConcurrentLink(t *testing.T, open Opener) {
	ctx := context.Background()
	r, _ := fresh(t, open)
	create(t, r, "a")
	const workers = 8
	for round := range 10 {
		d := D(round)
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins := 0
		for range workers {
			wg.Go(func() {
				linked, err := r.Link(ctx, "a", d)
				if err != nil {
					t.Error(err)
				}
				if linked {
					mu.Lock()
					wins++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if wins != 1 {
			t.Fatalf("%d concurrent Links of one digest reported linked %d times, want once", workers, wins)
		}
	}
	if n, _ := r.Count(ctx, "a"); n != 10 {
		t.Fatalf("Count = %d, want 10", n)
	}
}

// testLinkRemoveRace races Link against Remove of the same namespace: either
// the link wins (Remove says not empty) or the remove does (Link says not
// found), never a reference left in a removed namespace.
func testLinkRemoveRace(t *testing.T, open Opener) {
	ctx := context.Background()
	r, _ := fresh(t, open)
	d := D(7)
	for range 20 {
		create(t, r, "race")
		var linkErr, removeErr error
		var wg sync.WaitGroup
		wg.Go(func() { _, linkErr = r.Link(ctx, "race", d) })
		wg.Go(func() { removeErr = r.Remove(ctx, "race") })
		wg.Wait()
		exists, err := r.Exists(ctx, "race")
		must(t, err)
		isLive, err := r.IsLive(ctx, d)
		must(t, err)
		switch {
		case linkErr == nil && errors.Is(removeErr, namespaces.ErrNotEmpty):
			if !exists || !isLive {
				t.Fatalf("link won, but exists=%v live=%v", exists, isLive)
			}
			must(t, r.Unlink(ctx, "race", d))
			must(t, r.Remove(ctx, "race"))
		case removeErr == nil && errors.Is(linkErr, namespaces.ErrNotFound):
			if exists || isLive {
				t.Fatalf("remove won, but exists=%v live=%v", exists, isLive)
			}
		default:
			t.Fatalf("Link = %v, Remove = %v: want exactly one to win", linkErr, removeErr)
		}
	}
	if got := live(t, r); len(got) != 0 {
		t.Fatalf("references left behind: %v", got)
	}
}

func testCanceled(t *testing.T, open Opener) {
	r, _ := fresh(t, open)
	create(t, r, "a")
	link(t, r, "a", D(1))
	before := state(t, r, D(1), D(2))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Create(ctx, "b"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Create with a canceled context = %v", err)
	}
	if _, err := r.Link(ctx, "a", D(2)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Link with a canceled context = %v", err)
	}
	if err := r.Unlink(ctx, "a", D(1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Unlink with a canceled context = %v", err)
	}
	for _, err := range r.Entries(ctx, "a", blob.Digest{}) {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Entries with a canceled context yielded %v", err)
		}
	}
	for _, err := range r.Live(ctx) {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Live with a canceled context yielded %v", err)
		}
	}
	unchanged(t, r, before, "calls with a canceled context", D(1), D(2))
}

// testLiveAmong: a registry that answers batched liveness queries answers
// them exactly as IsLive would, across namespaces and duplicates.
func testLiveAmong(t *testing.T, open Opener) {
	r, _ := fresh(t, open)
	bs, ok := r.(gc.BatchSource)
	if !ok {
		t.Skip("registry has no batched liveness query (gc.BatchSource)")
	}
	create(t, r, "a", "b")
	link(t, r, "a", D(1), D(2))
	link(t, r, "b", D(2), D(3))
	must(t, r.Unlink(context.Background(), "a", D(1)))
	live, err := bs.LiveAmong(context.Background(), []blob.Digest{D(1), D(2), D(3), D(4), D(2)})
	must(t, err)
	want := map[blob.Digest]bool{D(2): true, D(3): true}
	if len(live) != len(want) || !live[D(2)] || !live[D(3)] {
		t.Fatalf("LiveAmong = %v, want %v", live, want)
	}
	if live, err := bs.LiveAmong(context.Background(), nil); err != nil || len(live) != 0 {
		t.Fatalf("LiveAmong(nil) = %v, %v", live, err)
	}
}
