//go:build linux

package clitest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// HelperLock serialises, across the test binaries of every checkout on
// this machine, the tests that put files at the paths the package owns
// (/sbin/mount.fuse.alkblobfs: installHelper; /usr/bin/alkblobfs and the
// rest: TestDebPackage). It waits at most two minutes.
func HelperLock(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "alkblobfs-system-paths.lock"), os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	Eventually(t, 2*time.Minute, "the lock on the system paths (another test installs the helper or the package)", func() bool {
		return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
	})
	t.Cleanup(func() { f.Close() })
}
