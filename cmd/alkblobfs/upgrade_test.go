//go:build linux

package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
)

// Tests of `alkblobfs upgrade` (issue 37, the read side): real daemons,
// real mounts, the binary under test upgraded to itself. The daemon an
// upgrade starts is no child of the test: upgradable's cleanup unmounts
// and waits for it to exit, and a test that gives up aborts the mount's
// FUSE connection (fusetest.GiveUp) rather than hang.

// upgradable is a mount whose daemon may be upgraded.
type upgradable struct {
	t    *testing.T
	c    *clitest.CLI
	mnt  string
	log  string // the daemons' log: every generation appends to it
	old  *exec.Cmd
	done chan struct{} // closed when the first daemon exited
	pid  int           // the daemon serving now
	conn uint64        // the mount's FUSE connection
	env  []string      // the daemon's environment added
	// pauses are the requests' pauses the upgrades reported, in order.
	pauses []time.Duration
}

var (
	upgradedPid = regexp.MustCompile(`pid (\d+) serves it`)
	pausedFor   = regexp.MustCompile(`requests paused (\S+)\)`)
	startedPid  = regexp.MustCompile(`started .* \(pid (\d+)\)`)
	noUploads   = regexp.MustCompile(`"uploads_in_flight":\s*0\b`)
)

