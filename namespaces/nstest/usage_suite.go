package nstest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// wantUsage fails unless the namespace's usage is blobs and bytes.
func wantUsage(t *testing.T, r namespaces.Registry, name string, blobs, bytes int64, what string) namespaces.Usage {
	t.Helper()
	u, err := r.Usage(t.Context(), name)
	if err != nil {
		t.Fatalf("%s: Usage(%q): %v", what, name, err)
	}
	if u.Blobs != blobs || u.Bytes != bytes {
		t.Fatalf("%s: Usage(%q) = %d blobs, %d bytes; want %d, %d", what, name, u.Blobs, u.Bytes, blobs, bytes)
	}
	return u
}

// wantUnique fails unless the namespace's unique usage is blobs and bytes.
func wantUnique(t *testing.T, r namespaces.Registry, name string, blobs, bytes int64, what string) {
	t.Helper()
	u, err := r.Unique(t.Context(), name)
	if err != nil {
		t.Fatalf("%s: Unique(%q): %v", what, name, err)
	}
	if u.Blobs != blobs || u.Bytes != bytes {
		t.Fatalf("%s: Unique(%q) = %d blobs, %d bytes; want %d, %d", what, name, u.Blobs, u.Bytes, blobs, bytes)
	}
}

// testUsage: a digest counts once per namespace, linked or pending or
// both, from its first link or intent to its last; a settle changes
// nothing; cancel and unlink free at once; a digest in two namespaces
// counts in both and is unique to neither.
func testUsage(t *testing.T, open Opener) {
	r, _ := fresh(t, open)
	ctx := t.Context()
	create(t, r, "a", "b")
	p := namespaces.Pending{Holder: "h", TTL: time.Minute}
	d1, d2, d3, d4 := D(1), D(2), D(3), D(4)

	wantUsage(t, r, "a", 0, 0, "a new namespace")
	if linked, err := r.LinkSized(ctx, "a", d1, 100); err != nil || !linked {
		t.Fatalf("LinkSized = %v, %v", linked, err)
	}
	wantUsage(t, r, "a", 1, 100, "after a link")
	if linked, err := r.LinkSized(ctx, "a", d1, 100); err != nil || linked {
		t.Fatalf("re-LinkSized = %v, %v; want false, nil", linked, err)
	}
	wantUsage(t, r, "a", 1, 100, "after a re-link (a dedup)")

	p.Size = 50
	i1, err := r.Pend(ctx, "a", d2, p)
	must(t, err)
	wantUsage(t, r, "a", 2, 150, "after an intent: it counts from its recording")
	i2, err := r.Pend(ctx, "a", d2, p)
	must(t, err)
	wantUsage(t, r, "a", 2, 150, "after a second intent of the same digest")
	if linked, err := r.Settle(ctx, i1); err != nil || !linked {
		t.Fatalf("Settle = %v, %v", linked, err)
	}
	wantUsage(t, r, "a", 2, 150, "after settling one intent into a link")
	must(t, r.Cancel(ctx, i2))
	wantUsage(t, r, "a", 2, 150, "after canceling the other: the link still holds the digest")

	p.Size = 10
	i3, err := r.Pend(ctx, "a", d3, p)
	must(t, err)
	wantUsage(t, r, "a", 3, 160, "after an intent of a third digest")
	must(t, r.Cancel(ctx, i3))
	wantUsage(t, r, "a", 2, 150, "after canceling it: freed at once")
	must(t, r.Cancel(ctx, i3))
	wantUsage(t, r, "a", 2, 150, "after canceling it again")

	must(t, r.Unlink(ctx, "a", d2))
	wantUsage(t, r, "a", 1, 100, "after an unlink: freed at once")
	wantErr(t, r.Unlink(ctx, "a", d2), blob.ErrMissing, "Unlink of an absent reference")
	wantUsage(t, r, "a", 1, 100, "after a failed unlink")

	// An intent of a linked digest: the unlink leaves it held.
	p.Size = 100
	i4, err := r.Pend(ctx, "a", d1, p)
	must(t, err)
	must(t, r.Unlink(ctx, "a", d1))
	wantUsage(t, r, "a", 1, 100, "after unlinking a digest an intent still names")
	must(t, r.Cancel(ctx, i4))
	wantUsage(t, r, "a", 0, 0, "after canceling that intent")

	// Two namespaces sharing a digest: it counts in both, unique in
	// neither.
	_, err = r.LinkSized(ctx, "a", d1, 100)
	must(t, err)
	_, err = r.LinkSized(ctx, "b", d1, 100)
	must(t, err)
	_, err = r.LinkSized(ctx, "b", d4, 7)
	must(t, err)
	p.Size = 3
	_, err = r.Pend(ctx, "a", d3, p)
	must(t, err)
	wantUsage(t, r, "a", 2, 103, "a, sharing d1 with b")
	wantUsage(t, r, "b", 2, 107, "b, sharing d1 with a")
	wantUnique(t, r, "a", 1, 3, "a: only its intent's digest is its own")
	wantUnique(t, r, "b", 1, 7, "b: only d4 is its own")
	_, err = r.Pend(ctx, "b", d3, p)
	must(t, err)
	wantUnique(t, r, "a", 0, 0, "a, once b pends d3 too")

	// Recover settles without changing usage.
	n, err := r.Recover(ctx, "h")
	if err != nil || n != 2 {
		t.Fatalf("Recover = %d, %v; want 2", n, err)
	}
	wantUsage(t, r, "a", 2, 103, "a after Recover")
	wantUsage(t, r, "b", 3, 110, "b after Recover")

	_, err = r.Usage(ctx, "nope")
	wantErr(t, err, namespaces.ErrNotFound, "Usage of an absent namespace")
	_, err = r.Usage(ctx, "bad/name")
	wantErr(t, err, namespaces.ErrBadName, "Usage of a bad name")
	_, err = r.Unique(ctx, "nope")
	wantErr(t, err, namespaces.ErrNotFound, "Unique of an absent namespace")
	_, err = r.Unique(ctx, "bad/name")
	wantErr(t, err, namespaces.ErrBadName, "Unique of a bad name")
	for _, d := range []blob.Digest{d1, d3} {
		must(t, r.Unlink(ctx, "a", d))
	}
	must(t, r.Remove(ctx, "a"))
	create(t, r, "a")
	wantUsage(t, r, "a", 0, 0, "a namespace re-created")
}

