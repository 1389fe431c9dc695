package fusefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/namespaces"
)

// TestRetryAfterRefusedClose: a file whose close the namespace's quota
// refused (EDQUOT) can be written again under the same name at once,
// once the quota is raised, as a user retrying `cp f incoming/x` does:
// the failed file's name goes at its RELEASE, which may arrive while the
// retry's open is on its way; that open must not fail with ENOENT.
//
// The window between the failed file's detach and its name's removal is
// widened, as a loaded machine does: a lookup inside it must not find
// the detached file (the open's retry would be ESTALE again).
func TestRetryAfterRefusedClose(t *testing.T) {
	testHookGone = func() { time.Sleep(20 * time.Millisecond) }
	t.Cleanup(func() { testHookGone = nil })
	e := mountStore(t, defaultSpec)
	ctx := t.Context()
	e.mkns("q")
	for i := range 50 {
		u, err := e.reg.Usage(ctx, "q")
		if err != nil {
			t.Fatal(err)
		}
		if err := e.reg.SetQuota(ctx, "q", namespaces.Quota{Blobs: max(u.Blobs, 1)}); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			// A first blob, so that the quota of 1 is full.
			if err := os.WriteFile(e.path("q", "incoming", "first"), []byte("first"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := e.reg.SetQuota(ctx, "q", namespaces.Quota{Blobs: 1}); err != nil {
				t.Fatal(err)
			}
		}
		name := e.path("q", "incoming", fmt.Sprintf("x%d", i))
		content := fmt.Appendf(nil, "retry %d", i)
		if err := os.WriteFile(name, content, 0o644); !errors.Is(err, syscall.EDQUOT) {
			t.Fatalf("round %d: a write over the quota: %v, want EDQUOT", i, err)
		}
		if err := e.reg.SetQuota(ctx, "q", namespaces.Quota{}); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, content, 0o644); err != nil {
			t.Fatalf("round %d: the retry of a refused write, once the quota was raised: %v", i, err)
		}
	}
}

// cancelCounter counts the calls of Registry.Cancel (the lease's drops of
// the intents it was given to abandon) of a registry that a put can join.
type cancelCounter struct {
	joinableRegistry
	calls atomic.Int64
}

type joinableRegistry interface {
	namespaces.Registry
	namespaces.Joinable
}

func (c *cancelCounter) Cancel(ctx context.Context, i namespaces.Intent) error {
	c.calls.Add(1)
	return c.joinableRegistry.Cancel(ctx, i)
}

// TestRefusedCloseDropsNothing: a close refused over the quota wrote no
// intent, so the mount gives its lease none to drop: no Cancel runs for
// it, neither at a tick nor at the unmount, where the lease drops what it
// was given.
func TestRefusedCloseDropsNothing(t *testing.T) {
	reg := &cancelCounter{}
	// Registered before the mount, so it runs after the mount's own
	// cleanup, whose unmount closed the lease.
	t.Cleanup(func() {
		if n := reg.calls.Load(); n != 0 {
			t.Errorf("a close refused over the quota cost %d intent drops, want 0", n)
		}
	})
	e := mountStore(t, defaultSpec, func(c *Config) {
		reg.joinableRegistry = c.Namespaces.(joinableRegistry)
		c.Namespaces = reg
	})
	e.mkns("q")
	if err := e.reg.SetQuota(t.Context(), "q", namespaces.Quota{Bytes: 1}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.path("q", "incoming", "over"), []byte("over the quota"), 0o644); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("a write over the quota: %v, want EDQUOT", err)
	}
}
