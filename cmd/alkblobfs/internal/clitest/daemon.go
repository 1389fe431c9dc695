//go:build linux

package clitest

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
)

// RequireFUSE skips the test where FUSE is missing (a failure under
// ALKBLOBFS_REQUIRE_FUSE=1, as make test sets it).
func RequireFUSE(t *testing.T) { fusetest.RequireFUSE(t) }

// Eventually is fusetest.Eventually.
var Eventually = fusetest.Eventually

// SyncBuffer collects a process's output while the test reads it.
type SyncBuffer = fusetest.Buffer

// Daemon is one `alkblobfs mount` process.
type Daemon struct {
	t      *testing.T
	mnt    string
	Cmd    *exec.Cmd
	Stderr *SyncBuffer
	Done   chan struct{}
	err    error
	conn   uint64 // the mount's FUSE connection, once it serves
}

// StartDaemon mounts the store in data on mnt (alkblobfs mount args mnt)
// and waits until it serves; the test's cleanup unmounts it.
func StartDaemon(t *testing.T, data, mnt string, args ...string) *Daemon {
	t.Helper()
	return StartDaemonEnv(t, nil, data, mnt, args...)
}

// StartDaemonEnv is StartDaemon with env added to the daemon's environment
// (not t.Setenv's: the test may run in parallel with others).
func StartDaemonEnv(t *testing.T, env []string, data, mnt string, args ...string) *Daemon {
	t.Helper()
	if BuildErr != nil {
		t.Fatal(BuildErr)
	}
	d := &Daemon{t: t, mnt: mnt, Stderr: &SyncBuffer{}, Done: make(chan struct{})}
	d.Cmd = exec.Command(Bin, append([]string{"--data", data, "mount"}, append(args, mnt)...)...)
	d.Cmd.Env = append(append(os.Environ(), "HOME="+t.TempDir(), "XDG_DATA_HOME="), env...)
	d.Cmd.Stderr = d.Stderr
	if err := d.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		d.err = d.Cmd.Wait()
		close(d.Done)
	}()
	t.Cleanup(func() {
		select {
		case <-d.Done:
		default:
			d.Cmd.Process.Kill()
			fusetest.Reap(t, mnt, d.conn, 15*time.Second, d.Done)
		}
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		// The daemon's own word, not a stat: after a kill -9 the kernel
		// may still answer a stat from the dead mount's caches.
		if strings.Contains(d.Stderr.String(), "msg=mounted") {
			d.conn, _ = fusetest.Conn(mnt)
			return d
		}
		select {
		case <-d.Done:
			t.Fatalf("daemon exited before mounting: %v\n%s", d.err, d.Stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not mount within 20s:\n%s", d.Stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// OpenWithin opens path, retrying until it exists or within passes.
func OpenWithin(t *testing.T, path string, within time.Duration) *os.File {
	t.Helper()
	var f *os.File
	Eventually(t, within, path+" to be readable", func() bool {
		var err error
		f, err = os.Open(path)
		return err == nil
	})
	return f
}

// SweepVia asks the daemon on mnt for a sweep through its control file.
func SweepVia(t *testing.T, mnt string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(mnt, ".alkblobfs", "sweep"), []byte("run\n"), 0o644); err != nil {
		t.Fatalf("sweep through %s: %v", mnt, err)
	}
}

// ReadsTo reads the rest of f, opened on blob d with head read already,
// and fails unless the whole hashes to d.
func ReadsTo(t *testing.T, f *os.File, head []byte, d string) {
	t.Helper()
	rest, err := io.ReadAll(f)
	if err != nil {
		t.Fatalf("reading the open file: %v", err)
	}
	if got := Sum(append(head, rest...)); got != d {
		t.Fatalf("the open file read back as %s, want %s", got, d)
	}
}

// Collected sweeps (with sweep) until the store no longer lists d, and
// fails if that takes over 15 s.
func Collected(t *testing.T, c *CLI, d string, sweep func()) time.Duration {
	t.Helper()
	start := time.Now()
	for strings.Contains(c.OK("ls"), d) {
		if time.Since(start) > 15*time.Second {
			t.Fatalf("%s was never collected", d)
		}
		sweep()
		time.Sleep(200 * time.Millisecond)
	}
	return time.Since(start)
}

// StopDaemon sends SIGTERM and requires a clean exit within 20 s.
func StopDaemon(t *testing.T, dm *Daemon) {
	t.Helper()
	dm.Cmd.Process.Signal(syscall.SIGTERM)
	if code := dm.Wait(20 * time.Second); code != 0 {
		t.Fatalf("mount exit %d after SIGTERM:\n%s", code, dm.Stderr.String())
	}
}

// Wait waits for the daemon to exit and returns its exit status.
func (d *Daemon) Wait(within time.Duration) int {
	d.t.Helper()
	select {
	case <-d.Done:
	case <-time.After(within):
		d.t.Fatalf("daemon still running after %s:\n%s", within, d.Stderr.String())
	}
	return d.Cmd.ProcessState.ExitCode()
}

// IsMounted reports whether dir is a mountpoint of this process's
// mount namespace.
func IsMounted(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// FileSHA is the digest of the file at p, read through.
func FileSHA(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// UnmountAndWait runs umount(8) and waits until the daemon has logged
// that it unmounted and exited.
func UnmountAndWait(t *testing.T, mnt, log string) {
	t.Helper()
	if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
		t.Fatalf("umount %s: %v: %s", mnt, err, out)
	}
	Eventually(t, 10*time.Second, "the daemon's exit", func() bool {
		b, _ := os.ReadFile(log)
		return strings.Contains(string(b), "msg=unmounted mountpoint="+mnt) && !DaemonRunning(mnt)
	})
}

// DaemonRunning reports whether a process's command line names mnt.
func DaemonRunning(mnt string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if slices.Contains(args, "mount") && slices.Contains(args, mnt) {
			return true
		}
	}
	return false
}

// GuardName is the name ps shows for a mount's guard process (fusefs's
// GuardName, seen from outside as a user sees it).
const GuardName = "alkblobfs-mount-guard"

// GuardOf is the pid of the mount guard of daemon pid (GuardName, whose
// second argument is the daemon's pid), 0 if it has none.
func GuardOf(pid int) int {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		args := strings.Split(string(b), "\x00")
		if err == nil && len(args) > 2 && args[0] == GuardName && args[2] == strconv.Itoa(pid) {
			g, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return g
		}
	}
	return 0
}

// AbortFUSE frees a hung mount with the product's own remedy, umount
// --force (fusectl abort, then detach), which reads mountinfo only and so
// cannot hang the test.
func AbortFUSE(t *testing.T, mnt string) {
	if out, err := exec.Command(Bin, "umount", "--force", mnt).CombinedOutput(); err != nil {
		t.Logf("umount --force %s: %v: %s", mnt, err, out)
	}
}