// mountUpgradable mounts c's store with args, in a daemon that logs to a
// file (not a pipe: the next generation inherits the log, and a pipe
// would keep exec.Cmd.Wait of the first waiting for the last).
func mountUpgradable(t *testing.T, c *clitest.CLI, env []string, args ...string) *upgradable {
	t.Helper()
	clitest.RequireFUSE(t)
	u := &upgradable{t: t, c: c, mnt: t.TempDir(), log: filepath.Join(t.TempDir(), "mount.log"), done: make(chan struct{}), env: env}
	lf, err := os.OpenFile(u.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	u.old = exec.Command(clitest.Bin, append(append([]string{"--data", c.Data}, c.Flags...), append(append([]string{"mount"}, args...), u.mnt)...)...)
	u.old.Env = append(c.Environ(), env...)
	u.old.Stdout, u.old.Stderr = lf, lf
	if err := u.old.Start(); err != nil {
		t.Fatal(err)
	}
	u.pid = u.old.Process.Pid
	go func() { u.old.Wait(); close(u.done) }()
	t.Cleanup(u.cleanup)
	clitest.Eventually(t, 20*time.Second, "the mount", func() bool {
		select {
		case <-u.done:
			t.Fatalf("the daemon exited before it mounted:\n%s", u.logText())
		default:
		}
		return strings.Contains(u.logText(), "msg=mounted")
	})
	u.conn, err = fusetest.Conn(u.mnt)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func (u *upgradable) logText() string {
	b, _ := os.ReadFile(u.log)
	return string(b)
}

// upgrade runs alkblobfs upgrade with env added, at most 3 minutes.
func (u *upgradable) upgrade(env []string, args ...string) clitest.Result {
	u.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, clitest.Bin, append(append(append([]string{"--data", u.c.Data}, u.c.Flags...), "upgrade"), append(args, u.mnt)...)...)
	cmd.Env = append(u.c.Environ(), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		fusetest.GiveUp(u.t, u.mnt, u.conn, "alkblobfs upgrade did not return within 3 minutes")
		u.t.FailNow()
	}
	if _, isExit := err.(*exec.ExitError); err != nil && !isExit {
		u.t.Fatal(err)
	}
	return clitest.ResultOf(stdout.String(), stderr.String(), cmd.ProcessState)
}

// mustUpgrade upgrades and returns the new daemon's pid; the one before
// must have exited 0, and the new one must be alive.
func (u *upgradable) mustUpgrade() int {
	u.t.Helper()
	before := u.pid
	r := u.upgrade(nil)
	m := upgradedPid.FindStringSubmatch(r.Stdout)
	if r.Code != 0 || m == nil {
		u.t.Fatalf("alkblobfs upgrade: exit %d, stdout %q, stderr %q\nlog:\n%s", r.Code, r.Stdout, r.Stderr, u.logText())
	}
	u.pid, _ = strconv.Atoi(m[1])
	p := pausedFor.FindStringSubmatch(r.Stdout)
	if p == nil {
		u.t.Fatalf("alkblobfs upgrade did not say how long requests paused: %q", r.Stdout)
	}
	pause, err := time.ParseDuration(p[1])
	if err != nil {
		u.t.Fatalf("alkblobfs upgrade: the pause %q: %v", p[1], err)
	}
	u.pauses = append(u.pauses, pause)
	if u.pid == before || !alive(u.pid) {
		u.t.Fatalf("after the upgrade pid %d serves (before: %d), alive %v", u.pid, before, alive(u.pid))
	}
	if before == u.old.Process.Pid {
		select {
		case <-u.done:
			if code := u.old.ProcessState.ExitCode(); code != 0 {
				u.t.Fatalf("the old daemon exited %d after the upgrade", code)
			}
		case <-time.After(30 * time.Second):
			// Its goroutines, into the log, for the report.
			u.old.Process.Signal(syscall.SIGQUIT)
			select {
			case <-u.done:
			case <-time.After(5 * time.Second):
			}
			u.t.Fatalf("the old daemon still ran 30 s after the upgrade:\n%s", u.logText())
		}
	} else {
		u.waitGone(before, 30*time.Second)
	}
	// The old daemon retired its guard before it exited: one left
	// polling would take the exit for a death and abort the connection
	// the new daemon serves.
	if g := clitest.GuardOf(before); g != 0 {
		u.t.Fatalf("the guard (pid %d) of the old daemon (pid %d) still runs after it exited", g, before)
	}
	return u.pid
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func (u *upgradable) waitGone(pid int, within time.Duration) {
	u.t.Helper()
	deadline := time.Now().Add(within)
	for alive(pid) {
		if time.Now().After(deadline) {
			u.t.Fatalf("daemon pid %d still runs %s after it should have exited:\n%s", pid, within, u.logText())
		}
		time.Sleep(20 * time.Millisecond) // a poll: the test is not the parent of an upgraded daemon
	}
}

// cleanup unmounts and waits for the daemon serving, whichever
// generation, to exit: no daemon is left behind.
func (u *upgradable) cleanup() {
	t := u.t
	if _, err := fusetest.Conn(u.mnt); err == nil {
		fusetest.Unmount(t, u.mnt, u.conn, 20*time.Second, func() error {
			out, err := exec.Command(clitest.Bin, "umount", u.mnt).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
	}
	deadline := time.Now().Add(20 * time.Second)
	for alive(u.pid) {
		if time.Now().After(deadline) {
			t.Errorf("daemon pid %d still runs 20 s after the unmount; killing it", u.pid)
			syscall.Kill(u.pid, syscall.SIGKILL)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The first daemon, whichever serves now: one that failed to exit
	// after handing over is killed (and the test told), never left.
	select {
	case <-u.done:
	case <-time.After(20 * time.Second):
		if u.pid != u.old.Process.Pid {
			t.Errorf("the first daemon (pid %d) still runs after it handed over; killing it", u.old.Process.Pid)
		}
		u.old.Process.Kill()
		<-u.done
	}
	// A binary built with -race reports into the log.
	if strings.Contains(u.logText(), "WARNING: DATA RACE") {
		t.Errorf("a daemon reported a data race:\n%s", u.logText())
	} else if t.Failed() {
		// Whatever failed, what the daemons said goes with the report.
		t.Logf("the daemons' log:\n%s", u.logText())
	}
}

// watchdog runs fn, which touches the mount, and gives up on the mount
// (aborting its connection, so that fn returns) if fn takes over within.
func (u *upgradable) watchdog(within time.Duration, what string, fn func() error) {
	u.t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		if err != nil {
			u.t.Fatalf("%s: %v\nlog:\n%s", what, err, u.logText())
		}
	case <-time.After(within):
		fusetest.GiveUp(u.t, u.mnt, u.conn, what+" did not end within "+within.String())
		<-done
		u.t.FailNow()
	}
}

// stats reads the mount's stats file.
func (u *upgradable) stats() string {
	b, err := os.ReadFile(filepath.Join(u.mnt, ".alkblobfs", "stats"))
	if err != nil {
		u.t.Fatal(err)
	}
	return string(b)
}

// noPinsLeft waits until the store holds no pin row of a live process,
// once every reader closed: a released pin's row goes at the next renewal
// tick of its process (a third of --pin-ttl).
func noPinsLeft(t *testing.T, data string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, rows := pinRows(t, data)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pin rows of live processes 60 s after the readers closed:\n%s", n, rows)
		}
		time.Sleep(100 * time.Millisecond) // a poll of the database: nothing tells of a row's delete
	}
}

// noIntentsLeft waits until the store holds no pending link (ns_pending:
// a version committed at a close or fsync and not yet linked), once
// every writer closed: the last release links it at once.
func noIntentsLeft(t *testing.T, data string) {
	t.Helper()
	e, err := sqlite.Open(t.Context(), filepath.Join(data, "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var n int
	clitest.Eventually(t, 20*time.Second, "no pending link left", func() bool {
		if err := e.DB().QueryRowContext(t.Context(), "SELECT count(*) FROM ns_pending").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}

// pinRows counts the store's pin rows (SQLite's gc_pins) of processes
// that live: a process killed during a test (a successor at a step of
// its takeover) leaves its rows to lapse after --pin-ttl, as any crash.
// rows lists them all, for a message.
func pinRows(t *testing.T, data string) (n int, all string) {
	t.Helper()
	e, err := sqlite.Open(t.Context(), filepath.Join(data, "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	rows, err := e.DB().QueryContext(t.Context(), "SELECT hex(digest), owner, expiry FROM gc_pins")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var d, owner string
		var expiry int64
		if err := rows.Scan(&d, &owner, &expiry); err != nil {
			t.Fatal(err)
		}
		// host:pid:nonce
		f := strings.Split(owner, ":")
		pid, err := strconv.Atoi(f[min(1, len(f)-1)])
		live := err != nil || alive(pid)
		if live {
			n++
		}
		fmt.Fprintf(&b, "%s %s expiry %d live %v\n", d, owner, expiry, live)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return n, b.String()
}

// startShell starts sh, a script that cds into the mount, says "in" and
// waits for a line on its stdin, and returns once it said "in": its
// stdin and its output's reader. A failing test kills it rather than
// leave it in the mount.
func (u *upgradable) startShell(sh *exec.Cmd) (io.WriteCloser, *bufio.Reader) {
	t := u.t
	t.Helper()
	shIn, _ := sh.StdinPipe()
	shOut, _ := sh.StdoutPipe()
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sh.ProcessState == nil {
			sh.Process.Kill()
			sh.Wait()
		}
	})
	shLines := bufio.NewReader(shOut)
	u.watchdog(30*time.Second, "the shell's cd", func() error {
		l, err := shLines.ReadString('\n')
		if err == nil && l != "in\n" {
			err = fmt.Errorf("the shell said %q", l)
		}
		return err
	})
	return shIn, shLines
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestUpgradeKeepsReaders: across one upgrade, under --verify=full (the
// dd reads through FUSE passthrough) and strict (every read through the
// daemon), a dd of a 64 MiB blob in progress (1 GiB under
// ALKBLOBFS_LONG) ends with the right sha256, and so do an mmap of a blob
// (half of it faulted in before the upgrade, half after), a reader
// holding one open, a directory listing in progress and a shell whose
// working directory is the namespace; new opens work; and once every
// reader closed, the store holds no pin.
func TestUpgradeKeepsReaders(t *testing.T) {
	for _, mode := range []string{"full", "strict"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testUpgradeKeepsReaders(t, mode)
		})
	}
}

func testUpgradeKeepsReaders(t *testing.T, mode string) {
	c := clitest.NewCLI(t, "--pin-ttl", "3s")
	size := 64 << 20
	if os.Getenv("ALKBLOBFS_LONG") != "" {
		size = 1 << 30
	}
	dir := t.TempDir()
	bigPath, _, big := clitest.WriteFile(t, dir, size, 1)
	mapPath, mapBytes, mapD := clitest.WriteFile(t, dir, 3<<20, 2)
	heldPath, heldBytes, heldD := clitest.WriteFile(t, dir, 2<<20, 3)
	c.OK("ns", "create", "ns", "list")
	c.OK("put", "--ns", "ns", bigPath, mapPath, heldPath)
	var listed []string
	var files []string
	for i := range 400 {
		p, _, d := clitest.WriteFile(t, dir, 100+i, uint64(100+i))
		files = append(files, p)
		listed = append(listed, d)
	}
	c.OK(append([]string{"put", "--ns", "list"}, files...)...)
	listed = append(listed, "incoming")
	slices.Sort(listed)
	listed = slices.Compact(listed)

	args := []string{"--verify=" + mode}
	if os.Getenv("ALKBLOBFS_TEST_UPGRADE_DEBUG") != "" {
		args = append(args, "--debug") // every request in the log
	}
	u := mountUpgradable(t, c, nil, args...)
	ns := filepath.Join(u.mnt, "ns")
	if mode == "full" {
		// Read once end to end: verified, the next opens pass through.
		u.watchdog(time.Minute, "a first read of the big blob", func() error {
			b, err := os.ReadFile(filepath.Join(ns, big))
			if err == nil && sha(b) != big {
				err = errors.New("wrong bytes")
			}
			return err
		})
	}
	ptBefore := ptOpens(t, u.stats())

	// The dd: it reads on until the pipe to the test is full, and waits
	// there with the blob open and part read, until the test reads on.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	dd := exec.Command("dd", "if="+filepath.Join(ns, big), "bs=1M", "status=none")
	dd.Stdout = pw
	var ddErr strings.Builder
	dd.Stderr = &ddErr
	if err := dd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	defer pr.Close()
	hash := sha256.New()
	u.watchdog(time.Minute, "the first 16 MiB of dd", func() error {
		_, err := io.CopyN(hash, pr, 16<<20)
		return err
	})
	if mode == "full" {
		if pt := ptOpens(t, u.stats()); pt <= ptBefore {
			t.Fatalf("--verify=full: the dd's open did not pass through (passthrough opens %d, before %d):\n%s", pt, ptBefore, u.stats())
		}
	}

	// An mmap, a reader holding a blob open, a listing in progress. The
	// mapping reads without readahead (MADV_RANDOM): its first half
	// faults in before the upgrade, its second half after it, each page
	// a READ of its own to the new daemon.
	mf, err := os.Open(filepath.Join(ns, mapD))
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	mem, unmap := mapShared(t, mf, len(mapBytes))
	if err := syscall.Madvise(mem, syscall.MADV_RANDOM); err != nil {
		t.Fatal(err)
	}
	half := len(mapBytes) / 2
	if got, err := faultSafeSum(mem[:half]); err != nil || got != sha(mapBytes[:half]) {
		t.Fatalf("the mmap's first half before the upgrade: %v", err)
	}
	held, err := os.Open(filepath.Join(ns, heldD))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	head := make([]byte, 1<<20)
	if _, err := io.ReadFull(held, head); err != nil {
		t.Fatal(err)
	}
	ld, err := os.Open(filepath.Join(u.mnt, "list"))
	if err != nil {
		t.Fatal(err)
	}
	defer ld.Close()
	first, err := ld.Readdirnames(30)
	if err != nil {
		t.Fatal(err)
	}

	// A shell in the namespace, waiting for a line to go on.
	sh := exec.Command("sh", "-c", `cd "$1" || exit 9; echo in; read go; ls; sha256sum "$2"`, "sh", ns, heldD)
	shIn, shLines := u.startShell(sh)

	pid := u.mustUpgrade()
	t.Logf("--verify=%s: pid %d serves after the upgrade", mode, pid)

	u.watchdog(2*time.Minute, "the readers after the upgrade", func() error {
		if _, err := io.Copy(hash, pr); err != nil {
			return fmt.Errorf("dd's output: %w", err)
		}
		if err := dd.Wait(); err != nil {
			return fmt.Errorf("dd: %v: %s", err, ddErr.String())
		}
		if got := hex.EncodeToString(hash.Sum(nil)); got != big {
			return fmt.Errorf("dd across the upgrade read %s, want %s", got, big)
		}
		if got, err := faultSafeSum(mem); err != nil || got != mapD {
			size := int64(-1)
			if fi, err := mf.Stat(); err == nil {
				size = fi.Size()
			}
			stats, _ := os.ReadFile(filepath.Join(u.mnt, ".alkblobfs", "stats"))
			return fmt.Errorf("the mmap across the upgrade: %v (sum %s; the file's size now %d, want %d; stats %s)", err, got, size, len(mapBytes), stats)
		}
		rest, err := io.ReadAll(held)
		if err != nil {
			return fmt.Errorf("the held reader: %w", err)
		}
		if sha(append(head, rest...)) != heldD || !slices.Equal(append(head, rest...), heldBytes) {
			return errors.New("the held reader across the upgrade read wrong bytes")
		}
		more, err := ld.Readdirnames(-1)
		if err != nil {
			return fmt.Errorf("the listing after the upgrade: %w", err)
		}
		all := append(first, more...)
		slices.Sort(all)
		if !slices.Equal(all, listed) {
			return fmt.Errorf("the listing across the upgrade has %d names (%d before it), want %d", len(all), len(first), len(listed))
		}
		io.WriteString(shIn, "go\n")
		shIn.Close()
		out, err := io.ReadAll(shLines)
		if err != nil || sh.Wait() != nil {
			return fmt.Errorf("the shell in the namespace after the upgrade: %v: %s", err, out)
		}
		if !strings.Contains(string(out), big) || !strings.Contains(string(out), heldD+"  "+heldD) {
			return fmt.Errorf("the shell in the namespace after the upgrade printed %q", out)
		}
		// New opens.
		b, err := os.ReadFile(filepath.Join(ns, mapD))
		if err != nil || sha(b) != mapD {
			return fmt.Errorf("a new open after the upgrade: %v", err)
		}
		return nil
	})
	unmap()
	mf.Close()
	held.Close()
	ld.Close()
	noPinsLeft(t, c.Data)
	if !strings.Contains(u.stats(), `"open_handles": 0`) {
		t.Fatalf("open handles left in the new daemon:\n%s", u.stats())
	}
}

var ptOpensRE = regexp.MustCompile(`"passthrough": \{[^}]*"opens": (\d+)`)

func ptOpens(t *testing.T, stats string) int {
	t.Helper()
	m := ptOpensRE.FindStringSubmatch(stats)
	if m == nil {
		t.Fatalf("no passthrough opens in the stats:\n%s", stats)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestUpgradeRefusesWriters: a put by path in progress (which does not
// carry across) refuses the upgrade, which names it; the old daemon
// serves on, the write goes on and publishes; another user may not upgrade the mount; once the
// file closed, the upgrade works, and a shell inside a directory made in
// incoming/ (which does not carry across) gets ESTALE.
func TestUpgradeRefusesWriters(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "ns")
	u := mountUpgradable(t, c, nil)
	old := u.pid
	// A put by path (a file created under its digest's name, by a shell,
	// which alone holds it: no fork of this test's closes a copy) does
	// not carry across.
	data := clitest.RandomBytes(300<<10, 7)
	src := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	sh := exec.Command("bash", "-c", `cd "$1" || exit 9
exec 3>"$2" || exit 8
echo in
read go
cat "$3" >&3 && exec 3>&- || exit 7
echo done`, "sh", filepath.Join(u.mnt, "ns"), clitest.Sum(data), src)
	shIn, shLines := u.startShell(sh)
	r := u.upgrade(nil)
	clitest.CheckFail(t, r, 1, "1 file in incoming/ not carried across an upgrade: ns/"+clitest.Sum(data)+" (put by path); retry when they close", []string{"upgrade"})
	select {
	case <-u.done:
		t.Fatal("the old daemon exited after a refused upgrade")
	default:
	}
	if u.pid != old {
		t.Fatalf("pid %d serves after a refused upgrade, want %d", u.pid, old)
	}
	u.watchdog(time.Minute, "the writer after the refusal", func() error {
		io.WriteString(shIn, "go\n")
		shIn.Close()
		out, _ := io.ReadAll(shLines)
		if err := sh.Wait(); err != nil || string(out) != "done\n" {
			return fmt.Errorf("the writer: %v, said %q", err, out)
		}
		return nil
	})
	clitest.Eventually(t, 10*time.Second, "the written file published", func() bool {
		return slices.Contains(clitest.Lines(c.OK("ls", "ns")), clitest.Sum(data))
	})
	if os.Geteuid() == 0 {
		// Another user may not upgrade root's mount.
		other := fusetest.NewUser(t)
		fusetest.Reachable(t, clitest.Bin)
		out, err := other.Sh(fmt.Sprintf("HOME=/nonexistent %s upgrade %s", clitest.Bin, u.mnt))
		if err == nil || !strings.Contains(out, "permission denied") || !alive(old) {
			t.Fatalf("upgrade by another user: %v: %q", err, out)
		}
	}
	// A directory made in incoming/ does not carry across: a shell
	// inside it gets ESTALE after the upgrade.
	sub := filepath.Join(u.mnt, "ns", "incoming", "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	sh = exec.Command("sh", "-c", `cd "$1" || exit 9; echo in; read go; ls . 2>&1; echo "ls: $?"`, "sh", sub)
	shIn, shLines = u.startShell(sh)
	u.mustUpgrade()
	u.watchdog(30*time.Second, "the shell in incoming/sub after the upgrade", func() error {
		io.WriteString(shIn, "go\n")
		shIn.Close()
		out, _ := io.ReadAll(shLines)
		sh.Wait()
		if !strings.Contains(string(out), "Stale file handle") {
			return fmt.Errorf("ls in a directory of incoming/ after the upgrade printed %q, want ESTALE", out)
		}
		return nil
	})
	b, err := os.ReadFile(filepath.Join(u.mnt, "ns", clitest.Sum(data)))
	if err != nil || clitest.Sum(b) != clitest.Sum(data) {
		t.Fatalf("the published file after the upgrade: %v", err)
	}
}

// TestUpgradeFailuresLeaveOldServing: the new process killed at each step
// before the takeover, a binary that is missing, one that exits at once,
// and a state in a format newer than the new build reads: each upgrade
// exits 1 saying why, and the old daemon serves on with the file held
// open reading right and its pin intact (the blob, unlinked and swept
// twice, still reads); then an upgrade works.
func TestUpgradeFailuresLeaveOldServing(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t, "--pin-ttl", "3s")
	c.OK("ns", "create", "ns")
	p, data, d := clitest.WriteFile(t, t.TempDir(), 5<<20, 11)
	c.OK("put", "--ns", "ns", p)
	u := mountUpgradable(t, c, nil)
	old := u.pid
	f, err := os.Open(filepath.Join(u.mnt, "ns", d))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var off int64
	readOn := func(what string) {
		t.Helper()
		u.watchdog(time.Minute, "a read "+what, func() error {
			buf := make([]byte, 256<<10)
			n, err := f.ReadAt(buf, off)
			if err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			if !slices.Equal(buf[:n], data[off:off+int64(n)]) {
				return fmt.Errorf("wrong bytes at %d", off)
			}
			off = (off + int64(n)) % int64(len(data))
			return nil
		})
	}
	readOn("before")
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"killed before it opens the store", []string{envTestDieAt + "=1"}, nil, `exited (signal: killed) before it said "hello"`},
		{"killed after hello", []string{envTestDieAt + "=2"}, nil, "the old daemon serves on"},
		{"killed after the handover arrived", []string{envTestDieAt + "=3"}, nil, `before it said "ready"`},
		{"killed after its pins", []string{envTestDieAt + "=4"}, nil, `before it said "ready"`},
		{"killed when told to serve", []string{envTestDieAt + "=5"}, nil, `before it said "serving"`},
		{"killed once it serves, before it says so", []string{envTestDieAt + "=6"}, nil, `before it said "serving"`},
		{"hangs once it serves", []string{envTestHangAt + "=6", envTestServingTimeout + "=3s"}, nil, `did not say "serving" within 3s; the new daemon was killed`},
		{"newer state", []string{envTestStateVersion + "=3"}, nil, "the new daemon refused: handover state version 3 is newer than this build reads (2)"},
		{"missing binary", nil, []string{"--binary", "/nonexistent/alkblobfs"}, "new binary: stat /nonexistent/alkblobfs: no such file or directory"},
		{"binary exits", nil, []string{"--binary", "/bin/false"}, `exited (exit status 1) before it said "hello"`},
	} {
		r := u.upgrade(tc.env, tc.args...)
		clitest.CheckFail(t, r, 1, tc.want, []string{"upgrade", tc.name})
		if !alive(old) || u.pid != old {
			t.Fatalf("%s: the old daemon is gone", tc.name)
		}
		if tc.args == nil && !strings.Contains(r.Stderr, "the old daemon serves on") {
			t.Fatalf("%s: the refusal does not say that the old daemon serves on: %q", tc.name, r.Stderr)
		}
		// The new process is gone, not left running beside the old.
		if m := startedPid.FindStringSubmatch(r.Stdout); m != nil {
			pid, _ := strconv.Atoi(m[1])
			u.waitGone(pid, 20*time.Second)
		} else if tc.args == nil {
			t.Fatalf("%s: upgrade did not say which process it started: %q", tc.name, r.Stdout)
		}
		readOn("after: " + tc.name)
		if _, err := os.Stat(filepath.Join(u.mnt, "ns", d)); err != nil {
			t.Fatalf("%s: a new lookup: %v", tc.name, err)
		}
	}
	// The pin: unlinked and swept twice, the open blob stays.
	c.OK("unlink", "ns", d)
	clitest.SweepVia(t, u.mnt)
	clitest.SweepVia(t, u.mnt)
	if !strings.Contains(c.OK("ls"), d) {
		t.Fatal("the open blob was collected: its pin did not hold after the failed upgrades")
	}
	readOn("after the sweeps")
	u.mustUpgrade()
	readOn("after the upgrade that worked")
	f.Close()
	noPinsLeft(t, c.Data)
	clitest.Collected(t, c, d, func() { clitest.SweepVia(t, u.mnt) })
}

// TestUpgradeLoop: 20 upgrades in a row (100 under ALKBLOBFS_LONG)
// under a read and write load (readers that open, read and close blobs
// of both tiers, one that keeps a blob open throughout, one that reads
// blobs through mappings, and a writer whose files in incoming/ span
// upgrades, some fsynced half way): 0 errors, 0 wrong bytes, every
// written file published under its digest at its close, no pin, stage
// file or upload left once they closed, and no daemon left once
// unmounted. It logs the write latency a writer saw and the pauses the
// upgrades reported (p50, p99, max).
func TestUpgradeLoop(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t, "--pin-ttl", "3s")
	c.OK("ns", "create", "ns")
	dir := t.TempDir()
	want := map[string][]byte{}
	var paths []string
	for i, n := range []int{3 << 10, 40 << 10, 1 << 20, 4 << 20, 9 << 20} {
		p, b, d := clitest.WriteFile(t, dir, n, uint64(40+i))
		want[d] = b
		paths = append(paths, p)
	}
	c.OK(append([]string{"put", "--ns", "ns"}, paths...)...)
	digests := make([]string, 0, len(want))
	for d := range want {
		digests = append(digests, d)
	}
	slices.Sort(digests)
	u := mountUpgradable(t, c, nil)

	var reads, errs, wrong atomic.Int64
	var firstErr atomic.Value
	fail := func(kind *atomic.Int64, err error) {
		kind.Add(1)
		firstErr.CompareAndSwap(nil, err.Error())
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 9))
			for {
				select {
				case <-stop:
					return
				default:
				}
				d := digests[rng.IntN(len(digests))]
				b, err := os.ReadFile(filepath.Join(u.mnt, "ns", d))
				switch {
				case err != nil:
					fail(&errs, err)
				case sha(b) != d:
					fail(&wrong, fmt.Errorf("%s read back as %s", d, sha(b)))
				}
				reads.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() { // one blob held open across every upgrade
		defer wg.Done()
		d := digests[len(digests)-1]
		f, err := os.Open(filepath.Join(u.mnt, "ns", d))
		if err != nil {
			fail(&errs, err)
			return
		}
		defer f.Close()
		buf := make([]byte, 64<<10)
		for off := int64(0); ; off = (off + int64(len(buf))) % int64(len(want[d])) {
			select {
			case <-stop:
				return
			default:
			}
			n, err := f.ReadAt(buf, off)
			if err != nil && !errors.Is(err, io.EOF) {
				fail(&errs, err)
				continue
			}
			if !slices.Equal(buf[:n], want[d][off:off+int64(n)]) {
				fail(&wrong, fmt.Errorf("held %s: wrong bytes at %d", d, off))
			}
			reads.Add(1)
		}
	}()
	// A reader through mappings: it maps a blob, faults it in page by
	// page (MADV_RANDOM: a READ for each page), checks its sum, unmaps
	// it and drops its pages from the page cache, so that the next
	// mapping reads again; its faults span the upgrades.
	var mapped atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			d := digests[i%len(digests)]
			if err := readMapped(filepath.Join(u.mnt, "ns", d), len(want[d]), d); err != nil {
				if errors.Is(err, errWrongBytes) {
					fail(&wrong, err)
				} else {
					fail(&errs, err)
				}
				continue
			}
			mapped.Add(1)
		}
	}()
	// A writer in incoming/: files of 1 to 6 MiB written 64 KiB a
	// write(2), one fsync in three files half way, across the
	// upgrades; each publishes its digest at its close. Each write's
	// time is kept: the pause a writer sees.
	var chunks, files atomic.Int64
	var latMu sync.Mutex
	var lat []time.Duration
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(7, 7))
		buf := make([]byte, 64<<10)
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			default:
			}
			w, err := os.Create(filepath.Join(u.mnt, "ns", "incoming", fmt.Sprintf("w%d", k)))
			if err != nil {
				fail(&errs, err)
				continue
			}
			h := sha256.New()
			n := 16 + rng.IntN(80)
			for i := range n {
				for j := range buf {
					buf[j] = byte(rng.Uint32())
				}
				start := time.Now()
				_, err := w.Write(buf)
				d := time.Since(start)
				if err != nil {
					fail(&errs, fmt.Errorf("write w%d: %w", k, err))
					break
				}
				latMu.Lock()
				lat = append(lat, d)
				latMu.Unlock()
				h.Write(buf)
				chunks.Add(1)
				if k%3 == 0 && i == n/2 {
					if err := w.Sync(); err != nil {
						fail(&errs, fmt.Errorf("fsync w%d: %w", k, err))
					}
				}
			}
			if err := w.Close(); err != nil {
				fail(&errs, fmt.Errorf("close w%d: %w", k, err))
				continue
			}
			d := hex.EncodeToString(h.Sum(nil))
			if _, err := os.Stat(filepath.Join(u.mnt, "ns", d)); err != nil {
				fail(&wrong, fmt.Errorf("w%d closed, its digest %s: %w", k, d, err))
			}
			files.Add(1)
		}
	}()
	stopped := false
	stopReaders := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopReaders()
	rounds := 20
	if os.Getenv("ALKBLOBFS_LONG") != "" {
		rounds = 100 // the loop: make test-long
	}
	failed := func() bool { return errs.Load()+wrong.Load() > 0 }
	upgrades := 0
	for upgrades < rounds && !failed() {
		before, wrote, maps := reads.Load(), chunks.Load(), mapped.Load()
		clitest.Eventually(t, 30*time.Second, "reads, mappings and writes between upgrades", func() bool {
			return failed() || reads.Load() > before+20 && chunks.Load() > wrote+5 && mapped.Load() > maps
		})
		if failed() {
			break // reported below, with the first error
		}
		u.mustUpgrade()
		upgrades++
		t.Logf("upgrade %d: pid %d, %d reads so far", upgrades, u.pid, reads.Load())
	}
	u.watchdog(time.Minute, "the readers' end", func() error { stopReaders(); return nil })
	t.Logf("%d upgrades, %d reads, %d blobs read through a mapping, %d files written (%d writes): %d errors, %d wrong", upgrades, reads.Load(), mapped.Load(), files.Load(), chunks.Load(), errs.Load(), wrong.Load())
	t.Logf("write(2) of 64 KiB across the upgrades: %s (%d writes)", percentiles(lat), len(lat))
	t.Logf("requests paused, as the upgrades reported: %s", percentiles(u.pauses))
	if errs.Load() != 0 || wrong.Load() != 0 {
		t.Fatalf("%d errors, %d wrong reads across %d upgrades; first: %v\nlog:\n%s", errs.Load(), wrong.Load(), upgrades, firstErr.Load(), u.logText())
	}
	noPinsLeft(t, c.Data)
	clitest.Eventually(t, 10*time.Second, "no stage file and no upload in flight", func() bool {
		stages, _ := filepath.Glob(filepath.Join(c.Data, "large", "stage", "*"))
		return len(stages) == 0 && noUploads.MatchString(u.stats())
	})
	noIntentsLeft(t, c.Data)
	last := u.pid
	u.cleanup()
	if alive(last) || clitest.DaemonRunning(u.mnt) {
		t.Fatal("a daemon is left after the unmount")
	}
	if n := strings.Count(u.logText(), "msg=\"handed over\""); n != rounds {
		t.Fatalf("%d daemons logged that they handed over, want %d", n, rounds)
	}
}

