//go:build linux

package clitest

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

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
