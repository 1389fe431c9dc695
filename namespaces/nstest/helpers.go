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
	"slices"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

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
