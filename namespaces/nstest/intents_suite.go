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
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// testIntents: an intent keeps its digest live without showing it; Settle
// links it once, Cancel and Replaces drop it unseen, Recover settles a
// holder's intents and lapsed ones — lapsed on the registry's own clock,
// after their TTL, which the registry's Clock (it stamps links) does not
// shorten.
func testIntents(t *testing.T, open Opener) {
	r, clock := fresh(t, open)
	ctx := t.Context()
	create(t, r, "a", "b")
	d1, d2, d3 := D(1), D(2), D(3)
	p := namespaces.Pending{Holder: "h1", TTL: time.Minute}

	before := state(t, r, d1)
	if _, err := r.Pend(ctx, "nope", d1, p); !errors.Is(err, namespaces.ErrNotFound) {
		t.Fatalf("Pend into an absent namespace = %v; want ErrNotFound", err)
	}
	unchanged(t, r, before, "Pend into an absent namespace", d1)

	i1, err := r.Pend(ctx, "a", d1, p)
	if err != nil || i1 == 0 {
		t.Fatalf("Pend = %v, %v", i1, err)
	}
	if _, ok, _ := r.Has(ctx, "a", d1); ok {
		t.Fatal("a pending digest shows in its namespace")
	}
	if got := entries(t, r, "a", blob.Digest{}); len(got) != 0 {
		t.Fatalf("Entries lists a pending digest: %v", got)
	}
	if ok, err := r.IsLive(ctx, d1); !ok || err != nil {
		t.Fatalf("IsLive(pending) = %v, %v; want live", ok, err)
	}
	if got := live(t, r); !slices.Equal(got, []blob.Digest{d1}) {
		t.Fatalf("Live = %v; want the pending digest", got)
	}
	if bs, ok := r.(interface {
		LiveAmong(context.Context, []blob.Digest) (map[blob.Digest]bool, error)
	}); ok {
		if live, err := bs.LiveAmong(ctx, []blob.Digest{d1, d2}); err != nil || !live[d1] || live[d2] {
			t.Fatalf("LiveAmong = %v, %v; want the pending digest only", live, err)
		}
	}
	if err := r.Remove(ctx, "a"); !errors.Is(err, namespaces.ErrNotEmpty) {
		t.Fatalf("Remove of a namespace with an intent = %v; want ErrNotEmpty", err)
	}

	// A newer version replaces the intent: the old one never shows.
	i2, err := r.Pend(ctx, "a", d2, namespaces.Pending{Holder: "h1", TTL: time.Minute, Replaces: i1})
	must(t, err)
	if ok, _ := r.IsLive(ctx, d1); ok {
		t.Fatal("a replaced intent keeps its digest live")
	}
	if linked, err := r.Settle(ctx, i1); linked || err != nil {
		t.Fatalf("Settle of a replaced intent = %v, %v; want nothing", linked, err)
	}
	if linked, err := r.Settle(ctx, i2); !linked || err != nil {
		t.Fatalf("Settle = %v, %v; want linked", linked, err)
	}
	if got := digests(entries(t, r, "a", blob.Digest{})); !slices.Equal(got, []blob.Digest{d2}) {
		t.Fatalf("after Settle, a lists %v; want only the final version", got)
	}
	if linked, err := r.Settle(ctx, i2); linked || err != nil {
		t.Fatalf("second Settle = %v, %v; want nothing", linked, err)
	}
	// Settling onto a reference already there adds nothing and keeps it.
	i3, err := r.Pend(ctx, "a", d2, p)
	must(t, err)
	if linked, err := r.Settle(ctx, i3); linked || err != nil {
		t.Fatalf("Settle onto an existing reference = %v, %v", linked, err)
	}
	// Cancel drops without linking, twice is fine.
	i4, err := r.Pend(ctx, "b", d3, p)
	must(t, err)
	must(t, r.Cancel(ctx, i4))
	must(t, r.Cancel(ctx, i4))
	if ok, _ := r.IsLive(ctx, d3); ok {
		t.Fatal("a canceled intent keeps its digest live")
	}
	must(t, r.Remove(ctx, "b"))

	// Recover: a holder's own intents at once, others' once lapsed. No
	// test can move the registry's clock for intents: watch a short TTL
	// pass.
	const ttl = 500 * time.Millisecond
	create(t, r, "c")
	start := time.Now()
	_, err = r.Pend(ctx, "c", d1, namespaces.Pending{Holder: "h1", TTL: ttl})
	must(t, err)
	_, err = r.Pend(ctx, "c", d3, namespaces.Pending{Holder: "h2", TTL: ttl})
	must(t, err)
	if hs, err := r.Holders(ctx); err != nil || len(hs) != 2 {
		t.Fatalf("Holders = %v, %v; want h1 and h2", hs, err)
	}
	must(t, r.Renew(ctx, "h2", time.Hour))
	// The Clock runs two hours ahead of the intents: it lapses nothing.
	clock.Advance(2 * time.Hour)
	if n, err := r.Recover(ctx, "h3"); n != 0 || err != nil {
		t.Fatalf("Recover before any lapse = %d, %v; want 0 (the registry's Clock, 2 h ahead, must not lapse intents)", n, err)
	}
	for {
		n, err := r.Recover(ctx, "h3")
		must(t, err)
		if n == 1 {
			break
		}
		if n != 0 {
			t.Fatalf("Recover once h1's intent lapsed = %d; want 1 (h2's was renewed)", n)
		}
		if time.Since(start) > ttl+10*time.Second {
			t.Fatalf("h1's intent, with a TTL of %s, has not lapsed after %s", ttl, time.Since(start))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := time.Since(start); d < ttl {
		t.Fatalf("an intent with a TTL of %s lapsed after %s", ttl, d)
	}
	if got := digests(entries(t, r, "c", blob.Digest{})); !slices.Equal(got, []blob.Digest{d1}) {
		t.Fatalf("after recovering lapsed intents, c lists %v; want d1", got)
	}
	if n, err := r.Recover(ctx, "h2"); n != 1 || err != nil {
		t.Fatalf("Recover of h2's own = %d, %v; want 1", n, err)
	}
	if got := entries(t, r, "c", blob.Digest{}); len(got) != 2 {
		t.Fatalf("after recovery c lists %v; want both", got)
	}
}
