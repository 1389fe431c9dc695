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
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// Opener returns a fresh, empty registry whose clock is c.
type Opener func(t *testing.T, c namespaces.Clock) namespaces.Registry

// Big is how many references the bounded-memory listing test links: large
// enough that materializing them (≈5.6 MB of Refs) dwarfs one page.
const Big = 100_000

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

// D returns the i-th test digest. Digests are hashes, so their order is
// unrelated to i.
func D(i int) blob.Digest { return blob.Sum([]byte(fmt.Sprintf("nstest %d", i))) }

func ds(from, to int) []blob.Digest {
	out := make([]blob.Digest, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, D(i))
	}
	return out
}

func sorted(ds []blob.Digest) []blob.Digest {
	out := slices.Clone(ds)
	slices.SortFunc(out, blob.Digest.Compare)
	return slices.Compact(out)
}

func fresh(t *testing.T, open Opener) (namespaces.Registry, *Clock) {
	t.Helper()
	c := NewClock(t0)
	return open(t, c), c
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantErr(t *testing.T, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want errors.Is(%v)", what, err, target)
	}
	var e *namespaces.Error
	if !errors.As(err, &e) {
		t.Fatalf("%s: err %v is not a *namespaces.Error", what, err)
	}
}

func create(t *testing.T, r namespaces.Registry, names ...string) {
	t.Helper()
	for _, n := range names {
		must(t, r.Create(context.Background(), n))
	}
}

func link(t *testing.T, r namespaces.Registry, name string, ds ...blob.Digest) {
	t.Helper()
	for _, d := range ds {
		if _, err := r.Link(context.Background(), name, d); err != nil {
			t.Fatal(err)
		}
	}
}

func names(t *testing.T, r namespaces.Registry, after string) []string {
	t.Helper()
	var out []string
	for n, err := range r.Names(context.Background(), after) {
		must(t, err)
		out = append(out, n)
	}
	return out
}

func entries(t *testing.T, r namespaces.Registry, name string, after blob.Digest) []namespaces.Ref {
	t.Helper()
	var out []namespaces.Ref
	for ref, err := range r.Entries(context.Background(), name, after) {
		must(t, err)
		out = append(out, ref)
	}
	return out
}

func digests(refs []namespaces.Ref) []blob.Digest {
	out := make([]blob.Digest, len(refs))
	for i, r := range refs {
		out[i] = r.Digest
	}
	return out
}

func live(t *testing.T, r namespaces.Registry) []blob.Digest {
	t.Helper()
	var out []blob.Digest
	for d, err := range r.Live(context.Background()) {
		must(t, err)
		out = append(out, d)
	}
	return out
}

// state renders everything observable about a small registry, for
// "a failed call changes nothing" checks.
func state(t *testing.T, r namespaces.Registry, probes ...blob.Digest) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	for _, n := range names(t, r, "") {
		c, err := r.Count(ctx, n)
		must(t, err)
		fmt.Fprintf(&b, "ns %s count=%d\n", n, c)
		for _, ref := range entries(t, r, n, blob.Digest{}) {
			fmt.Fprintf(&b, "  %s %d\n", ref.Digest, ref.LinkedAt.UnixNano())
		}
	}
	for _, d := range live(t, r) {
		fmt.Fprintf(&b, "live %s\n", d)
	}
	for _, d := range probes {
		ok, err := r.IsLive(ctx, d)
		must(t, err)
		fmt.Fprintf(&b, "islive %s %v\n", d.Short(), ok)
	}
	return b.String()
}

func unchanged(t *testing.T, r namespaces.Registry, before, what string, probes ...blob.Digest) {
	t.Helper()
	if after := state(t, r, probes...); after != before {
		t.Fatalf("%s changed the registry:\nbefore:\n%s\nafter:\n%s", what, before, after)
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
	if n, err := r.Count(ctx, "big"); err != nil || n != Big {
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
