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
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// Opener returns a fresh, empty registry whose clock is c.
type Opener func(t *testing.T, c namespaces.Clock) namespaces.Registry

// Big is how many references the bounded-memory listing test links: large
// enough that materializing them (≈1.4 MB of Refs; 5.6 MB for the 100 000
// of make test-long, ALKBLOBFS_LONG=1) dwarfs one page and the live
// heap's noise (under 100 KiB while listing).
var Big = func() int {
	if os.Getenv("ALKBLOBFS_LONG") == "1" {
		return 100_000
	}
	return 25_000
}()

// t0 is the suite's epoch: an arbitrary instant with nanoseconds, so that a
// registry that truncates linked_at fails.
var t0 = time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.UTC)

// Run runs the conformance suite. Subtests run one after another: the
// memory test reads process-wide heap statistics.
func Run(t *testing.T, open Opener) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T, Opener)
	}{
		{"Namespaces", testNamespaces},
		{"NamesPaged", testNamesPaged},
		{"BadNames", testBadNames},
		{"Perms", testPerms},
		{"LinkUnlink", testLinkUnlink},
		{"LinkedAt", testLinkedAt},
		{"LinkMany", testLinkMany},
		{"Intents", testIntents},
		{"Usage", testUsage},
		{"Quota", testQuota},
		{"QuotaRace", testQuotaRace},
		{"EntriesOrderAndResume", testEntriesResume},
		{"EntriesWhileWriting", testEntriesWhileWriting},
		{"EntriesBoundedMemory", testBoundedMemory},
		{"Liveness", testLiveness},
		{"LiveDistinctPaged", testLiveDistinctPaged},
		{"LiveAmong", testLiveAmong},
		{"ConcurrentLink", testConcurrentLink},
		{"LinkRemoveRace", testLinkRemoveRace},
		{"Canceled", testCanceled},
		{"ModelWalk", testWalk},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, open) })
	}
}

// testPerms: a namespace's Perm is recorded by CreatePerm and SetPerm,
// absent after Create, and gone with the namespace.
func testPerms(t *testing.T, open Opener) {
	ctx := context.Background()
	r, _ := fresh(t, open)
	create(t, r, "plain")
	if p, ok, err := r.Perm(ctx, "plain"); err != nil || ok {
		t.Fatalf("Perm after Create = %+v, %v, %v; want none", p, ok, err)
	}
	want := namespaces.Perm{Uid: 1001, Gid: 4294967294, Mode: 0o2750}
	must(t, r.CreatePerm(ctx, "owned", namespaces.Perm{Uid: want.Uid, Gid: want.Gid, Mode: 0o40000 | want.Mode}))
	if p, ok, err := r.Perm(ctx, "owned"); err != nil || !ok || p != want {
		t.Fatalf("Perm after CreatePerm = %+v, %v, %v; want %+v (type bits dropped)", p, ok, err, want)
	}
	wantErr(t, r.CreatePerm(ctx, "owned", want), namespaces.ErrExists, "CreatePerm of an existing namespace")
	set := namespaces.Perm{Uid: 0, Gid: 0, Mode: 0o700}
	must(t, r.SetPerm(ctx, "plain", set))
	if p, ok, err := r.Perm(ctx, "plain"); err != nil || !ok || p != set {
		t.Fatalf("Perm after SetPerm = %+v, %v, %v; want %+v", p, ok, err, set)
	}
	// Mode 0 is a mode, not the absence of one (a mount shows it as 0000:
	// issue 35), and the set-id and sticky bits are kept.
	zero := namespaces.Perm{Uid: 7, Gid: 8, Mode: 0}
	must(t, r.CreatePerm(ctx, "zero", zero))
	for _, m := range []uint32{0, 0o7777, 0o1000, 0o2775} {
		if m != 0 {
			zero.Mode = m
			must(t, r.SetPerm(ctx, "zero", zero))
		}
		if p, ok, err := r.Perm(ctx, "zero"); err != nil || !ok || p != zero {
			t.Fatalf("Perm after recording mode %04o = %+v, %v, %v; want %+v", m, p, ok, err, zero)
		}
	}
	_, _, err := r.Perm(ctx, "nope")
	wantErr(t, err, namespaces.ErrNotFound, "Perm of an absent namespace")
	wantErr(t, r.SetPerm(ctx, "nope", set), namespaces.ErrNotFound, "SetPerm of an absent namespace")
	_, _, err = r.Perm(ctx, "bad/name")
	wantErr(t, err, namespaces.ErrBadName, "Perm of a bad name")
	wantErr(t, r.SetPerm(ctx, "bad/name", set), namespaces.ErrBadName, "SetPerm of a bad name")
	must(t, r.Remove(ctx, "owned"))
	create(t, r, "owned")
	if p, ok, err := r.Perm(ctx, "owned"); err != nil || ok {
		t.Fatalf("Perm of a namespace re-created with Create = %+v, %v, %v; want none (not the old one's)", p, ok, err)
	}
}