// testQuota: under, at and over the limit for bytes and blobs; a dedup
// costs nothing and is never refused; a refused link or intent changes
// nothing; unlink frees room at once; a quota below the usage refuses
// growth only; LinkManySized is all or nothing; an intent replacing
// another is admitted after the replaced one is freed.
func testQuota(t *testing.T, open Opener) {
	r, _ := fresh(t, open)
	ctx := t.Context()
	create(t, r, "q")
	p := namespaces.Pending{Holder: "h", TTL: time.Minute}
	wantErr(t, r.SetQuota(ctx, "nope", namespaces.Quota{Bytes: 1}), namespaces.ErrNotFound, "SetQuota of an absent namespace")
	wantErr(t, r.SetQuota(ctx, "bad/name", namespaces.Quota{Bytes: 1}), namespaces.ErrBadName, "SetQuota of a bad name")
	if err := r.SetQuota(ctx, "q", namespaces.Quota{Bytes: -1}); err == nil {
		t.Fatal("SetQuota of a negative limit succeeded")
	}
	q := namespaces.Quota{Bytes: 100, Blobs: 3}
	must(t, r.SetQuota(ctx, "q", q))
	if u := wantUsage(t, r, "q", 0, 0, "after SetQuota"); u.Quota != q {
		t.Fatalf("Usage.Quota = %+v; want %+v", u.Quota, q)
	}

	_, err := r.LinkSized(ctx, "q", D(1), 60)
	must(t, err) // under
	_, err = r.LinkSized(ctx, "q", D(2), 40)
	must(t, err) // at the byte limit
	before := state(t, r, D(3))
	_, err = r.LinkSized(ctx, "q", D(3), 1)
	wantErr(t, err, blob.ErrQuota, "a link one byte over the quota")
	unchanged(t, r, before, "a link over the quota", D(3))
	p.Size = 1
	_, err = r.Pend(ctx, "q", D(3), p)
	wantErr(t, err, blob.ErrQuota, "an intent one byte over the quota")
	unchanged(t, r, before, "an intent over the quota", D(3))
	wantUsage(t, r, "q", 2, 100, "after refusals")

	// Dedups at the limit.
	if linked, err := r.LinkSized(ctx, "q", D(1), 60); err != nil || linked {
		t.Fatalf("a dedup link at the limit = %v, %v; want false, nil", linked, err)
	}
	p.Size = 60
	i, err := r.Pend(ctx, "q", D(1), p)
	if err != nil {
		t.Fatalf("a dedup intent at the limit: %v", err)
	}
	if _, err := r.Settle(ctx, i); err != nil {
		t.Fatal(err)
	}
	wantUsage(t, r, "q", 2, 100, "after dedups at the limit")

	// Unlink frees room at once.
	must(t, r.Unlink(ctx, "q", D(2)))
	_, err = r.LinkSized(ctx, "q", D(3), 40)
	must(t, err)
	wantUsage(t, r, "q", 2, 100, "after freeing and refilling")

	// Blobs: under, at, over.
	q = namespaces.Quota{Blobs: 3}
	must(t, r.SetQuota(ctx, "q", q))
	_, err = r.LinkSized(ctx, "q", D(4), 1000)
	must(t, err)
	before = state(t, r, D(5))
	_, err = r.LinkSized(ctx, "q", D(5), 0)
	wantErr(t, err, blob.ErrQuota, "a fourth blob under a three-blob quota")
	unchanged(t, r, before, "a link over the blob quota", D(5))
	wantUsage(t, r, "q", 3, 1100, "at the blob limit")

	// A quota below the usage: allowed; growth is refused, nothing goes.
	must(t, r.SetQuota(ctx, "q", namespaces.Quota{Blobs: 1}))
	wantUsage(t, r, "q", 3, 1100, "after lowering the quota below the usage")
	_, err = r.LinkSized(ctx, "q", D(5), 0)
	wantErr(t, err, blob.ErrQuota, "growth over a lowered quota")
	_, err = r.LinkSized(ctx, "q", D(4), 1000)
	must(t, err) // a dedup still works
	must(t, r.Unlink(ctx, "q", D(4)))
	_, err = r.LinkSized(ctx, "q", D(5), 0)
	wantErr(t, err, blob.ErrQuota, "growth still over the lowered quota")
	must(t, r.SetQuota(ctx, "q", namespaces.Quota{}))
	_, err = r.LinkSized(ctx, "q", D(5), 0)
	must(t, err) // cleared
	wantUsage(t, r, "q", 3, 100, "after clearing the quota")

	// LinkManySized: all or nothing, dedups free.
	must(t, r.SetQuota(ctx, "q", namespaces.Quota{Bytes: 110}))
	before = state(t, r, D(6), D(7))
	_, err = r.LinkManySized(ctx, "q", []namespaces.Sized{{Digest: D(6), Size: 5}, {Digest: D(7), Size: 6}})
	wantErr(t, err, blob.ErrQuota, "LinkManySized over the quota")
	unchanged(t, r, before, "LinkManySized over the quota", D(6), D(7))
	n, err := r.LinkManySized(ctx, "q", []namespaces.Sized{{Digest: D(6), Size: 5}, {Digest: D(1), Size: 60}, {Digest: D(6), Size: 5}})
	if err != nil || n != 1 {
		t.Fatalf("LinkManySized of a new digest (twice) and a linked one = %d, %v; want 1", n, err)
	}
	wantUsage(t, r, "q", 4, 105, "after LinkManySized")

	// An intent replacing another is admitted once the other is freed;
	// a refused one leaves the replaced one in place.
	p.Size = 5
	i1, err := r.Pend(ctx, "q", D(8), p)
	must(t, err)
	wantUsage(t, r, "q", 5, 110, "at the limit with an intent")
	p.Replaces = i1
	i2, err := r.Pend(ctx, "q", D(9), p)
	if err != nil {
		t.Fatalf("an intent of 5 bytes replacing one of 5 at the limit: %v", err)
	}
	wantUsage(t, r, "q", 5, 110, "after the replacement")
	p.Replaces, p.Size = i2, 6
	_, err = r.Pend(ctx, "q", D(10), p)
	wantErr(t, err, blob.ErrQuota, "an intent of 6 bytes replacing one of 5 at the limit")
	wantUsage(t, r, "q", 5, 110, "after the refused replacement")
	if linked, err := r.Settle(ctx, i2); err != nil || !linked {
		t.Fatalf("Settle of the intent a refused one would have replaced = %v, %v; want true", linked, err)
	}
	wantUsage(t, r, "q", 5, 110, "after settling it")
}

