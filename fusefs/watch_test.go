//go:build linux

package fusefs

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/namespaces"
)

// fedRegistry is a registry whose change feed the test writes: the test
// changes the registry behind the mount's back (as another host would)
// and then says so, or not, on the feed.
type fedRegistry struct {
	namespaces.Registry
	feed chan namespaces.Change
}

func (r fedRegistry) Watch(ctx context.Context) (<-chan namespaces.Change, error) {
	out := make(chan namespaces.Change)
	go func() {
		defer close(out)
		for {
			select {
			case c := <-r.feed:
				select {
				case out <- c:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// mountFed mounts a memory store whose registry's feed is the returned
// channel.
func mountFed(t *testing.T) (*env, chan<- namespaces.Change) {
	feed := make(chan namespaces.Change, 16)
	e := mountStore(t, memSpec, func(c *Config) { c.Namespaces = fedRegistry{c.Namespaces, feed} })
	return e, feed
}

// within returns how long cond took to hold, failing the test past limit.
func within(t *testing.T, limit time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not after %s", what, limit)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

func gone(path string) bool {
	_, err := os.Stat(path)
	return errors.Is(err, fs.ErrNotExist)
}

// TestWatchUnlinked: a blob unlinked elsewhere stays in the kernel's cache
// (an hour) until the feed says so; then stat and ls lose it at once.
func TestWatchUnlinked(t *testing.T) {
	e, feed := mountFed(t)
	e.mkns("n")
	d := e.put("n", []byte("unlinked elsewhere"))
	p := e.path("n", d.String())
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	if err := e.reg.Unlink(t.Context(), "n", d); err != nil {
		t.Fatal(err)
	}
	if gone(p) {
		t.Fatal("the kernel did not keep the blob's entry: this test shows nothing")
	}
	// A change to a namespace the mount never saw is nothing to it.
	feed <- namespaces.Change{Kind: namespaces.Unlinked, Namespace: "other", Digest: d}
	feed <- namespaces.Change{Kind: namespaces.Unlinked, Namespace: "n", Digest: d}
	took := within(t, 2*time.Second, "stat to lose the unlinked blob", func() bool { return gone(p) })
	t.Logf("gone from stat %s after the change", took)
	if got := e.listNS(t, "n"); len(got) != 0 {
		t.Fatalf("ls n = %v after the unlink", got)
	}
}

// TestWatchResync: after a resync (changes were missed), nothing the
// kernel cached of any namespace survives: a blob unlinked while the feed
// was away goes from stat at once.
func TestWatchResync(t *testing.T) {
	e, feed := mountFed(t)
	e.mkns("a")
	e.mkns("b")
	da := e.put("a", []byte("missed a"))
	db := e.put("b", []byte("kept b"))
	pa, pb := e.path("a", da.String()), e.path("b", db.String())
	for _, p := range []string{pa, pb} {
		if _, err := os.Stat(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.reg.Unlink(t.Context(), "a", da); err != nil {
		t.Fatal(err)
	}
	if gone(pa) {
		t.Fatal("the kernel did not keep the blob's entry: this test shows nothing")
	}
	feed <- namespaces.Change{Kind: namespaces.Resync, Err: errors.New("connection lost")}
	within(t, 2*time.Second, "stat to lose the blob unlinked while the feed was away", func() bool { return gone(pa) })
	if _, err := os.Stat(pb); err != nil {
		t.Fatalf("a blob still linked, after the resync: %v", err)
	}
	if !strings.Contains(e.logs.String(), "connection lost") {
		t.Fatalf("the resync's cause is not in the log:\n%s", e.logs.String())
	}
}

// TestWatchPerm: a chmod elsewhere shows on the namespace and its
// incoming/ at once, not when the attribute timeout and the nsDir's Perm
// cache (a second each) have run out.
func TestWatchPerm(t *testing.T) {
	e, feed := mountFed(t)
	e.mkns("n")
	mode := func(p string) fs.FileMode {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	p := namespaces.Perm{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid()), Mode: 0o700}
	var took []time.Duration
	for range 3 {
		// Fresh: the kernel and the node looked the attributes up just now.
		was := mode(e.path("n"))
		mode(e.path("n", incomingName))
		p.Mode = 0o700
		if was == 0o700 {
			p.Mode = 0o750
		}
		if err := e.reg.SetPerm(t.Context(), "n", p); err != nil {
			t.Fatal(err)
		}
		feed <- namespaces.Change{Kind: namespaces.PermChanged, Namespace: "n"}
		took = append(took, within(t, 5*time.Second, "the new mode", func() bool {
			return mode(e.path("n")) == fs.FileMode(p.Mode) && mode(e.path("n", incomingName)) == fs.FileMode(p.Mode)
		}))
	}
	// Without the feed it takes about a second; the median is under half.
	slices.Sort(took)
	if took[1] > 500*time.Millisecond {
		t.Fatalf("the new mode showed after %v", took)
	}
}

// TestWatchRemoved: a namespace removed elsewhere goes from stat at once,
// not when its entry's second has run out.
func TestWatchRemoved(t *testing.T) {
	e, feed := mountFed(t)
	var took []time.Duration
	for i := range 3 {
		name := "r" + string(rune('0'+i))
		if err := e.reg.Create(t.Context(), name); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(e.path(name)); err != nil {
			t.Fatal(err)
		}
		if err := e.reg.Remove(t.Context(), name); err != nil {
			t.Fatal(err)
		}
		feed <- namespaces.Change{Kind: namespaces.Removed, Namespace: name}
		took = append(took, within(t, 5*time.Second, "stat to lose "+name, func() bool { return gone(e.path(name)) }))
	}
	slices.Sort(took)
	if took[1] > 500*time.Millisecond {
		t.Fatalf("the removed namespace went after %v", took)
	}
}
