//go:build linux

package fusetest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/fusefs/fusectl"
	"golang.org/x/sys/unix"
)

// MountNS is a mount namespace of a test's own (unshare --mount, private
// propagation) whose /dev/fuse is a device node of the test's own too, on
// a tmpfs only the namespace sees. A test changes that node's mode, and
// mounts what it likes in the namespace, and the host's /dev/fuse, which
// every mount on the machine needs, is never changed: not even by a test
// that is killed (a chmod of the real one stayed). A process holds the
// namespace while the test runs. Root only; util-linux's unshare and
// nsenter.
type MountNS struct {
	pid  int    // the holder
	node string // the device node: a path that exists in the namespace only
	ns   string // the namespace's identity, readlink /proc/<pid>/ns/mnt
}

// PrivateDevFUSE makes a MountNS whose /dev/fuse has mode. Its cleanup
// detaches the FUSE mounts made in it, waits for the processes left in it
// (their daemons), and ends the holder.
func PrivateDevFUSE(t testing.TB, mode os.FileMode) *MountNS {
	t.Helper()
	for _, tool := range []string{"unshare", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("a private /dev/fuse needs %s (util-linux): %v", tool, err)
		}
	}
	dir := t.TempDir()
	// The sleep bounds the holder should the test die without the
	// SIGKILL Pdeathsig sends.
	const script = `mount -t tmpfs -o mode=0755,size=64k alkblobfs-test "$0" &&
		mknod -m "$1" "$0/fuse" c 10 229 &&
		mount --bind "$0/fuse" /dev/fuse &&
		echo ready && exec sleep 1800`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, dir, fmt.Sprintf("%o", mode.Perm()))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("unshare: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	ready := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- line == "ready\n"
	}()
	ok := false
	select {
	case ok = <-ready:
	case <-time.After(10 * time.Second):
	}
	if !ok {
		cmd.Process.Kill()
		t.Fatalf("a mount namespace with its own /dev/fuse: not ready within 10s: %s", stderr.String())
	}
	ns := &MountNS{pid: cmd.Process.Pid, node: filepath.Join(dir, "fuse")}
	if ns.ns, err = os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", ns.pid)); err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.close(t, cmd, exited) })
	return ns
}

// Command runs name in the namespace, as root.
func (ns *MountNS) Command(name string, arg ...string) *exec.Cmd {
	return exec.Command("nsenter", append(ns.enter(name), arg...)...)
}

// enter is nsenter's arguments to run name in the namespace.
func (ns *MountNS) enter(name string) []string {
	return []string{"--target", strconv.Itoa(ns.pid), "--mount", "--", name}
}

// Chmod sets the mode of the namespace's /dev/fuse. The path it changes
// exists only in the namespace: outside, it is an empty directory's.
func (ns *MountNS) Chmod(t testing.TB, mode os.FileMode) {
	t.Helper()
	if out, err := ns.Command("chmod", fmt.Sprintf("%o", mode.Perm()), ns.node).CombinedOutput(); err != nil {
		t.Fatalf("chmod of the namespace's /dev/fuse: %v: %s", err, out)
	}
}

func (ns *MountNS) close(t testing.TB, holder *exec.Cmd, exited <-chan struct{}) {
	t.Helper()
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", ns.pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			sep := -1
			for i, fl := range f {
				if fl == "-" {
					sep = i
					break
				}
			}
			if sep < 0 || sep+1 >= len(f) || !strings.HasPrefix(f[sep+1], "fuse") || f[sep+1] == "fusectl" {
				continue
			}
			// -c: no canonicalizing stat of a mount that may hang.
			dir := fusectl.Unescape(f[4])
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			out, err := exec.CommandContext(ctx, "nsenter", append(ns.enter("umount"), "-l", "-c", dir)...).CombinedOutput()
			cancel()
			// A copy of another test's mount, taken when the namespace
			// was made, goes when that test unmounts it (propagation):
			// gone since the read is not a failure.
			if err != nil && ns.mounted(f[4]) {
				t.Errorf("umount -l %s in the test's mount namespace: %v: %s", dir, err, out)
			}
		}
	}
	// What runs in the namespace now (daemons whose mounts were just
	// detached) ends on its own; a process that does not is the test's.
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := ns.processes()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("processes %v still in the test's mount namespace 10s after its mounts were detached; killing them", left)
			for _, pid := range left {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	holder.Process.Kill()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Errorf("the holder of the test's mount namespace (pid %d) still there 10s after SIGKILL", ns.pid)
	}
}

// processes lists the processes in the namespace but its holder.
func (ns *MountNS) processes() []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/mnt")
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p))))
		if err != nil || pid == ns.pid {
			continue
		}
		if l, err := os.Readlink(p); err == nil && l == ns.ns {
			pids = append(pids, pid)
		}
	}
	return pids
}

// DevFUSE is what a test using a MountNS checks stays the same: the host's
// /dev/fuse.
type DevFUSE struct {
	Mode os.FileMode
	Ino  uint64
	Rdev uint64
}

func (s DevFUSE) String() string {
	return fmt.Sprintf("mode %v, inode %d, device %d:%d", s.Mode, s.Ino, unix.Major(s.Rdev), unix.Minor(s.Rdev))
}

// HostDevFUSE is this process's /dev/fuse.
func HostDevFUSE(t testing.TB) DevFUSE {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat("/dev/fuse", &st); err != nil {
		t.Fatal(err)
	}
	return DevFUSE{Mode: os.FileMode(st.Mode & 0o7777), Ino: st.Ino, Rdev: st.Rdev}
}

// mounted reports whether the namespace's mount table still lists a
// mount at mountinfo's (escaped) mount point field.
func (ns *MountNS) mounted(field string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", ns.pid))
	if err != nil {
		return true // cannot tell: keep the error
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == field {
			return true
		}
	}
	return false
}