func testNamespaces(t *testing.T, open Opener) {
	ctx := context.Background()
	r, _ := fresh(t, open)
	if got := names(t, r, ""); len(got) != 0 {
		t.Fatalf("new registry lists %q", got)
	}
	// Byte order, not locale order: '-' < '.' < digits < upper < '_' < lower.
	create(t, r, "zeta", "Alpha", "alpha", "a_b", "a-b", "a.b", "9lives", "incoming")
	want := []string{"9lives", "Alpha", "a-b", "a.b", "a_b", "alpha", "incoming", "zeta"}
	if got := names(t, r, ""); !slices.Equal(got, want) {
		t.Fatalf("Names = %q, want %q", got, want)
	}
	if got := names(t, r, "a.b"); !slices.Equal(got, want[4:]) {
		t.Fatalf("Names after a.b = %q, want %q", got, want[4:])
	}
	if got := names(t, r, "b"); !slices.Equal(got, want[6:]) {
		t.Fatalf("Names after b (absent) = %q, want %q", got, want[6:])
	}
	for _, n := range want {
		if ok, err := r.Exists(ctx, n); err != nil || !ok {
			t.Fatalf("Exists(%q) = %v, %v", n, ok, err)
		}
	}
	if ok, err := r.Exists(ctx, "nope"); err != nil || ok {
		t.Fatalf("Exists(nope) = %v, %v", ok, err)
	}

	before := state(t, r)
	wantErr(t, r.Create(ctx, "alpha"), namespaces.ErrExists, "Create of an existing namespace")
	unchanged(t, r, before, "Create of an existing namespace")
	wantErr(t, r.Remove(ctx, "nope"), namespaces.ErrNotFound, "Remove of an absent namespace")
	unchanged(t, r, before, "Remove of an absent namespace")

	must(t, r.Remove(ctx, "alpha"))
	want = slices.DeleteFunc(want, func(s string) bool { return s == "alpha" })
	if got := names(t, r, ""); !slices.Equal(got, want) {
		t.Fatalf("Names after Remove = %q, want %q", got, want)
	}
	if ok, _ := r.Exists(ctx, "alpha"); ok {
		t.Fatal("removed namespace still exists")
	}
	wantErr(t, r.Remove(ctx, "alpha"), namespaces.ErrNotFound, "second Remove")
	must(t, r.Create(ctx, "alpha")) // the name is free again
	if n, err := r.Count(ctx, "alpha"); err != nil || n != 0 {
		t.Fatalf("re-created namespace: Count = %d, %v", n, err)
	}

	// Every namespace-specific call on an absent namespace is ErrNotFound.
	before = state(t, r, D(1))
	_, err := r.Link(ctx, "nope", D(1))
	wantErr(t, err, namespaces.ErrNotFound, "Link into an absent namespace")
	_, err = r.LinkMany(ctx, "nope", ds(0, 3))
	wantErr(t, err, namespaces.ErrNotFound, "LinkMany into an absent namespace")
	wantErr(t, r.Unlink(ctx, "nope", D(1)), namespaces.ErrNotFound, "Unlink from an absent namespace")
	_, _, err = r.Has(ctx, "nope", D(1))
	wantErr(t, err, namespaces.ErrNotFound, "Has in an absent namespace")
	_, err = r.Count(ctx, "nope")
	wantErr(t, err, namespaces.ErrNotFound, "Count of an absent namespace")
	for _, err := range r.Entries(ctx, "nope", blob.Digest{}) {
		wantErr(t, err, namespaces.ErrNotFound, "Entries of an absent namespace")
	}
	unchanged(t, r, before, "calls on an absent namespace", D(1))
}