// testQuotaRace: writers racing for the last bytes of a quota, through
// links and intents at once: exactly as many succeed as fit.
func testQuotaRace(t *testing.T, open Opener) {
	r, _ := fresh(t, open)
	raceForQuota(t, []namespaces.Registry{r})
}

// raceForQuota runs 24 writers spread over regs (one store, as several
// hosts see it) linking or pending distinct 10-byte digests into a
// namespace with room for 7 of them, after 3 are already there.
func raceForQuota(t *testing.T, regs []namespaces.Registry) {
	ctx := t.Context()
	const size, room, writers = 10, 7, 24
	create(t, regs[0], "race")
	for k := range 3 {
		_, err := regs[0].LinkSized(ctx, "race", D(1000+k), size)
		must(t, err)
	}
	must(t, regs[0].SetQuota(ctx, "race", namespaces.Quota{Bytes: (3 + room) * size}))
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	start := make(chan struct{})
	for w := range writers {
		r := regs[w%len(regs)]
		wg.Go(func() {
			<-start
			var err error
			if w%2 == 0 {
				_, err = r.LinkSized(ctx, "race", D(2000+w), size)
			} else {
				_, err = r.Pend(ctx, "race", D(2000+w), namespaces.Pending{Holder: "racer", TTL: time.Minute, Size: size})
			}
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, blob.ErrQuota):
				refused.Add(1)
			default:
				errs <- fmt.Errorf("writer %d: %w", w, err)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if ok.Load() != room || refused.Load() != writers-room {
		t.Fatalf("%d writers succeeded and %d were refused; want %d and %d", ok.Load(), refused.Load(), room, writers-room)
	}
	for _, r := range regs {
		wantUsage(t, r, "race", 3+room, (3+room)*size, "after the race")
	}
	if n, err := regs[0].Recount(ctx); err != nil || n != 0 {
		t.Fatalf("Recount after the race = %d, %v; want 0 fixed: the counters were exact", n, err)
	}
}

// Damager sets a namespace's usage counters to wrong values behind the
// registry's back (as a bug or a hand edit would), for the test of
// Recount.
type Damager func(t *testing.T, r namespaces.Registry, name string, blobs, bytes int64)

// Hosts opens n registries on one store, as n processes or hosts would;
// for a store only one process can open (Mem), n times the same one.
type Hosts func(t *testing.T, n int) []namespaces.Registry

// RunUsage runs the usage tests that need more than one registry on a
// store or a way to damage its counters: writers on several hosts racing
// for the last bytes of a quota, and Recount repairing damaged counters.
func RunUsage(t *testing.T, hosts Hosts, damage Damager) {
	t.Run("QuotaRaceHosts", func(t *testing.T) { raceForQuota(t, hosts(t, 2)) })
	t.Run("Recount", func(t *testing.T) {
		r := hosts(t, 1)[0]
		ctx := t.Context()
		create(t, r, "x", "y")
		_, err := r.LinkSized(ctx, "x", D(1), 10)
		must(t, err)
		_, err = r.Pend(ctx, "x", D(2), namespaces.Pending{Holder: "h", TTL: time.Minute, Size: 20})
		must(t, err)
		_, err = r.Pend(ctx, "x", D(1), namespaces.Pending{Holder: "h", TTL: time.Minute, Size: 10})
		must(t, err)
		_, err = r.LinkSized(ctx, "y", D(1), 10)
		must(t, err)
		if n, err := r.Recount(ctx); err != nil || n != 0 {
			t.Fatalf("Recount of exact counters = %d, %v; want 0", n, err)
		}
		damage(t, r, "x", 7, -5)
		wantUsage(t, r, "x", 7, -5, "damaged")
		if n, err := r.Recount(ctx); err != nil || n != 1 {
			t.Fatalf("Recount of one damaged namespace = %d, %v; want 1", n, err)
		}
		wantUsage(t, r, "x", 2, 30, "recounted")
		wantUsage(t, r, "y", 1, 10, "the other namespace")
	})
}
