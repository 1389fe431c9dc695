//go:build linux

package fusetest

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/fusefs/fusectl"
	"golang.org/x/sys/unix"
)

// Giving up on an unmount. A harness unmounts when its test ends and waits
// for the kernel to release every file open on the mount. A test that
// failed with a file open would have it wait forever; a harness that just
// stops waiting leaves the test binary worse off: at exit the kernel
// flushes that file, through a server that exit has already stopped, and
// the process hangs silently, past -timeout. So every harness waits a
// bounded time and then gives up the same way, here: it aborts the FUSE
// connection through fusectl (every request on it fails at once, the file
// included), detaches the mount, and fails the test naming the mountpoint.

// Conn is the FUSE connection number of the mount on dir: the minor of its
// device, read from /proc/self/mountinfo, so that finding it never touches
// the mount (a stat of a hung mount would hang the caller). A harness
// reads it right after mounting and keeps it for a give-up.
func Conn(dir string) (uint64, error) {
	// mountinfo names the mountpoint without symbolic links; resolving
	// dir itself would stat the mount.
	if parent, err := filepath.EvalSymlinks(filepath.Dir(dir)); err == nil {
		dir = filepath.Join(parent, filepath.Base(dir))
	}
	m, ok, err := fusectl.Find(dir)
	switch {
	case err != nil:
		return 0, err
	case !ok || !m.IsFUSE():
		return 0, fmt.Errorf("no FUSE mount on %s in /proc/self/mountinfo", dir)
	}
	return m.Minor, nil
}

// Abort is fusectl.Abort.
var Abort = fusectl.Abort

// Detach unmounts dir lazily (umount -l; fusermount3 -u -z when not
// root). A dir with nothing mounted on it is not an error: an unmount that
// gave up has often detached it already.
func Detach(dir string) error {
	err := unix.Unmount(dir, unix.MNT_DETACH)
	if errors.Is(err, unix.EPERM) {
		if out, ferr := exec.Command("fusermount3", "-u", "-z", dir).CombinedOutput(); ferr != nil {
			return fmt.Errorf("fusermount3 -u -z %s: %v: %s", dir, ferr, out)
		}
		return nil
	}
	if err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("umount -l %s: %w", dir, err)
	}
	return nil
}

// GiveUp is how a harness gives up on the mount on dir (FUSE connection
// conn, from Conn) after waiting for why: it aborts the connection,
// detaches the mount, and fails t with a message naming the mountpoint.
func GiveUp(t testing.TB, dir string, conn uint64, why string) {
	t.Helper()
	msg := fmt.Sprintf("mount %s: %s; aborted its FUSE connection %d and detached it", dir, why, conn)
	if err := Abort(conn); err != nil {
		msg = fmt.Sprintf("mount %s: %s; could not abort its FUSE connection: %v", dir, why, err)
	}
	if err := Detach(dir); err != nil {
		msg += "; " + err.Error()
	}
	t.Errorf("%s", msg)
}

// Unmount runs unmount, which is to return once the mount on dir
// (connection conn) has stopped serving, and gives up (GiveUp) if it has
// not returned within within. After a give-up it waits a little more for
// unmount to see the aborted connection. It reports whether unmount
// returned, having failed t with its error if it had one; a harness that
// gets false must not tear down what the mount still uses.
func Unmount(t testing.TB, dir string, conn uint64, within time.Duration, unmount func() error) bool {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- unmount() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
		return true
	case <-time.After(within):
	}
	select {
	case err := <-done: // just now: the connection may be gone, its number reused
		if err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
		return true
	default:
	}
	GiveUp(t, dir, conn, fmt.Sprintf("unmount still waiting after %s (a file left open on it?)", within))
	const after = 10 * time.Second
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("unmount %s after the abort: %v", dir, err)
		}
		return true
	case <-time.After(after):
		t.Errorf("unmount %s still waiting %s after its connection was aborted", dir, after)
		return false
	}
}

// Reap waits for a killed daemon (done is closed once it has exited) that
// served the mount on dir through connection conn (0: unknown). A daemon
// still there after within has a thread stuck in the kernel, on a request
// to its own mount, and only aborting the connection frees it: Reap gives
// up (GiveUp) if the mount on dir is still that connection, else just
// fails t, and then waits a little more. It reports whether the daemon
// exited.
func Reap(t testing.TB, dir string, conn uint64, within time.Duration, done <-chan struct{}) bool {
	t.Helper()
	select {
	case <-done:
		return true
	case <-time.After(within):
	}
	why := fmt.Sprintf("its daemon still running %s after SIGKILL", within)
	// Only a connection still mounted on dir is surely the daemon's: the
	// number of one that ended may belong to another mount by now.
	if now, err := Conn(dir); conn != 0 && err == nil && now == conn {
		GiveUp(t, dir, conn, why)
	} else {
		t.Errorf("mount %s: %s, and its FUSE connection is no longer mounted there: not aborting anything", dir, why)
	}
	const after = 10 * time.Second
	select {
	case <-done:
		return true
	case <-time.After(after):
		t.Errorf("mount %s: its daemon still running %s after the give-up", dir, after)
		return false
	}
}