// percentiles says p50, p99 and max of ds (sorted in place).
func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	slices.Sort(ds)
	return fmt.Sprintf("p50 %s, p99 %s, max %s", ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1])
}

// TestUpgradeTellsServiceManager: under a Type=notify service (a
// NOTIFY_SOCKET of the test's), the new daemon sends MAINPID= with its own
// pid and READY=1, then waits on a BARRIER=1 until the manager has read
// them, before the old one exits; the old one never says STOPPING=1.
func TestUpgradeTellsServiceManager(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "notify")
	pc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var mu sync.Mutex
	var got []string
	go func() {
		buf := make([]byte, 4096)
		oob := make([]byte, 1024)
		for {
			n, oobn, _, _, err := pc.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			mu.Lock()
			got = append(got, string(buf[:n]))
			mu.Unlock()
			// A barrier's descriptor: closed, as the manager does once
			// it has read what came before.
			if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for i := range msgs {
					fds, _ := syscall.ParseUnixRights(&msgs[i])
					for _, fd := range fds {
						syscall.Close(fd)
					}
				}
			}
		}
	}()
	c := clitest.NewCLI(t)
	u := mountUpgradable(t, c, []string{"NOTIFY_SOCKET=" + sock})
	clitest.Eventually(t, 10*time.Second, "READY=1 from the first daemon", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0 && strings.HasPrefix(got[0], "READY=1")
	})
	pid := u.mustUpgrade()
	mu.Lock()
	defer mu.Unlock()
	all := strings.Join(got, "\n---\n")
	if !slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, fmt.Sprintf("MAINPID=%d\nREADY=1", pid)) }) ||
		!slices.Contains(got, "BARRIER=1") || strings.Contains(all, "STOPPING") {
		t.Fatalf("notifications across the upgrade to pid %d:\n%s\nlog:\n%s", pid, all, u.logText())
	}
}

