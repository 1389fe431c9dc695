package ops_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/ops"
)

// The perm cache against the registry's change feed, over a Bus: the
// server's registry and another one (another process, another host of a
// fleet) over the same state. The real feed (PostgreSQL, another process's
// chmod) is TestServeChmodRevokes's, in cmd/alkblobfs.

// heldPerm is the server's registry: its next Perm, once armed, reads the
// registry and then waits for release before answering, as a slow query
// that a change overtakes.
type heldPerm struct {
	*namespaces.Joined
	hold atomic.Pointer[permHold]
}

type permHold struct {
	arrived, release chan struct{}
	once             sync.Once
}

// let lets the held Perm answer.
func (w *permHold) let() { w.once.Do(func() { close(w.release) }) }

func (h *heldPerm) Perm(ctx context.Context, name string) (namespaces.Perm, bool, error) {
	p, ok, err := h.Joined.Perm(ctx, name)
	if w := h.hold.Swap(nil); w != nil {
		close(w.arrived)
		<-w.release
	}
	return p, ok, err
}

// arm makes the next Perm wait; it returns its hold, which a failed test
// lets go too (its server waits for its requests).
func (h *heldPerm) arm(t *testing.T) *permHold {
	w := &permHold{arrived: make(chan struct{}), release: make(chan struct{})}
	h.hold.Store(w)
	t.Cleanup(w.let)
	return w
}

// feedEnv is a server whose registry hears another's changes.
type feedEnv struct {
	*env
	reg   *heldPerm
	other namespaces.Registry
	url   string
}

// serveOnBus serves e's store with a perm cache of ttl, its registry on a
// bus with other; namespaces "builds" and "b2" are everyone's (0777).
func serveOnBus(t *testing.T, ttl time.Duration) *feedEnv {
	t.Helper()
	e := newEnv(t, envOptions{})
	bus := namespaces.NewBus()
	f := &feedEnv{env: e, reg: &heldPerm{Joined: bus.Join(e.svc.Registry)}, other: bus.Join(e.svc.Registry)}
	if err := f.other.Create(t.Context(), "b2"); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"builds", "b2"} {
		f.chmod(t, ns, 0o777)
	}
	srv := ops.New(ops.Config{
		Store: e.st, Namespaces: namespaces.NewService(f.reg, e.st), Tokens: twoUsers(t),
		PermTTL: ttl, Logger: slog.New(slog.DiscardHandler),
	})
	f.url = serveTCP(t, srv)
	return f
}

// chmod sets ns's mode through the other registry.
func (f *feedEnv) chmod(t *testing.T, ns string, mode uint32) {
	t.Helper()
	p, _, err := f.other.Perm(t.Context(), ns)
	if err != nil {
		t.Fatal(err)
	}
	p.Uid, p.Gid, p.Mode = 1001, 1001, mode // alice's
	if err := f.other.SetPerm(t.Context(), ns, p); err != nil {
		t.Fatal(err)
	}
}

// have is bob's have on ns: its status.
func (f *feedEnv) have(t *testing.T, ns string) int {
	t.Helper()
	s, err := f.haveStatus(t.Context(), ns)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// haveStatus is have for a goroutine, which must not fail the test.
func (f *feedEnv) haveStatus(ctx context.Context, ns string) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, "POST", f.url+"/v1/blobs/have",
		strings.NewReader(`{"namespace":"`+ns+`","digests":["`+strings.Repeat("0", 64)+`"]}`))
	req.Header.Set("Authorization", "Bearer "+bobTok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestPermCacheFollowsFeed: with a cache an hour long, a chmod committed
// by another registry is enforced as soon as its change reaches the
// server, and so is the chmod that opens the namespace again.
func TestPermCacheFollowsFeed(t *testing.T) {
	f := serveOnBus(t, time.Hour)
	if s := f.have(t, "builds"); s != http.StatusOK {
		t.Fatalf("bob's have on a 0777 namespace: %d", s)
	}
	f.chmod(t, "builds", 0o700)
	waitFor(t, "the chmod elsewhere to be enforced (the cache lasts an hour)", 5*time.Second, func() bool {
		return f.have(t, "builds") == http.StatusForbidden
	})
	f.chmod(t, "builds", 0o755)
	waitFor(t, "the chmod that opens it again to be seen", 5*time.Second, func() bool {
		return f.have(t, "builds") == http.StatusOK
	})
}

// TestPermCacheRace: a lookup that read the registry before a change and
// answers after the change reached the server caches nothing: the next
// request reads the new Perm, not the cached old one.
func TestPermCacheRace(t *testing.T) {
	f := serveOnBus(t, time.Hour)
	if s := f.have(t, "b2"); s != http.StatusOK { // cached, to see the change arrive by
		t.Fatalf("bob's have on b2: %d", s)
	}
	w := f.reg.arm(t)
	slow := make(chan int, 1)
	go func() {
		s, err := f.haveStatus(t.Context(), "builds")
		if err != nil {
			t.Error(err)
		}
		slow <- s
	}()
	select {
	case <-w.arrived: // it read 0777
	case <-time.After(10 * time.Second):
		t.Fatal("the have on builds never asked the registry")
	}
	f.chmod(t, "builds", 0o700)
	f.chmod(t, "b2", 0o700) // after builds' in the feed: once b2's is seen, builds' was
	waitFor(t, "the chmod of b2 to be enforced", 5*time.Second, func() bool {
		return f.have(t, "b2") == http.StatusForbidden
	})
	w.let()
	select {
	case s := <-slow:
		if s != http.StatusOK {
			t.Fatalf("the have that read 0777 answered %d", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the held have never answered")
	}
	if s := f.have(t, "builds"); s != http.StatusForbidden {
		t.Fatalf("bob's have on builds after its chmod to 0700 answered %d: the lookup that the chmod overtook cached the old Perm", s)
	}
}
