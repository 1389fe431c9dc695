//go:build linux

package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// TestStaleMountReusedPID: a mount whose daemon died is cleared by the
// next mount even when its recorded pid now belongs to another live
// process. The pid file records the daemon's start time with its pid, and
// a process that got the pid later does not match it; before, a reused
// pid made the dead mount look served ("busy"), and nothing could free
// the mountpoint but umount --force.
func TestStaleMountReusedPID(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("the pid file of a root mount is under /run/alkblobfs")
	}
	data, mnt := clitest.NewCLI(t).Data, t.TempDir()
	d := clitest.StartDaemon(t, data, mnt)
	d.Cmd.Process.Kill()
	d.Wait(20 * time.Second)
	// The dead daemon's mount stays (a stat of it may still be answered
	// from the kernel's caches, so mountinfo is asked).
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err != nil || !strings.Contains(string(mi), " "+mnt+" ") {
		t.Fatalf("after kill -9 the mount on %s is gone (%v): nothing to clear", mnt, err)
	}

	// Another process now has "the daemon's pid".
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	h := sha256.Sum256([]byte(mnt))
	pf := filepath.Join("/run/alkblobfs", hex.EncodeToString(h[:8])+".pid")
	b, err := os.ReadFile(pf)
	if err != nil {
		t.Fatalf("the dead daemon's pid file: %v", err)
	}
	f := strings.SplitN(strings.TrimSuffix(string(b), "\n"), " ", 2)
	if len(f) != 2 || f[0] != strconv.Itoa(d.Cmd.Process.Pid) {
		t.Fatalf("pid file %q does not start with the daemon's pid %d", b, d.Cmd.Process.Pid)
	}
	if err := os.WriteFile(pf, []byte(strconv.Itoa(other.Process.Pid)+" "+f[1]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	d2 := clitest.StartDaemon(t, data, mnt)
	if !strings.Contains(d2.Stderr.String(), "stale mount") {
		t.Fatalf("no log line about the stale mount:\n%s", d2.Stderr.String())
	}
	if err := os.Mkdir(filepath.Join(mnt, "after"), 0o755); err != nil {
		t.Fatalf("the new mount does not serve: %v", err)
	}
	clitest.StopDaemon(t, d2)
}
