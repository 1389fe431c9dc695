//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/fusefs"
)

// Tests of mount --restart-on-crash: the daemon killed (SIGKILL) under
// programs that use the mount, its guard starting it again on the live
// connection.

var restartedPid = regexp.MustCompile(`restarted it on the live connection.* pid=(\d+) restart=(\d+)`)

// crash kills the serving daemon with SIGKILL and returns the pid of the
// one its guard restarted (the n-th restart of the mount).
func (u *upgradable) crash(n int) int {
	u.t.Helper()
	if err := syscall.Kill(u.pid, syscall.SIGKILL); err != nil {
		u.t.Fatal(err)
	}
	var pid int
	clitest.Eventually(u.t, 30*time.Second, fmt.Sprintf("restart %d in the log", n), func() bool {
		// The n-th restart line (not its number, which the guard
		// counts: a guard that counted wrong is for the test to find).
		all := restartedPid.FindAllStringSubmatch(u.logText(), -1)
		if len(all) < n {
			return false
		}
		pid, _ = strconv.Atoi(all[n-1][1])
		return true
	})
	u.pid = pid
	return pid
}

// guardsOn lists the pids of the guards of the mount on dir.
func guardsOn(dir string) []int {
	var out []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		args := strings.Split(string(b), "\x00")
		if err == nil && len(args) > 1 && args[0] == clitest.GuardName && args[1] == dir {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			out = append(out, pid)
		}
	}
	return out
}

// staleRead reads f, a descriptor of blob a opened before a crash, at
// off, not read before: it must fail with ESTALE or EIO, and never
// return bytes other than a's (b's above all, opened since).
func staleRead(f *os.File, off int64, a, b []byte) error {
	buf := make([]byte, 4096)
	n, err := f.ReadAt(buf, off)
	if n > 0 && string(buf[:n]) != string(a[off:off+int64(n)]) {
		return fmt.Errorf("a descriptor opened before a crash read wrong bytes at %d (those of the file opened since: %v)", off, string(buf[:n]) == string(b[off:off+int64(n)]))
	}
	if !errors.Is(err, syscall.ESTALE) && !errors.Is(err, syscall.EIO) {
		return fmt.Errorf("a descriptor opened before a crash, at %d: %d bytes, %v; want ESTALE or EIO", off, n, err)
	}
	return nil
}