func testNamesPaged(t *testing.T, open Opener) {
	r, _ := fresh(t, open)
	const n = 1500 // two pages
	var want []string
	for _, i := range rand.New(rand.NewPCG(1, 2)).Perm(n) {
		name := fmt.Sprintf("ns-%05d", i)
		create(t, r, name)
		want = append(want, name)
	}
	slices.Sort(want)
	if got := names(t, r, ""); !slices.Equal(got, want) {
		t.Fatalf("Names: %d names, want %d in order", len(got), len(want))
	}
	// One sequence ranged twice starts at its after both times.
	seq := r.Names(context.Background(), "")
	for run := range 2 {
		var got []string
		for name, err := range seq {
			must(t, err)
			got = append(got, name)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("Names, ranged a %d. time: %d names, want %d in order", run+1, len(got), len(want))
		}
	}
	for _, i := range []int{0, 998, 999, 1000, 1001, n - 2, n - 1} {
		if got := names(t, r, want[i]); !slices.Equal(got, want[i+1:]) {
			t.Fatalf("Names after %s: %d names, want %d", want[i], len(got), len(want[i+1:]))
		}
	}
	// Stopping early and resuming from the last name seen.
	var got []string
	for len(got) < n {
		after := ""
		if len(got) > 0 {
			after = got[len(got)-1]
		}
		k := 0
		for name, err := range r.Names(context.Background(), after) {
			must(t, err)
			got = append(got, name)
			if k++; k == 700 {
				break
			}
		}
	}
	if !slices.Equal(got, want) {
		t.Fatal("Names resumed in chunks of 700 differs from one listing")
	}
}

// BadNames are names every entry point must refuse with ErrBadName.
var BadNames = []string{
	"", ".", "..", ".alkblobfs", ".hidden", "a/b", "/", "a b", "a\x00b", "a\nb",
	"caf\u00e9", "a*", "a:b", "a\\b", strings.Repeat("x", namespaces.MaxNameLen+1),
}

// GoodNames are edge cases every registry must accept.
var GoodNames = []string{
	"a", "A", "0", "-", "_", "a.", "-rf", "incoming", "a..b", strings.Repeat("x", namespaces.MaxNameLen),
}

func testBadNames(t *testing.T, open Opener) {
	ctx := context.Background()
	r, _ := fresh(t, open)
	create(t, r, "ok")
	link(t, r, "ok", D(1))
	for _, n := range GoodNames {
		if err := namespaces.ValidName(n); err != nil {
			t.Fatalf("ValidName(%q) = %v", n, err)
		}
		must(t, r.Create(ctx, n))
		link(t, r, n, D(2))
		must(t, r.Unlink(ctx, n, D(2)))
		must(t, r.Remove(ctx, n))
	}
	before := state(t, r, D(1), D(2))
	for _, n := range BadNames {
		what := fmt.Sprintf("name %q", n)
		if err := namespaces.ValidName(n); !errors.Is(err, namespaces.ErrBadName) {
			t.Fatalf("ValidName(%q) = %v, want ErrBadName", n, err)
		}
		wantErr(t, r.Create(ctx, n), namespaces.ErrBadName, "Create "+what)
		wantErr(t, r.Remove(ctx, n), namespaces.ErrBadName, "Remove "+what)
		_, err := r.Exists(ctx, n)
		wantErr(t, err, namespaces.ErrBadName, "Exists "+what)
		_, err = r.Link(ctx, n, D(2))
		wantErr(t, err, namespaces.ErrBadName, "Link "+what)
		_, err = r.LinkMany(ctx, n, ds(2, 4))
		wantErr(t, err, namespaces.ErrBadName, "LinkMany "+what)
		wantErr(t, r.Unlink(ctx, n, D(1)), namespaces.ErrBadName, "Unlink "+what)
		_, _, err = r.Has(ctx, n, D(1))
		wantErr(t, err, namespaces.ErrBadName, "Has "+what)
		_, err = r.Count(ctx, n)
		wantErr(t, err, namespaces.ErrBadName, "Count "+what)
		k := 0
		for _, err := range r.Entries(ctx, n, blob.Digest{}) {
			wantErr(t, err, namespaces.ErrBadName, "Entries "+what)
			k++
		}
		if k != 1 {
			t.Fatalf("Entries %s yielded %d pairs, want exactly the error", what, k)
		}
	}
	unchanged(t, r, before, "calls with bad names", D(1), D(2))
}
