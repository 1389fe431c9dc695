package nstest

import (
	"context"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// Pair returns two fresh registries over one shared, empty state (two
// hosts of one database), each a namespaces.Watcher.
type Pair func(t *testing.T) (a, b namespaces.Registry)

// watchWait bounds every wait for a change: delivery takes milliseconds;
// this is for a loaded machine.
const watchWait = 10 * time.Second

// RunWatch is the conformance suite of namespaces.Watcher: b's Watch
// starts with a Resync, then reports exactly the changes a commits that
// make a cached view wrong (created, perm changed, unlinked, removed), in
// order; never a change that failed, a link, or one b made itself; and
// its channel closes once its context ends.
func RunWatch(t *testing.T, pair Pair) {
	a, b := pair(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch, err := b.(namespaces.Watcher).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c := NextChange(t, ch); c.Kind != namespaces.Resync {
		t.Fatalf("first change %v, want a resync", c)
	}
	bg := context.Background()
	d1, d2 := blob.Sum([]byte("watch 1")), blob.Sum([]byte("watch 2"))
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	fails := func(err error) {
		t.Helper()
		if err == nil {
			t.Fatal("a change that must fail succeeded")
		}
	}
	ok(a.CreatePerm(bg, "w", namespaces.Perm{Uid: 1, Gid: 1, Mode: 0o755}))
	_, err = a.Link(bg, "w", d1)
	ok(err)
	_, err = a.LinkMany(bg, "w", []blob.Digest{d2})
	ok(err)
	ok(a.SetPerm(bg, "w", namespaces.Perm{Uid: 1, Gid: 1, Mode: 0o700}))
	fails(a.Remove(bg, "w")) // not empty
	ok(a.Unlink(bg, "w", d1))
	fails(a.Unlink(bg, "w", d1))                      // absent
	fails(a.Create(bg, "w"))                          // exists
	fails(a.SetPerm(bg, "nosuch", namespaces.Perm{})) // absent
	ok(b.Create(bg, "own"))                           // b's own: not reported
	ok(b.Unlink(bg, "w", d2))
	ok(b.Remove(bg, "own"))
	ok(a.Remove(bg, "w"))
	ok(a.Create(bg, "end"))
	want := []namespaces.Change{
		{Kind: namespaces.Created, Namespace: "w"},
		{Kind: namespaces.PermChanged, Namespace: "w"},
		{Kind: namespaces.Unlinked, Namespace: "w", Digest: d1},
		{Kind: namespaces.Removed, Namespace: "w"},
		{Kind: namespaces.Created, Namespace: "end"},
	}
	for i, w := range want {
		if c := NextChange(t, ch); c.Kind != w.Kind || c.Namespace != w.Namespace || c.Digest != w.Digest {
			t.Fatalf("change %d: %v, want %v", i, c, w)
		}
	}
	cancel()
	deadline := time.After(watchWait)
	for {
		select {
		case _, open := <-ch:
			if !open {
				return
			}
		case <-deadline:
			t.Fatalf("the change channel is still open %s after its context ended", watchWait)
		}
	}
}

// NextChange returns the next change on ch, failing the test if none
// comes within watchWait or ch closes.
func NextChange(t testing.TB, ch <-chan namespaces.Change) namespaces.Change {
	t.Helper()
	select {
	case c, open := <-ch:
		if !open {
			t.Fatal("the change channel closed")
		}
		return c
	case <-time.After(watchWait):
		t.Fatalf("no change within %s", watchWait)
	}
	return namespaces.Change{}
}