// TestUpgradeKeepsRole: the new daemon keeps the old one's role: its pid
// record, the control socket (a second upgrade reaches it), the --listen
// socket (the same path answers, and goes with the last daemon), and the
// sweep timer as the control file set it.
func TestUpgradeKeepsRole(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	sock := filepath.Join(t.TempDir(), "http.sock")
	u := mountUpgradable(t, c, nil, "--listen", "unix:"+sock)
	timer := filepath.Join(u.mnt, ".alkblobfs", "sweep-timer")
	if err := os.WriteFile(timer, []byte("2h\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	metrics := func() {
		t.Helper()
		resp, err := client.Get("http://alkblobfs/metrics")
		if err != nil {
			t.Fatalf("GET /metrics on %s: %v", sock, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "alkblobfs_") {
			t.Fatalf("GET /metrics on %s: %s\n%.300s", sock, resp.Status, body)
		}
	}
	metrics()
	for range 2 {
		pid := u.mustUpgrade()
		client.CloseIdleConnections()
		metrics()
		if b, err := os.ReadFile(timer); err != nil || string(b) != "2h0m0s\n" {
			t.Fatalf("the sweep timer after the upgrade: %q, %v", b, err)
		}
		if os.Geteuid() == 0 {
			h := sha256.Sum256([]byte(u.mnt))
			rec, err := os.ReadFile(filepath.Join("/run/alkblobfs", hex.EncodeToString(h[:8])+".pid"))
			if f := strings.Fields(string(rec)); err != nil || len(f) < 1 || f[0] != strconv.Itoa(pid) {
				t.Fatalf("the pid record after the upgrade to pid %d: %q, %v", pid, rec, err)
			}
		}
	}
	u.cleanup()
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the --listen socket after the last daemon exited: %v", err)
	}
}

// TestUpgradeCarriesWriters: two writers (shells, each holding the only
// descriptor of a file in incoming/: one past the kv threshold, staged on
// disk, and a small one, in memory) write half of each, the mount is
// upgraded with the uploads live (the handover's log line counts them),
// they write the rest and close: both publish under their digests with
// the right content, and afterwards no stage file, no upload, no pin and
// no pending link is left. A third holds a file still empty, waiting for
// its last close (a FLUSH came with nothing written): it carries too, and
// its close publishes the empty blob.
func TestUpgradeCarriesWriters(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t, "--pin-ttl", "3s")
	c.OK("ns", "create", "ns")
	dir := t.TempDir()
	bigPath, big, bigSum := writeText(t, dir, 6<<20+123, 31)
	smallPath, small, smallSum := writeText(t, dir, 40<<10+7, 32)
	u := mountUpgradable(t, c, nil)
	inc := filepath.Join(u.mnt, "ns", "incoming")
	bigW := u.startWriter(inc, "big", bigPath, len(big)/2, len(big)-len(big)/2)
	smallW := u.startWriter(inc, "small", smallPath, len(small)/2, len(small)-len(small)/2)
	emptyW := u.startWriter(inc, "empty", smallPath, 0, 0)
	if stages, _ := filepath.Glob(filepath.Join(c.Data, "large", "stage", "*")); len(stages) != 1 {
		t.Fatalf("stage files before the upgrade: %q, want one (the big file's; the small one's in memory)", stages)
	}
	u.mustUpgrade()
	if !handedUploads(3).MatchString(u.logText()) {
		t.Fatalf("the handover did not carry 3 uploads (the empty file's is one):\n%s", u.logText())
	}
	for _, w := range []*halfWriter{bigW, smallW, emptyW} {
		if code := w.finish(); code != 0 {
			t.Fatalf("the writer of %s after the upgrade: exit %d", w.name, code)
		}
	}
	for _, want := range []struct {
		d    string
		data []byte
	}{{bigSum, big}, {smallSum, small}, {clitest.Sum(nil), nil}} {
		b, err := os.ReadFile(filepath.Join(u.mnt, "ns", want.d))
		if err != nil || !slices.Equal(b, want.data) {
			t.Fatalf("%s after the upgrade: %v (%d bytes, want %d)", want.d, err, len(b), len(want.data))
		}
	}
	clitest.Eventually(t, 10*time.Second, "no stage file and no upload in flight", func() bool {
		stages, _ := filepath.Glob(filepath.Join(c.Data, "large", "stage", "*"))
		return len(stages) == 0 && noUploads.MatchString(u.stats())
	})
	noPinsLeft(t, c.Data)
	noIntentsLeft(t, c.Data)
}

