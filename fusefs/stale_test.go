//go:build linux

package fusefs

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/rundir"
)

// TestPrunePidFiles: a mount prunes the pid files of daemons that have
// exited, and only those. A record whose daemon is alive stays although
// its mountpoint is not mounted in this mount namespace (a mount in a
// container, or under systemd's PrivateMounts, is not in this process's
// mountinfo, and `umount --force` there needs the record); before, every
// record whose mount was not in this process's mountinfo was removed. A
// record whose pid is free, or reused by a process that started at
// another time, goes. And a record replaced since it was read (a new
// mount's, renamed over it) is not the one removed.
func TestPrunePidFiles(t *testing.T) {
	if err := rundir.Make(rundir.Dir()); err != nil {
		t.Fatal(err)
	}
	// A real process, alive until the test ends: the daemon of a mount
	// this namespace does not see.
	live := exec.Command("sleep", "600")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { live.Process.Kill(); live.Wait() })
	liveStart, err := procStart(live.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// A real process that has exited: its pid is free (nothing else
	// forks enough here to take it before the prune).
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	record := func(pid int, start string) string {
		mnt := t.TempDir() // never mounted
		p := pidFile(mnt)
		if err := os.WriteFile(p, []byte(fmt.Sprintf("%d 4242 %s %s\n", pid, start, mnt)), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
		return p
	}
	alive := record(live.Process.Pid, fmt.Sprint(liveStart))
	gone := record(dead.Process.Pid, "1")
	reused := record(live.Process.Pid, fmt.Sprint(liveStart+1))
	// Control sockets beside the records: a killed daemon's (nothing
	// answers) goes with its record; one something answers stays.
	sock := func(record string, answer bool) string {
		path := strings.TrimSuffix(record, ".pid") + ".sock"
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close(); os.Remove(path) })
		if !answer {
			ln.SetUnlinkOnClose(false)
			ln.Close()
		}
		return path
	}
	deadSock := sock(gone, false)
	liveSock := sock(reused, true)
	prunePidFiles()
	if _, err := os.Lstat(deadSock); !os.IsNotExist(err) {
		t.Errorf("the control socket of a daemon that exited: %v; want it removed", err)
	}
	if _, err := os.Lstat(liveSock); err != nil {
		t.Errorf("a control socket something answers on: %v; want it kept", err)
	}
	if _, err := os.Stat(alive); err != nil {
		t.Errorf("the record of a live daemon whose mountpoint is not mounted here: %v; want it kept", err)
	}
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("the record of a daemon that exited: %v; want it removed", err)
	}
	if _, err := os.Stat(reused); !os.IsNotExist(err) {
		t.Errorf("the record of a daemon whose pid another process has: %v; want it removed", err)
	}

	// Replaced between the read and the remove: the new record stays.
	old := record(dead.Process.Pid, "1")
	_, fi, err := readRecord(old)
	if err != nil {
		t.Fatal(err)
	}
	fresh := old + ".new"
	if err := os.WriteFile(fresh, []byte("fresh"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(fresh, old); err != nil {
		t.Fatal(err)
	}
	removeIfSame(old, fi)
	if b, err := os.ReadFile(old); err != nil || string(b) != "fresh" {
		t.Errorf("a record renamed over the one read: %q, %v; want it kept", b, err)
	}
	if m, _ := filepath.Glob(old + ".*"); len(m) != 0 {
		t.Errorf("left behind: %v", m)
	}
}
