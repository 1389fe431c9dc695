//go:build linux

package fleet

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
)

// holdOpen starts a shell that writes "onetwo" into path through fd 3,
// with two children closing their copies of it after "one" and after
// "onetwo" (so two closes returned 0), and keeps fd 3 open until it is
// killed. It returns once both copies are closed.
func holdOpen(t *testing.T, path string) *exec.Cmd {
	t.Helper()
	marker := filepath.Join(t.TempDir(), "closed")
	sh := exec.Command("bash", "-c", fmt.Sprintf(`exec 3>%q; printf one >&3; ( exec 3>&- ); printf two >&3; ( exec 3>&- ); touch %q; exec sleep 60`, path, marker))
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sh.Process.Kill()
		sh.Wait()
	})
	clitest.Eventually(t, 10*time.Second, "the writer to close its copies", func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
	return sh
}

// TestCrashRecoveryIgnoresReusedPID: the next mount of a mountpoint
// publishes what a daemon killed by SIGKILL had committed at a close
// (and would have linked at the last RELEASE), even when the pid its
// holder row names belongs to another live process by then: liveness is
// the dead daemon's lock, which the kernel dropped, not its pid. The
// row's pid is rewritten to that of a running sleep, as a reused pid
// would have it. Without the lock, the next mount would take the sleep
// for the daemon and leave the file unpublished until the intent lapses
// (the 60 s pin TTL).
func TestCrashRecoveryIgnoresReusedPID(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "ns")
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt)
	sh := holdOpen(t, filepath.Join(mnt, "ns", "incoming", "f"))
	dm.Cmd.Process.Kill()
	dm.Wait(20 * time.Second)
	sh.Process.Kill()
	sh.Wait()

	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		other.Process.Kill()
		other.Wait()
	})
	// The closes the dead daemon journaled reach the database with the
	// next command that writes the store (publish.md), as its intents.
	c.OK("ns", "create", "other")
	holders := rewriteHolderPid(t, filepath.Join(c.Data, "kv.db"), dm.Cmd.Process.Pid, other.Process.Pid)
	if len(holders) != 1 {
		t.Fatalf("holders of pending links after the crash: %v; want the dead daemon's", holders)
	}
	if err := syscall.Kill(other.Process.Pid, 0); err != nil {
		t.Fatalf("the process now named by the row is not running: %v", err)
	}
	if listed := clitest.Lines(c.OK("ls", "ns")); len(listed) != 0 {
		t.Fatalf("the namespace lists %v before the mount came back", listed)
	}

	dm = clitest.StartDaemon(t, c.Data, mnt)
	final := clitest.Sum([]byte("onetwo"))
	if listed := clitest.Lines(c.OK("ls", "ns")); !slices.Equal(listed, []string{final}) {
		t.Fatalf("after the restart, with the dead daemon's row naming live pid %d, the namespace lists %v; want %s\n%s",
			other.Process.Pid, listed, final[:12], dm.Stderr.String())
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "ns", final)); err != nil || string(b) != "onetwo" {
		t.Fatalf("the recovered version reads as %q, %v", b, err)
	}
	clitest.StopDaemon(t, dm)
}