// handedUploads matches the old daemon's handover line when it carried n
// uploads.
func handedUploads(n int) *regexp.Regexp {
	return regexp.MustCompile(`handover: stopped serving and exported the mount.* uploads=` + strconv.Itoa(n) + ` `)
}

// writeText is writeFile with letters only: a shell's builtins (read -N,
// printf) carry it unchanged, where they would drop NUL bytes.
func writeText(t *testing.T, dir string, n int, seed uint64) (string, []byte, string) {
	t.Helper()
	b := clitest.RandomBytes(n, seed)
	for i := range b {
		b[i] = 'a' + b[i]%26
	}
	p := filepath.Join(dir, fmt.Sprintf("text-%d-%d", n, seed))
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, b, clitest.Sum(b)
}

// halfWriter is a shell writing a file of incoming/ in two halves, with
// a line on its stdin between them.
type halfWriter struct {
	u    *upgradable
	name string
	sh   *exec.Cmd
	in   io.WriteCloser
}

// writerScript writes with builtins only, through its stdout, which is
// the file: no fork and no redirection holds a copy of the descriptor,
// whose close would send a FLUSH and so commit the upload (a close of any
// copy does). Exit 7: the second half's write failed; 8: the first's.
const writerScript = `cd "$1" || exit 9
export LC_ALL=C
exec 5<"$2" || exit 9
IFS= read -r -N "$4" -u 5 first || exit 9
exec 1>"$3" || exit 9
printf %s "$first" || exit 8
first=
read go
IFS= read -r -N "$5" -u 5 rest || exit 9
printf %s "$rest" || exit 7
exec 1>&-`

