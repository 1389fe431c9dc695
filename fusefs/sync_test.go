//go:build linux

package fusefs

import (
	"context"
	"os/exec"
	"testing"
	"time"
)

// TestSyncOnMount: sync(1) and syncfs(2) on the mount return 0 at once,
// also while a file in incoming/ is open with unflushed writes (the
// kernel sends the daemon nothing for them: see docs/posix.md, "close(), fsync and sync").
func TestSyncOnMount(t *testing.T) {
	e := mountStore(t, defaultSpec)
	ns := e.mkns("ns")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// A child holds the file open while the syncs run: this process must
	// not wait on its own mount in a call the runtime cannot interrupt.
	script := `exec 3>"$1/incoming/open"; echo data >&3; sync; sync -f "$1"; sync -f "$1/incoming/open"; echo more >&3`
	out, err := exec.CommandContext(ctx, "bash", "-ec", script, "sync", ns).CombinedOutput()
	if err != nil {
		t.Fatalf("sync on the mount: %v (within 30s: %v)\n%s", err, ctx.Err(), out)
	}
	e.expectNS(t, "ns", []string{sum([]byte("data\nmore\n"))})
}
