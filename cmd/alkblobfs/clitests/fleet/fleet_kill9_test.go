//go:build linux

package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/fusefs/fusectl"
	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"
)

// TestFleetKill9InNotify: a fleet mount killed with SIGKILL while its
// change consumer is blocked in a notification exits, and its mount is
// left as the kernel leaves that of any killed FUSE daemon: its
// connection gone, every request on it failed.
//
// The blocking is made on purpose: a mkdir through B waits in the
// daemon (its INSERT waits behind a transaction of the test's that
// inserted the same name), and the kernel holds the root directory's
// lock for it; A removes a namespace that B's kernel holds, so B's
// consumer invalidates the root's entry, and the kernel makes that
// notification wait for the root's lock. B is killed then. The thread in
// the notification sleeps uninterruptibly and holds the daemon's
// /dev/fuse descriptor, so the kernel never ends the connection, the
// mkdir is never answered and the lock never freed: the daemon never
// exits.
func TestFleetKill9InNotify(t *testing.T) {
	t.Parallel()
	n := stuckInNotify(t)
	dmB, mntB, stuck, mkDone := n.dmB, n.mntB, n.stuck, n.mkDone
	pid := dmB.Cmd.Process.Pid
	guard := guardOf(t, pid)

	killed := time.Now()
	dmB.Cmd.Process.Signal(syscall.SIGKILL)
	const bound = 10 * time.Second
	select {
	case <-dmB.Done:
	case <-time.After(bound):
		clitest.AbortFUSE(t, mntB)
		t.Fatalf("B, killed with its change consumer in a notification, still running %s later (thread %s)", bound, stuck)
	}
	select {
	case err := <-mkDone:
		if err == nil {
			t.Fatal("the mkdir through the killed mount succeeded")
		}
	case <-time.After(bound):
		clitest.AbortFUSE(t, mntB)
		t.Fatalf("the mkdir through B still waiting %s after B exited", bound)
	}
	// What the kernel leaves of a killed daemon's mount: ENOTCONN.
	if _, err := os.Stat(filepath.Join(mntB, "q")); !errors.Is(err, syscall.ENOTCONN) {
		t.Errorf("stat through the killed mount: %v, want ENOTCONN", err)
	}
	t.Logf("B exited %s after SIGKILL", time.Since(killed).Round(time.Millisecond))
	if guard == 0 {
		t.Fatal("B ran no guard process")
	}
	clitest.Eventually(t, 10*time.Second, "B's guard to exit", func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", guard))
		return err != nil
	})
	clitest.StopDaemon(t, n.dmA)
}

// notifyStuck is a fleet of two mounts, A and B, with B's change
// consumer blocked in a notification: a mkdir of x through B waits in
// B's daemon behind the test's open insert of the same name (tx), with
// the root's lock held by the kernel, and A removed namespace q, which
// B's consumer invalidates in the root.
type notifyStuck struct {
	mntA, mntB string
	dmA, dmB   *clitest.Daemon
	tx         pgx.Tx
	mkDone     chan error
	stuck      string // the blocked thread of B, and its kernel stack
	mkOut      *clitest.SyncBuffer
}

// stuckInNotify sets up a notifyStuck, B mounted with bFlags added.
func stuckInNotify(t *testing.T, bFlags ...string) *notifyStuck {
	t.Helper()
	clitest.RequireFUSE(t)
	dsn := pgtest.DSN(t)
	flags := []string{"--kv", dsn, "--large", "pglo", "--fleet"}
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "q")
	n := &notifyStuck{mntA: t.TempDir(), mntB: t.TempDir()}
	n.dmA = clitest.StartDaemon(t, t.TempDir(), n.mntA, flags...)
	n.dmB = clitest.StartDaemon(t, t.TempDir(), n.mntB, append(flags, bFlags...)...)
	within(t, 10*time.Second, "a stat of namespace q on B", func() error {
		_, err := os.Stat(filepath.Join(n.mntB, "q"))
		return err
	})

	db, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	// The insert's transaction on a connection of its own: a transaction
	// sees pg_stat_activity as it was at its first look.
	holder, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close(context.Background()) })
	n.tx, err = holder.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.tx.Rollback(context.Background()) })
	if _, err := n.tx.Exec(t.Context(), `INSERT INTO ns (name, created_at) VALUES ('x', 0)`); err != nil {
		t.Fatal(err)
	}
	// The mkdir runs in a process of its own: it ends with the mount's
	// connection, or the test aborts that.
	mk := exec.Command("mkdir", filepath.Join(n.mntB, "x"))
	mkOut := &clitest.SyncBuffer{}
	mk.Stderr = mkOut
	n.mkOut = mkOut
	if err := mk.Start(); err != nil {
		t.Fatal(err)
	}
	n.mkDone = make(chan error, 1)
	go func() { n.mkDone <- mk.Wait() }()
	t.Cleanup(func() { mk.Process.Kill() })
	clitest.Eventually(t, 15*time.Second, "B's mkdir to wait behind the test's insert", func() bool {
		select {
		case err := <-n.mkDone:
			t.Fatalf("the mkdir through B ended (%v) while the test's insert of the name is open; B's log:\n%s", err, n.dmB.Stderr.String())
		default:
		}
		var k int
		err := db.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO ns %'`).Scan(&k)
		return err == nil && k == 1
	})

	if err := unix.Rmdir(filepath.Join(n.mntA, "q")); err != nil {
		t.Fatalf("rmdir q on A: %v", err)
	}
	pid := n.dmB.Cmd.Process.Pid
	clitest.Eventually(t, 15*time.Second, "B's change consumer to block in its notification", func() bool {
		n.stuck = blockedThread(pid)
		return n.stuck != ""
	})
	t.Logf("B's thread in the kernel: %s", n.stuck)
	return n
}