// startWriter starts a halfWriter of name in dir, which writes n1 bytes
// of src and returns once the mount shows them, then n2 more at finish.
func (u *upgradable) startWriter(dir, name, src string, n1, n2 int) *halfWriter {
	t := u.t
	t.Helper()
	w := &halfWriter{u: u, name: name,
		sh: exec.Command("bash", "-c", writerScript, "sh", dir, src, name, strconv.Itoa(n1), strconv.Itoa(n2))}
	w.in, _ = w.sh.StdinPipe()
	if err := w.sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if w.sh.ProcessState == nil {
			w.sh.Process.Kill()
			w.sh.Wait()
		}
	})
	var size int64 = -1
	clitest.Eventually(t, 30*time.Second, fmt.Sprintf("the first %d bytes of %s written", n1, name), func() bool {
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
			size = fi.Size()
		}
		return size == int64(n1)
	})
	return w
}

// finish lets the writer write the rest and close, and returns its exit
// status.
func (w *halfWriter) finish() int {
	code := -1
	w.u.watchdog(time.Minute, "the writer of "+w.name, func() error {
		io.WriteString(w.in, "go\n")
		w.in.Close()
		w.sh.Wait()
		code = w.sh.ProcessState.ExitCode()
		return nil
	})
	return code
}

// TestUpgradeCarriesFsyncThenKill9: a file in incoming/ held open by a
// shell, with a version an fsync committed before the upgrade (dd
// conv=fsync through a descriptor of its own), and in the second case
// another after it; then kill -9 of the new daemon. As after any crash
// (docs/publish.md) the newest fsynced version publishes once the dead
// daemon's writer lease lapsed (here at a sweep's open), and the version
// before it never shows: the new daemon held the pending link from before
// it served, and the old one dropped its own.
func TestUpgradeCarriesFsyncThenKill9(t *testing.T) {
	t.Parallel()
	for _, after := range []bool{false, true} {
		t.Run(fmt.Sprint("fsync after the upgrade: ", after), func(t *testing.T) {
			t.Parallel()
			c := clitest.NewCLI(t, "--pin-ttl", "3s")
			c.OK("ns", "create", "ns")
			src, data, full := clitest.WriteFile(t, t.TempDir(), 3<<20, 33)
			half := len(data) / 2
			first := clitest.Sum(data[:half])
			u := mountUpgradable(t, c, nil)
			sh := exec.Command("bash", "-c", `cd "$1" || exit 9
exec 3>>f
dd if="$2" of=f bs=$3 count=1 conv=notrunc,fsync status=none || exit 8
echo in
read go
if [ "$4" = true ]; then
	dd if="$2" of=f bs=$3 skip=1 seek=1 conv=notrunc,fsync status=none || exit 7
fi
echo synced
read wait`, "sh", filepath.Join(u.mnt, "ns", "incoming"), src, strconv.Itoa(half), fmt.Sprint(after))
			shIn, shLines := u.startShell(sh)
			u.mustUpgrade()
			u.watchdog(time.Minute, "the writer after the upgrade", func() error {
				io.WriteString(shIn, "go\n")
				l, err := shLines.ReadString('\n')
				if err == nil && l != "synced\n" {
					err = fmt.Errorf("the writer said %q", l)
				}
				return err
			})
			syscall.Kill(u.pid, syscall.SIGKILL)
			u.waitGone(u.pid, 20*time.Second)
			sh.Process.Kill()
			sh.Wait()
			if out, err := exec.Command(clitest.Bin, "umount", "--force", u.mnt).CombinedOutput(); err != nil {
				t.Fatalf("umount --force after the kill: %v: %s", err, out)
			}
			want, never := full, first
			if !after {
				want, never = first, ""
			}
			clitest.Eventually(t, 30*time.Second, "the fsynced version published once the dead daemon's lease lapsed", func() bool {
				c.OK("sweep")
				return slices.Contains(clitest.Lines(c.OK("ls", "ns")), want)
			})
			if never != "" && slices.Contains(clitest.Lines(c.OK("ls", "ns")), never) {
				t.Fatalf("the version the second fsync superseded (%s) was published", never)
			}
			if got := clitest.Sum([]byte(c.OK("cat", want))); got != want {
				t.Fatalf("the published file reads back as %s", got)
			}
		})
	}
}

