package fusefs

import (
	"errors"
	"fmt"
	"os"
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