// rewriteHolderPid makes every pending-link holder that names pid from
// name to instead, and returns the holders after.
func rewriteHolderPid(t *testing.T, db string, from, to int) []string {
	t.Helper()
	e, err := sqlite.Open(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	rows, err := e.DB().QueryContext(t.Context(), `SELECT DISTINCT holder FROM ns_pending`)
	if err != nil {
		t.Fatal(err)
	}
	var hs []string
	for rows.Next() {
		var h string
		if err := rows.Scan(&h); err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	rows.Close()
	var out []string
	for _, h := range hs {
		// mount:<mountpoint>:<host>:<pid>:<id>
		i := strings.LastIndexByte(h, ':')
		j := strings.LastIndexByte(h[:i], ':')
		if h[j+1:i] != strconv.Itoa(from) {
			out = append(out, h)
			continue
		}
		nh := h[:j+1] + strconv.Itoa(to) + h[i:]
		if _, err := e.DB().ExecContext(t.Context(), `UPDATE ns_pending SET holder = ? WHERE holder = ?`, nh, h); err != nil {
			t.Fatal(err)
		}
		out = append(out, nh)
	}
	return out
}

// TestDetachedMountKeepsItsIntents: two daemons of one mountpoint — one
// lazily unmounted and still serving a file open for writing, and its
// successor — never settle each other's live intents: the successor
// publishes nothing of the file whose closes returned 0 while its writer
// keeps it open, and the first daemon publishes it at the last close.
func TestDetachedMountKeepsItsIntents(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "ns")
	mnt := t.TempDir()
	first := clitest.StartDaemon(t, c.Data, mnt)
	sh := holdOpen(t, filepath.Join(mnt, "ns", "incoming", "f"))
	if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	second := clitest.StartDaemon(t, c.Data, mnt)
	if listed := clitest.Lines(c.OK("ls", "ns")); len(listed) != 0 {
		t.Fatalf("the successor mount published %v while the detached one still serves its writer", listed)
	}
	select {
	case <-first.Done:
		t.Fatalf("the detached daemon exited while a file was open:\n%s", first.Stderr.String())
	default:
	}

	sh.Process.Kill()
	sh.Wait()
	final := clitest.Sum([]byte("onetwo"))
	clitest.Eventually(t, 10*time.Second, "the detached daemon to publish the file at its last close", func() bool {
		return slices.Equal(clitest.Lines(c.OK("ls", "ns")), []string{final})
	})
	first.Wait(20 * time.Second)
	if b, err := os.ReadFile(filepath.Join(mnt, "ns", final)); err != nil || string(b) != "onetwo" {
		t.Fatalf("through the successor, the file reads as %q, %v", b, err)
	}
	clitest.StopDaemon(t, second)
}

// TestLapsedWriterSettledByCLI: a mount killed by SIGKILL with a file
// whose fsync returned 0 (and still open) has that version linked by the
// CLI once the dead mount's lease lapses (--pin-ttl), with no mount of
// its mountpoint coming back: a command that writes the store (`sweep`,
// `put`) settles lapsed intents when it opens the store, and a running
// `alkblobfs serve` while it runs, as publish.md promises. A command that
// only reads (`ls`, `stat`) settles nothing: settling is a write
// transaction, which a reader must not queue behind a sweep's or take
// from the mounts; it leaves the lapsed intent to the next writer.
// Before, every command that opened the store writable settled, ls and
// stat included.
func TestLapsedWriterSettledByCLI(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	for _, command := range []string{"sweep", "put", "serve", "read"} {
		t.Run(command, func(t *testing.T) {
			c := clitest.NewCLI(t, "--pin-ttl", "1s")
			c.OK("ns", "create", "ns")
			var args []string
			switch command {
			case "sweep":
				args = []string{"sweep"}
			case "put":
				other := filepath.Join(t.TempDir(), "other")
				if err := os.WriteFile(other, clitest.RandomBytes(3000, 8), 0o600); err != nil {
					t.Fatal(err)
				}
				args = []string{"put", other}
			}
			mnt := t.TempDir()
			dm := clitest.StartDaemon(t, c.Data, mnt, "--pin-ttl", "1s")
			if command == "serve" {
				// Started before the kill, so only its loop can settle;
				// and before the file is opened, since a fork's exec
				// closes a copy of it, which is a close that commits.
				clitest.StartServeURL(t, c, `url=(unix:\S+)`, "--listen", "unix:"+filepath.Join(t.TempDir(), "sock"))
			}
			// The writer is a process of its own, which forks nothing: in
			// this test binary any parallel test's fork would hold a copy
			// of the descriptor until its exec closes it, and that close
			// is a close that commits the unsynced bytes too.
			synced := clitest.RandomBytes(5000, 7)
			writer := exec.Command("python3", "-c", `import os, sys
f = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(f, sys.stdin.buffer.read())
os.fsync(f)
os.write(f, b"never synced")
print("written", flush=True)
sys.stdin.close()
import time
time.sleep(3600)`, filepath.Join(mnt, "ns", "incoming", "f"))
			writer.Stdin = bytes.NewReader(synced)
			out, err := writer.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			writer.Stderr = os.Stderr
			if err := writer.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { writer.Process.Kill(); writer.Wait() })
			if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "written\n" {
				writer.Process.Kill()
				t.Fatalf("the writer said %q, %v; want written", line, err)
			}
			dm.Cmd.Process.Kill()
			dm.Wait(20 * time.Second)
			writer.Process.Kill() // its close finds the daemon gone
			writer.Wait()
			want := clitest.Sum(synced)
			kv := func() *sqlite.Engine {
				e, err := sqlite.Open(t.Context(), filepath.Join(c.Data, "kv.db"))
				if err != nil {
					t.Fatal(err)
				}
				return e
			}
			// count counts ns_pending's rows; lapsed, only those whose
			// lease has lapsed by the row clock the CLI judges by.
			count := func(lapsed bool) int {
				e := kv()
				defer e.Close()
				q, args := `SELECT COUNT(*) FROM ns_pending`, []any{}
				if lapsed {
					q, args = q+` WHERE expiry < ?`, []any{e.RowNow()}
				}
				var n int
				if err := e.DB().QueryRowContext(t.Context(), q, args...).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			pending := func() int { return count(false) }
			if n := pending(); n != 1 {
				t.Fatalf("after the kill, %d pending links; want the fsync's", n)
			}
			if command == "read" {
				// Wait (polling the row, on the clock the CLI judges
				// lapse by) until the intent has lapsed, so that a
				// settling command would take it.
				deadline := time.Now().Add(60 * time.Second)
				for count(true) != 1 {
					if time.Now().After(deadline) {
						t.Fatal("60 s after the kill, with a 1 s lease, the dead mount's intent has not lapsed")
					}
					time.Sleep(50 * time.Millisecond)
				}
				if listed := clitest.Lines(c.OK("ls", "ns")); len(listed) != 0 {
					t.Fatalf("ls lists %v before any writer settled the intent; want nothing", listed)
				}
				if got := c.Stat(want); got.Digest != want {
					t.Fatalf("stat %s: %+v", want[:12], got)
				}
				if n := pending(); n != 1 {
					t.Fatalf("after ls and stat, %d pending links; want the lapsed intent left to a writer", n)
				}
				args = []string{"sweep"} // the next writer settles it
			}
			// The intent lapses 1 s after the dead daemon's last renewal;
			// each run is the CLI's own chance to settle it.
			deadline := time.Now().Add(60 * time.Second)
			for pending() != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("60 s after the kill, with a 1 s lease, alkblobfs %s has not linked the dead mount's fsynced version", command)
				}
				if args != nil {
					c.OK(args...)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if listed := clitest.Lines(c.OK("ls", "ns")); !slices.Equal(listed, []string{want}) {
				t.Fatalf("the namespace lists %v; want the fsynced version %s", listed, want[:12])
			}
		})
	}
}