// TestUpgradeRefusedAfterGo: a new daemon that, told to serve, cannot
// record the carried files' pending links refuses before it serves: the
// old daemon serves on with the writer's upload (no EIO: the new one
// answered nothing), and the writer's close publishes the whole file.
func TestUpgradeRefusedAfterGo(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "ns")
	src, data, full := writeText(t, t.TempDir(), 1<<20, 35)
	half := len(data) / 2
	u := mountUpgradable(t, c, nil)
	old := u.pid
	w := u.startWriter(filepath.Join(u.mnt, "ns", "incoming"), "w", src, half, len(data)-half)
	r := u.upgrade([]string{envTestPendFail + "=1"})
	clitest.CheckFail(t, r, 1, "the new daemon refused: test hook: the pending links could not be recorded", []string{"upgrade"})
	if !alive(old) {
		t.Fatal("the old daemon is gone")
	}
	if !handedUploads(1).MatchString(u.logText()) {
		t.Fatalf("the handover did not carry the upload:\n%s", u.logText())
	}
	if code := w.finish(); code != 0 {
		t.Fatalf("the writer after the refused upgrade: exit %d\n%s", code, u.logText())
	}
	clitest.Eventually(t, 10*time.Second, "the whole file published", func() bool {
		return slices.Contains(clitest.Lines(c.OK("ls", "ns")), full)
	})
	if got := clitest.Lines(c.OK("ls", "ns")); len(got) != 1 {
		t.Fatalf("published after the refused upgrade: %q, want the whole file %s only", got, full)
	}
	noIntentsLeft(t, c.Data)
}