// TestFleetRestartInNotify: B of TestFleetKill9InNotify mounted with
// --restart-on-crash, killed the same way. Its guard restarts it on the
// live connection at once: the kernel resends the mkdir B left
// unanswered, the new daemon answers it once the test's insert ends,
// which frees the root's lock, so the killed daemon's notification ends
// and it exits. The mount lives on: x is made, A's rmdir shows, the new
// daemon serves the control and --listen sockets the dying one still
// held, and the mount unmounts cleanly.
func TestFleetRestartInNotify(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "http.sock")
	n := stuckInNotify(t, "--restart-on-crash", "--listen", "unix:"+sock)
	pid := n.dmB.Cmd.Process.Pid
	n.dmB.Cmd.Process.Signal(syscall.SIGKILL)
	clitest.Eventually(t, 20*time.Second, "B's guard to restart it", func() bool {
		return strings.Contains(n.dmB.Stderr.String(), "restarted it on the live connection")
	})
	if err := n.tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	const bound = 20 * time.Second
	select {
	case err := <-n.mkDone:
		// The killed daemon's own database session, alive while its
		// process waits on the mount, may commit the insert it waited on
		// once the test's ends: the resent mkdir then finds x there.
		if err != nil && !strings.Contains(n.mkOut.String(), "File exists") {
			t.Fatalf("the mkdir B left unanswered, resent to the restarted daemon: %v: %s\n%s", err, n.mkOut, n.dmB.Stderr.String())
		}
	case <-time.After(bound):
		clitest.AbortFUSE(t, n.mntB)
		t.Fatalf("the mkdir through B still waiting %s after the test's insert ended\n%s", bound, n.dmB.Stderr.String())
	}
	clitest.Eventually(t, bound, "the killed B to exit, its notification over", func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d/stat", pid))
		return err != nil
	})
	within(t, bound, "the mount after the restart", func() error {
		if _, err := os.Stat(filepath.Join(n.mntB, "x")); err != nil {
			return fmt.Errorf("stat of the namespace made by the resent mkdir: %v", err)
		}
		if _, err := os.Stat(filepath.Join(n.mntB, "q")); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("stat of q, removed on A: %v, want ENOENT", err)
		}
		return nil
	})
	if log := n.dmB.Stderr.String(); strings.Contains(log, "no control socket") || strings.Contains(log, "--listen") && strings.Contains(log, "level=ERROR") {
		t.Fatalf("the restarted daemon did not take the sockets over:\n%s", log)
	}
	if code, body := clitest.UnixGet(t, sock, "/metrics"); code != 200 || !strings.Contains(body, "\nalkblobfs_mount_crash_restarts_total 1\n") {
		t.Fatalf("GET /metrics from the restarted daemon: %d\n%.400s", code, body)
	}
	if out, err := exec.Command(clitest.Bin, "umount", n.mntB).CombinedOutput(); err != nil {
		t.Fatalf("umount B: %v: %s", err, out)
	}
	// B's standard error closes once the restarted daemon and the guard
	// (which kept it for that daemon's log) have exited.
	select {
	case <-n.dmB.Done:
	case <-time.After(bound):
		t.Fatalf("B's restarted daemon or guard still runs %s after the unmount", bound)
	}
	clitest.StopDaemon(t, n.dmA)
}

