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
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

func testLinkUnlink(t *testing.T, open Opener) {
	ctx := context.Background()
	r, _ := fresh(t, open)
	create(t, r, "a", "b")
	d1, d2 := D(1), D(2)

	if _, ok, err := r.Has(ctx, "a", d1); err != nil || ok {
		t.Fatalf("Has before Link = %v, %v", ok, err)
	}
	if linked, err := r.Link(ctx, "a", d1); err != nil || !linked {
		t.Fatalf("first Link = %v, %v; want true", linked, err)
	}
	if linked, err := r.Link(ctx, "a", d1); err != nil || linked {
		t.Fatalf("second Link = %v, %v; want false (idempotent)", linked, err)
	}
	if ref, ok, err := r.Has(ctx, "a", d1); err != nil || !ok || ref.Digest != d1 {
		t.Fatalf("Has = %v, %v, %v", ref, ok, err)
	}
	if _, ok, _ := r.Has(ctx, "b", d1); ok {
		t.Fatal("a link in a shows in b")
	}
	link(t, r, "a", d2)
	if got, err := r.HasMany(ctx, "a", []blob.Digest{d1, D(3), d2, d1}); err != nil || !slices.Equal(got, []bool{true, false, true, true}) {
		t.Fatalf("HasMany = %v, %v", got, err)
	}
	if got, err := r.HasMany(ctx, "b", []blob.Digest{d1, d2}); err != nil || !slices.Equal(got, []bool{false, false}) {
		t.Fatalf("HasMany(b) = %v, %v", got, err)
	}
	if got, err := r.HasMany(ctx, "b", nil); err != nil || len(got) != 0 {
		t.Fatalf("HasMany(b, none) = %v, %v", got, err)
	}
	_, err := r.HasMany(ctx, "nope", []blob.Digest{d1})
	wantErr(t, err, namespaces.ErrNotFound, "HasMany in an absent namespace")
	_, err = r.HasMany(ctx, ".bad", []blob.Digest{d1})
	wantErr(t, err, namespaces.ErrBadName, "HasMany with a bad name")
	// More digests than one query asks about.
	many := make([]blob.Digest, 1200)
	for i := range many {
		many[i] = D(1000 + i)
	}
	many[0], many[777], many[1199] = d1, d2, d1
	got, err := r.HasMany(ctx, "a", many)
	if err != nil || len(got) != len(many) {
		t.Fatalf("HasMany of %d = %d verdicts, %v", len(many), len(got), err)
	}
	for i, ok := range got {
		if ok != (i == 0 || i == 777 || i == 1199) {
			t.Fatalf("HasMany of %d: verdict %d is %v", len(many), i, ok)
		}
	}
	if n, err := r.Count(ctx, "a"); err != nil || n != 2 {
		t.Fatalf("Count = %d, %v; want 2", n, err)
	}
	if n, err := r.Count(ctx, "b"); err != nil || n != 0 {
		t.Fatalf("Count(b) = %d, %v; want 0", n, err)
	}

	// Failed calls change nothing.
	before := state(t, r, d1, d2, D(3))
	wantErr(t, r.Unlink(ctx, "a", D(3)), blob.ErrMissing, "Unlink of an absent reference")
	wantErr(t, r.Unlink(ctx, "b", d1), blob.ErrMissing, "Unlink of a reference held by another namespace")
	unchanged(t, r, before, "Unlink of an absent reference", d1, d2, D(3))
	wantErr(t, r.Remove(ctx, "a"), namespaces.ErrNotEmpty, "Remove of a non-empty namespace")
	unchanged(t, r, before, "Remove of a non-empty namespace", d1, d2, D(3))

	must(t, r.Unlink(ctx, "a", d1))
	if _, ok, _ := r.Has(ctx, "a", d1); ok {
		t.Fatal("Has after Unlink")
	}
	wantErr(t, r.Unlink(ctx, "a", d1), blob.ErrMissing, "second Unlink")
	if n, _ := r.Count(ctx, "a"); n != 1 {
		t.Fatalf("Count after Unlink = %d, want 1", n)
	}
	wantErr(t, r.Remove(ctx, "a"), namespaces.ErrNotEmpty, "Remove with one reference left")
	must(t, r.Unlink(ctx, "a", d2))
	must(t, r.Remove(ctx, "a"))
	if got := names(t, r, ""); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("Names = %q", got)
	}
}