// TestUpgradeHandsBackWriters: a new daemon that took a file being
// written (its upload live: the handover carried it) and was killed once
// it served, before it said so: the old daemon serves on, and the
// writer's next write reports the failure (EIO: the new daemon may have
// answered writes the old one does not have); nothing of the file is
// published, and the log says to remount. A second file, held open with
// a version an fsync committed before the upgrade, still publishes that
// version at its last close.
func TestUpgradeHandsBackWriters(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "ns")
	src, data, _ := writeText(t, t.TempDir(), 1<<20, 34)
	half := len(data) / 2
	u := mountUpgradable(t, c, nil)
	old := u.pid
	inc := filepath.Join(u.mnt, "ns", "incoming")
	w := u.startWriter(inc, "w", src, half, len(data)-half)
	holder := u.startWriter(inc, "v", src, 0, 0)
	if out, err := exec.Command("dd", "if="+src, "of="+filepath.Join(inc, "v"), "bs="+strconv.Itoa(half), "skip=1", "count=1", "conv=notrunc,fsync", "status=none").CombinedOutput(); err != nil {
		t.Fatalf("dd conv=fsync: %v: %s", err, out)
	}
	r := u.upgrade([]string{envTestDieAt + "=6"})
	clitest.CheckFail(t, r, 1, `before it said "serving"`, []string{"upgrade"})
	if !alive(old) {
		t.Fatal("the old daemon is gone")
	}
	if !handedUploads(1).MatchString(u.logText()) {
		t.Fatalf("the handover did not carry the upload:\n%s", u.logText())
	}
	if code := w.finish(); code != 7 {
		t.Fatalf("the writer after the failed upgrade: exit %d, want 7 (its second write failed)", code)
	}
	if !strings.Contains(u.logText(), `level=ERROR msg="handover: the new daemon failed after it was told to serve;`) {
		t.Fatalf("no error in the log telling to remount:\n%s", u.logText())
	}
	if code := holder.finish(); code != 0 {
		t.Fatalf("the holder of the fsynced file after the failed upgrade: exit %d", code)
	}
	clitest.Eventually(t, 10*time.Second, "the version the fsync committed, published at the last close", func() bool {
		return slices.Contains(clitest.Lines(c.OK("ls", "ns")), clitest.Sum(data[half:]))
	})
	if got := clitest.Lines(c.OK("ls", "ns")); len(got) != 1 {
		t.Fatalf("published: %q, want only the fsynced version %s: the writes after the failed upgrade were not refused", got, clitest.Sum(data[half:]))
	}
	noIntentsLeft(t, c.Data)
}
