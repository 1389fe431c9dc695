package cache

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
)

// TestCacheFullDiskPut: with --cache on a small disk (an 8 MiB tmpfs), a
// cp into incoming/ of a file larger than that disk succeeds: the
// upload's scratch file starts on the cache's disk and moves to the
// store's scratch directory when the disk fills; the blob is in the pool
// and reads back whole, and the daemon logs the move.
func TestCacheFullDiskPut(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	fsdir := t.TempDir()
	if err := syscall.Mount("tmpfs", fsdir, "tmpfs", 0, "size=8m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(fsdir, syscall.MNT_DETACH) })
	cdir := filepath.Join(fsdir, "cache")
	flags := []string{"--large", s3test.URL(t), "--cache", cdir, "--cache-size", "4MiB"}
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "p")
	fa, a, da := clitest.WriteFile(t, t.TempDir(), 24<<20, 71)
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt, flags...)
	if out, err := exec.Command("cp", fa, filepath.Join(mnt, "p", "incoming", "a")).CombinedOutput(); err != nil {
		t.Fatalf("cp of 24 MiB into incoming/ with the cache on an 8 MiB disk: %v\n%s\n%s", err, out, dm.Stderr)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "p", da)); err != nil || !bytes.Equal(got, a) {
		t.Fatalf("read of the put: %v", err)
	}
	clitest.StopDaemon(t, dm)
	if !strings.Contains(dm.Stderr.String(), "scratch file moved to the scratch directory") {
		t.Fatalf("the daemon did not log the move:\n%s", dm.Stderr)
	}
}