func testLinkedAt(t *testing.T, open Opener) {
	ctx := context.Background()
	r, c := fresh(t, open)
	create(t, r, "a", "b")
	link(t, r, "a", D(1))
	c.Advance(90 * time.Minute)
	t1 := c.Now()
	link(t, r, "a", D(2))
	link(t, r, "b", D(1))
	c.Advance(time.Hour)
	link(t, r, "a", D(1)) // a re-link keeps the first time
	_, err := r.LinkMany(ctx, "a", []blob.Digest{D(1), D(2)})
	must(t, err)

	for _, tc := range []struct {
		ns   string
		d    blob.Digest
		want time.Time
	}{{"a", D(1), t0}, {"a", D(2), t1}, {"b", D(1), t1}} {
		ref, ok, err := r.Has(ctx, tc.ns, tc.d)
		if err != nil || !ok || !ref.LinkedAt.Equal(tc.want) {
			t.Fatalf("Has(%s, %s).LinkedAt = %v (%v, %v), want %v", tc.ns, tc.d.Short(), ref.LinkedAt, ok, err, tc.want)
		}
		for _, e := range entries(t, r, tc.ns, blob.Digest{}) {
			if e.Digest == tc.d && !e.LinkedAt.Equal(tc.want) {
				t.Fatalf("Entries(%s) %s LinkedAt = %v, want %v", tc.ns, tc.d.Short(), e.LinkedAt, tc.want)
			}
		}
	}
	// Unlink and link again: a new first link.
	must(t, r.Unlink(ctx, "a", D(1)))
	link(t, r, "a", D(1))
	if ref, _, _ := r.Has(ctx, "a", D(1)); !ref.LinkedAt.Equal(c.Now()) {
		t.Fatalf("LinkedAt after unlink+link = %v, want %v", ref.LinkedAt, c.Now())
	}
}

func testLinkMany(t *testing.T, open Opener) {
	ctx := context.Background()
	r, c := fresh(t, open)
	create(t, r, "a")
	link(t, r, "a", D(5))
	c.Advance(time.Second)
	in := append(ds(0, 700), D(3), D(5), D(699)) // duplicates, and one already linked
	n, err := r.LinkMany(ctx, "a", in)
	if err != nil || n != 699 {
		t.Fatalf("LinkMany = %d, %v; want 699", n, err)
	}
	if got := digests(entries(t, r, "a", blob.Digest{})); !slices.Equal(got, sorted(in)) {
		t.Fatalf("Entries after LinkMany: %d digests, want %d", len(got), len(sorted(in)))
	}
	if ref, _, _ := r.Has(ctx, "a", D(5)); !ref.LinkedAt.Equal(t0) {
		t.Fatal("LinkMany re-stamped an existing reference")
	}
	if ref, _, _ := r.Has(ctx, "a", D(6)); !ref.LinkedAt.Equal(c.Now()) {
		t.Fatalf("LinkMany LinkedAt = %v, want %v", ref.LinkedAt, c.Now())
	}
	if n, err := r.LinkMany(ctx, "a", in); err != nil || n != 0 {
		t.Fatalf("LinkMany again = %d, %v; want 0", n, err)
	}
	if n, err := r.LinkMany(ctx, "a", nil); err != nil || n != 0 {
		t.Fatalf("LinkMany(nil) = %d, %v", n, err)
	}
	if n, err := r.Count(ctx, "a"); err != nil || n != 700 {
		t.Fatalf("Count = %d, %v; want 700", n, err)
	}
}

func testEntriesResume(t *testing.T, open Opener) {
	ctx := context.Background()
	r, _ := fresh(t, open)
	create(t, r, "a", "empty")
	var lo, hi blob.Digest // the extreme keys: a listing from zero includes zero
	for i := range hi {
		hi[i] = 0xff
	}
	in := append(ds(0, 1500), lo, hi)
	_, err := r.LinkMany(ctx, "a", in)
	must(t, err)
	want := sorted(in)

	got := digests(entries(t, r, "a", blob.Digest{}))
	if !slices.Equal(got, want) {
		t.Fatalf("Entries: %d digests, want %d ascending", len(got), len(want))
	}
	// want[0] is the zero digest, from which a listing starts inclusive.
	for _, i := range []int{1, 2, 998, 999, 1000, 1001, len(want) - 2, len(want) - 1} {
		if got := digests(entries(t, r, "a", want[i])); !slices.Equal(got, want[i+1:]) {
			t.Fatalf("Entries after #%d: %d digests, want %d", i, len(got), len(want[i+1:]))
		}
	}
	// Resume after a digest that is not linked.
	probe := D(99999)
	i, _ := slices.BinarySearchFunc(want, probe, blob.Digest.Compare)
	if got := digests(entries(t, r, "a", probe)); !slices.Equal(got, want[i:]) {
		t.Fatalf("Entries after an absent digest: %d, want %d", len(got), len(want[i:]))
	}
	// Break out and resume from the last ref seen, as a paging client does.
	var chunks []blob.Digest
	for len(chunks) < len(want) {
		after := blob.Digest{}
		if len(chunks) > 0 {
			after = chunks[len(chunks)-1]
		}
		k := 0
		for ref, err := range r.Entries(ctx, "a", after) {
			must(t, err)
			chunks = append(chunks, ref.Digest)
			if k++; k == 333 {
				break
			}
		}
		if k == 0 {
			t.Fatal("resumed listing ended early")
		}
	}
	if !slices.Equal(chunks, want) {
		t.Fatal("chunked listing differs from one listing")
	}
	if got := entries(t, r, "empty", blob.Digest{}); len(got) != 0 {
		t.Fatalf("empty namespace lists %d", len(got))
	}
}