// blockedThread names a thread of process pid that sleeps
// uninterruptibly in a write to /dev/fuse (a notification), or "".
func blockedThread(pid int) string {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, e := range tasks {
		dir := fmt.Sprintf("/proc/%d/task/%s", pid, e.Name())
		st, err := os.ReadFile(dir + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ...: comm may hold spaces, not ')'.
		s := string(st)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) || s[i+2] != 'D' {
			continue
		}
		stack, _ := os.ReadFile(dir + "/stack")
		if strings.Contains(string(stack), "fuse_reverse_inval") || strings.Contains(string(stack), "fuse_dev_write") {
			return e.Name() + ": " + strings.Join(strings.Fields(string(stack)), " ")
		}
	}
	return ""
}

// guardOf finds the guard process of daemon pid (fusefs.GuardName), 0 if
// there is none, and checks that it holds no /dev/fuse descriptor: one
// would keep the connection from aborting when the daemon's closes.
func guardOf(t *testing.T, pid int) int {
	t.Helper()
	guard := clitest.GuardOf(pid) // started before the daemon logs that it mounted
	if guard == 0 {
		return 0
	}
	// A descriptor it inherited is closed as it starts (closeFUSE): give
	// it that long.
	clitest.Eventually(t, 10*time.Second, fmt.Sprintf("the guard (pid %d) to hold no /dev/fuse", guard), func() bool {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", guard))
		for _, fd := range fds {
			if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", guard, fd.Name())); l == "/dev/fuse" {
				return false
			}
		}
		return true
	})
	return guard
}

// TestGuardSparesNextMount: a fleet daemon that unmounted and exited but
// is not reaped yet (a zombie, which the guard counts as dying), and a
// new daemon mounted on the same directory — on the connection minor the
// first one freed, as the kernel hands out the lowest free one. The first
// daemon's guard, stopped meanwhile so that it looks only once both are
// so, must leave the new mount alone: the zombie holds no /dev/fuse.
func TestGuardSparesNextMount(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	dsn := pgtest.DSN(t)
	flags := []string{"--kv", dsn, "--large", "pglo", "--fleet"}
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "q")
	mnt := t.TempDir()
	// A: nothing waits for it, so that it stays a zombie once it exits.
	a := exec.Command(clitest.Bin, append([]string{"--data", t.TempDir(), "mount"}, append(flags, mnt)...)...)
	a.Env = append(os.Environ(), "HOME="+t.TempDir(), "XDG_DATA_HOME=")
	aerr := &clitest.SyncBuffer{}
	a.Stderr = aerr
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := false
	t.Cleanup(func() {
		if !reaped {
			a.Process.Kill()
			clitest.AbortFUSE(t, mnt)
			a.Wait()
		}
	})
	clitest.Eventually(t, 20*time.Second, "A to mount", func() bool { return strings.Contains(aerr.String(), "msg=mounted") })
	m := fusectlFind(t, mnt)
	guard := guardOf(t, a.Process.Pid)
	if guard == 0 {
		t.Fatal("A ran no guard process")
	}
	if err := syscall.Kill(guard, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(guard, syscall.SIGCONT)
	a.Process.Signal(syscall.SIGTERM)
	clitest.Eventually(t, 20*time.Second, "A to unmount and exit (a zombie)", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.Process.Pid))
		return err == nil && strings.Contains(string(b), "State:\tZ")
	})
	b := clitest.StartDaemon(t, t.TempDir(), mnt, flags...)
	if n := fusectlFind(t, mnt); n != m {
		t.Logf("B's connection is %d, A's was %d: this run cannot catch a guard that aborts by minor alone", n, m)
	}
	syscall.Kill(guard, syscall.SIGCONT)
	clitest.Eventually(t, 10*time.Second, "A's guard to exit", func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", guard))
		return err != nil
	})
	if _, err := os.Stat(filepath.Join(mnt, "q")); err != nil {
		t.Fatalf("stat through B after A's guard looked: %v (the guard aborted the next mount)", err)
	}
	a.Wait()
	reaped = true
	clitest.StopDaemon(t, b)
}

// fusectlFind is the connection minor of the mount on dir.
func fusectlFind(t *testing.T, dir string) uint64 {
	t.Helper()
	m, ok, err := fusectl.Find(dir)
	if err != nil || !ok {
		t.Fatalf("no mount on %s: %v", dir, err)
	}
	return m.Minor
}