// TestRestartOnCrash: a daemon killed with SIGKILL is restarted on the
// live connection. A descriptor opened before gets ESTALE or EIO, never
// another file's bytes, even once a new open took a handle in the new
// daemon; a version an fsync committed before the kill is published; a
// file written and not synced is not; new opens, listings, stats and
// puts work at once; stats count the restart; an upgrade of the
// restarted daemon leaves one guard and one daemon. A third crash within
// a minute ends the mount (ENOTCONN), with no hang and no process left.
func TestRestartOnCrash(t *testing.T) {
	if clitest.GuardName != fusefs.GuardName {
		t.Fatalf("clitest.GuardName %q, the guard runs as %q", clitest.GuardName, fusefs.GuardName)
	}
	c := clitest.NewCLI(t)
	dir := t.TempDir()
	aPath, aBytes, aD := clitest.WriteFile(t, dir, 8<<20, 1)
	bPath, bBytes, bD := clitest.WriteFile(t, dir, 8<<20, 2)
	c.OK("ns", "create", "ns")
	c.OK("put", "--ns", "ns", aPath, bPath)
	sock := filepath.Join(t.TempDir(), "http.sock")
	u := mountUpgradable(t, c, nil, "--restart-on-crash", "--verify=strict", "--listen", "unix:"+sock)
	ns := filepath.Join(u.mnt, "ns")
	if g := guardsOn(u.mnt); len(g) != 1 {
		t.Fatalf("guards of the mount: %v, want one", g)
	}

	// Before the crash: a reader of a, holding it open; a synced version
	// and an unsynced file in incoming/.
	held, err := os.Open(filepath.Join(ns, aD))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	head := make([]byte, 4096)
	if _, err := held.ReadAt(head, 0); err != nil {
		t.Fatal(err)
	}
	synced := []byte("synced before the crash\n")
	sw, err := os.Create(filepath.Join(ns, "incoming", "synced"))
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	if _, err := sw.Write(synced); err != nil {
		t.Fatal(err)
	}
	if err := sw.Sync(); err != nil {
		t.Fatal(err)
	}
	unsynced := []byte("written, never synced\n")
	uw, err := os.Create(filepath.Join(ns, "incoming", "unsynced"))
	if err != nil {
		t.Fatal(err)
	}
	defer uw.Close()
	if _, err := uw.Write(unsynced); err != nil {
		t.Fatal(err)
	}

	first := u.pid
	pid := u.crash(1)
	if pid == first {
		t.Fatalf("the restarted daemon has the dead one's pid %d", pid)
	}

	u.watchdog(time.Minute, "the mount after the restart", func() error {
		// A new open of b takes a handle in the new daemon; the old
		// descriptor of a must not read it.
		got, err := os.ReadFile(filepath.Join(ns, bD))
		if err != nil {
			return fmt.Errorf("a new open after the restart: %v", err)
		}
		if string(got) != string(bBytes) {
			return errors.New("a new open after the restart read wrong bytes")
		}
		bf, err := os.Open(filepath.Join(ns, bD))
		if err != nil {
			return err
		}
		defer bf.Close()
		// What the kernel cached (the head, and its readahead) reads
		// right; what it did not goes to the daemon: ESTALE or EIO.
		buf := make([]byte, 4096)
		if n, _ := held.ReadAt(buf, 0); string(buf[:n]) != string(aBytes[:n]) {
			return errors.New("the descriptor opened before the crash read wrong bytes from the page cache")
		}
		if err := staleRead(held, 7<<20, aBytes, bBytes); err != nil {
			return err
		}
		// The writers: their next request gets ESTALE or EIO.
		if _, err := uw.Write(unsynced); err == nil {
			if err := uw.Close(); err == nil {
				return errors.New("a writer opened before the crash wrote and closed without an error")
			}
		}
		// Listings, stats and reads by path work at once.
		ents, err := os.ReadDir(ns)
		if err != nil {
			return fmt.Errorf("ls after the restart: %v", err)
		}
		names := map[string]bool{}
		for _, e := range ents {
			names[e.Name()] = true
		}
		if !names[aD] || !names[bD] || !names["incoming"] {
			return fmt.Errorf("ls after the restart: %v", names)
		}
		got, err = os.ReadFile(filepath.Join(ns, aD))
		if err != nil || string(got) != string(aBytes) {
			return fmt.Errorf("read of a by path after the restart: %v", err)
		}
		// A put through incoming/ publishes.
		after := []byte("put after the restart\n")
		if err := os.WriteFile(filepath.Join(ns, "incoming", "after"), after, 0o644); err != nil {
			return fmt.Errorf("put after the restart: %v", err)
		}
		if _, err := os.Stat(filepath.Join(ns, clitest.Sum(after))); err != nil {
			return fmt.Errorf("the put after the restart: %v", err)
		}
		return nil
	})
	// The crash rules: the synced version is published (the dead
	// writer's lease lapsed with it), the unsynced file is not.
	clitest.Eventually(t, 30*time.Second, "the version synced before the crash to be published", func() bool {
		_, err := os.Stat(filepath.Join(ns, clitest.Sum(synced)))
		return err == nil
	})
	if _, err := os.Stat(filepath.Join(ns, clitest.Sum(unsynced))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the file written and never synced before the crash: %v, want ENOENT", err)
	}
	if s := u.stats(); !strings.Contains(s, `"crash_restarts": 1`) {
		t.Fatalf("stats after one restart:\n%s", s)
	}
	// The restarted daemon serves --listen again, its metric counting
	// the restart.
	if code, body := clitest.UnixGet(t, sock, "/metrics"); code != 200 || !strings.Contains(body, "\nalkblobfs_mount_crash_restarts_total 1\n") {
		t.Fatalf("GET /metrics after one restart: %d\n%.400s", code, body)
	}

	// An upgrade of the restarted daemon: the guard that restarted it
	// leaves the connection to the new daemon's own guard.
	u.mustUpgrade()
	clitest.Eventually(t, 10*time.Second, "one guard of the mount after the upgrade", func() bool {
		return len(guardsOn(u.mnt)) == 1
	})
	if _, err := os.ReadFile(filepath.Join(ns, aD)); err != nil {
		t.Fatalf("read after the upgrade: %v", err)
	}

	// Two crashes within a minute are restarted; the third ends the
	// mount as a crash without the flag does.
	// Each restart hands out node ids and handles of its own: a writer
	// of the second restart's daemon never writes into what the third's
	// gives a new file, nor a reader read it.
	u.crash(2)
	w2, err := os.Create(filepath.Join(ns, "incoming", "w2"))
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if _, err := w2.Write([]byte("before the third restart\n")); err != nil {
		t.Fatal(err)
	}
	held2, err := os.Open(filepath.Join(ns, aD))
	if err != nil {
		t.Fatal(err)
	}
	defer held2.Close()
	if _, err := held2.ReadAt(head, 0); err != nil {
		t.Fatal(err)
	}
	u.crash(3)
	u.watchdog(time.Minute, "descriptors of the restart before", func() error {
		y := []byte("written after the third restart\n")
		yf, err := os.Create(filepath.Join(ns, "incoming", "y"))
		if err != nil {
			return err
		}
		if _, err := yf.Write(y); err != nil {
			yf.Close()
			return err
		}
		bf, err := os.Open(filepath.Join(ns, bD))
		if err != nil {
			yf.Close()
			return err
		}
		defer bf.Close()
		if _, err := bf.ReadAt(head, 0); err != nil {
			yf.Close()
			return err
		}
		if _, err := w2.Write([]byte("an intruder\n")); !errors.Is(err, syscall.ESTALE) && !errors.Is(err, syscall.EIO) {
			yf.Close()
			return fmt.Errorf("a writer opened before the restart wrote: %v, want ESTALE or EIO", err)
		}
		if err := yf.Close(); err != nil {
			return fmt.Errorf("close of a file written after the restart: %v", err)
		}
		if _, err := os.Stat(filepath.Join(ns, clitest.Sum(y))); err != nil {
			return fmt.Errorf("the file written after the restart did not publish its own bytes: %v", err)
		}
		return staleRead(held2, 7<<20, aBytes, bBytes)
	})
	held2.Close()
	w2.Close()
	if err := syscall.Kill(u.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	u.watchdog(time.Minute, "the mount after a third crash within a minute", func() error {
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := os.Stat(filepath.Join(ns, aD))
			if errors.Is(err, syscall.ENOTCONN) {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("stat 30 s after the third crash: %v, want ENOTCONN", err)
			}
			time.Sleep(20 * time.Millisecond) // a poll: the guard looks every 100 ms
		}
	})
	if !strings.Contains(u.logText(), "died 3 times within a minute") {
		t.Fatalf("the log does not say why the mount ended:\n%s", u.logText())
	}
	clitest.Eventually(t, 10*time.Second, "the guard to exit", func() bool { return len(guardsOn(u.mnt)) == 0 })
	held.Close()
	sw.Close()
	uw.Close()
	if out, err := exec.Command(clitest.Bin, "umount", u.mnt).CombinedOutput(); err != nil {
		t.Fatalf("umount of the ended mount: %v: %s", err, out)
	}
}