func testEntriesWhileWriting(t *testing.T, open Opener) {
	ctx := context.Background()
	r, _ := fresh(t, open)
	create(t, r, "a")
	in := ds(0, 1500)
	_, err := r.LinkMany(ctx, "a", in)
	must(t, err)
	// Unlink every yielded ref inside the loop body: an implementation that
	// holds a lock or transaction across yields deadlocks or fails here.
	seen := map[blob.Digest]bool{}
	for ref, err := range r.Entries(ctx, "a", blob.Digest{}) {
		must(t, err)
		if seen[ref.Digest] {
			t.Fatalf("%s listed twice", ref.Digest)
		}
		seen[ref.Digest] = true
		must(t, r.Unlink(ctx, "a", ref.Digest))
	}
	if len(seen) != len(in) {
		t.Fatalf("listed %d of %d while unlinking", len(seen), len(in))
	}
	if n, _ := r.Count(ctx, "a"); n != 0 {
		t.Fatalf("Count = %d after unlinking all", n)
	}
	must(t, r.Remove(ctx, "a"))
}

// refSize is what one materialized Ref costs.
const refSize = int(unsafe.Sizeof(namespaces.Ref{}))

// listBounded lists name, checking ascending order, and returns how many
// refs it saw and the largest growth of the live heap during the listing,
// measured after a forced GC every sampleEvery refs. Forcing GC makes the
// figure what the listing retains, not garbage awaiting collection.
func listBounded(ctx context.Context, r namespaces.Registry, name string, sampleEvery int) (n int, growth uint64, err error) {
	// Keep the registry reachable throughout: if it were collected
	// mid-listing, freeing it would hide what the listing retains.
	defer runtime.KeepAlive(r)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var prev blob.Digest
	for ref, err := range r.Entries(ctx, name, blob.Digest{}) {
		if err != nil {
			return n, growth, err
		}
		if n > 0 && ref.Digest.Compare(prev) <= 0 {
			return n, growth, fmt.Errorf("%s listed after %s: not ascending", ref.Digest, prev)
		}
		prev = ref.Digest
		n++
		if n%sampleEvery == 0 {
			runtime.GC()
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > base {
				growth = max(growth, ms.HeapAlloc-base)
			}
		}
	}
	return n, growth, nil
}

// growthLimit is the most a listing of n refs may retain: a quarter of
// materializing them. A page is ~1 000 refs, so a streaming listing sits
// two orders of magnitude below it.
func growthLimit(n int) uint64 { return uint64(n * refSize / 4) }

func testBoundedMemory(t *testing.T, open Opener) {
	ctx := context.Background()
	r, _ := fresh(t, open)
	create(t, r, "big")
	// Linked in ascending order, 10 000 per LinkMany: the cheapest bulk
	// load for a B-tree, which keeps this test fast on SQLite under -race.
	all := sorted(ds(0, Big))
	start := time.Now()
	for batch := range slices.Chunk(all, 10_000) {
		if _, err := r.LinkMany(ctx, "big", batch); err != nil {
			t.Fatal(err)
		}
	}
	all = nil
	linked := time.Since(start)
	if n, err := r.Count(ctx, "big"); err != nil || n != int64(Big) {
		t.Fatalf("Count = %d, %v; want %d", n, err, Big)
	}
	start = time.Now()
	n, growth, err := listBounded(ctx, r, "big", 10_000)
	must(t, err)
	if n != Big {
		t.Fatalf("listed %d, want %d", n, Big)
	}
	t.Logf("%d refs: LinkMany in ordered batches of 10 000 %v, Entries %v; live heap growth while listing %d KiB (limit %d KiB, materialized ≈ %d KiB)",
		Big, linked.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), growth>>10, growthLimit(Big)>>10, Big*refSize>>10)
	if growth > growthLimit(Big) {
		t.Fatalf("listing %d refs retained %d bytes of heap, over %d: Entries is not streaming", Big, growth, growthLimit(Big))
	}
}
