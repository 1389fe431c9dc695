//go:build linux

package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
)

// The mount command is tested as a daemon: the binary built by TestMain,
// mounted on a t.TempDir(), signalled, killed and remounted.

func requireFUSE(t *testing.T) { fusetest.RequireFUSE(t) }

// eventually is fusetest.Eventually.
var eventually = fusetest.Eventually

type syncBuffer = fusetest.Buffer

// daemon is one `alkblobfs mount` process.
type daemon struct {
	t      *testing.T
	mnt    string
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	err    error
	conn   uint64 // the mount's FUSE connection, once it serves
}

func startDaemon(t *testing.T, data, mnt string, args ...string) *daemon {
	t.Helper()
	return startDaemonEnv(t, nil, data, mnt, args...)
}

// startDaemonEnv is startDaemon with env added to the daemon's environment
// (not t.Setenv's: the test may run in parallel with others).
func startDaemonEnv(t *testing.T, env []string, data, mnt string, args ...string) *daemon {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	d := &daemon{t: t, mnt: mnt, stderr: &syncBuffer{}, done: make(chan struct{})}
	d.cmd = exec.Command(bin, append([]string{"--data", data, "mount"}, append(args, mnt)...)...)
	d.cmd.Env = append(append(os.Environ(), "HOME="+t.TempDir(), "XDG_DATA_HOME="), env...)
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			d.cmd.Process.Kill()
			fusetest.Reap(t, mnt, d.conn, 15*time.Second, d.done)
		}
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		// The daemon's own word, not a stat: after a kill -9 the kernel
		// may still answer a stat from the dead mount's caches.
		if strings.Contains(d.stderr.String(), "msg=mounted") {
			d.conn, _ = fusetest.Conn(mnt)
			return d
		}
		select {
		case <-d.done:
			t.Fatalf("daemon exited before mounting: %v\n%s", d.err, d.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not mount within 20s:\n%s", d.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// openWithin opens path, retrying until it exists or within passes.
func openWithin(t *testing.T, path string, within time.Duration) *os.File {
	t.Helper()
	var f *os.File
	eventually(t, within, path+" to be readable", func() bool {
		var err error
		f, err = os.Open(path)
		return err == nil
	})
	return f
}

func sweepVia(t *testing.T, mnt string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(mnt, ".alkblobfs", "sweep"), []byte("run\n"), 0o644); err != nil {
		t.Fatalf("sweep through %s: %v", mnt, err)
	}
}

// readsTo reads the rest of f, opened on blob d with head read already,
// and fails unless the whole hashes to d.
func readsTo(t *testing.T, f *os.File, head []byte, d string) {
	t.Helper()
	rest, err := io.ReadAll(f)
	if err != nil {
		t.Fatalf("reading the open file: %v", err)
	}
	if got := sum(append(head, rest...)); got != d {
		t.Fatalf("the open file read back as %s, want %s", got, d)
	}
}

// collected sweeps (with sweep) until the store no longer lists d, and
// fails if that takes over 15 s.
func collected(t *testing.T, c *cli, d string, sweep func()) time.Duration {
	t.Helper()
	start := time.Now()
	for strings.Contains(c.ok("ls"), d) {
		if time.Since(start) > 15*time.Second {
			t.Fatalf("%s was never collected", d)
		}
		sweep()
		time.Sleep(200 * time.Millisecond)
	}
	return time.Since(start)
}

func stopDaemon(t *testing.T, dm *daemon) {
	t.Helper()
	dm.cmd.Process.Signal(syscall.SIGTERM)
	if code := dm.wait(20 * time.Second); code != 0 {
		t.Fatalf("mount exit %d after SIGTERM:\n%s", code, dm.stderr.String())
	}
}

// wait waits for the daemon to exit and returns its exit status.
func (d *daemon) wait(within time.Duration) int {
	d.t.Helper()
	select {
	case <-d.done:
	case <-time.After(within):
		d.t.Fatalf("daemon still running after %s:\n%s", within, d.stderr.String())
	}
	return d.cmd.ProcessState.ExitCode()
}

func isMounted(t *testing.T, dir string) bool {
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

// TestMountScrubAndStrict: the mount flags reach the mount: its stats show
// the verify mode and the scrub's timer and rate, and the timer scrubs.
func TestMountScrubAndStrict(t *testing.T) {
	t.Parallel()
	requireFUSE(t)
	c := newCLI(t)
	src, _, _ := writeFile(t, t.TempDir(), 300<<10, 3)
	c.ok("ns", "create", "s")
	c.ok("put", "--ns", "s", src)
	mnt := t.TempDir()
	startDaemon(t, c.data, mnt, "--verify=strict", "--scrub-every", "1s", "--scrub-rate", "50")
	type stats struct {
		Verify string `json:"verify"`
		Scrub  struct {
			Every string `json:"every"`
			Rate  int64  `json:"rate_bytes_per_s"`
			Runs  int64  `json:"runs"`
			Last  *struct {
				Checked int64 `json:"checked"`
			} `json:"last"`
		} `json:"scrub"`
	}
	var st stats
	eventually(t, 10*time.Second, "a timed scrub", func() bool {
		b, err := os.ReadFile(filepath.Join(mnt, ".alkblobfs", "stats"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		return st.Scrub.Runs > 0
	})
	if st.Verify != "strict" || st.Scrub.Every != "1s" || st.Scrub.Rate != 50e6 || st.Scrub.Last == nil || st.Scrub.Last.Checked != 1 {
		t.Fatalf("stats: %+v", st)
	}
}

func TestMountErrors(t *testing.T) {
	t.Parallel()
	requireFUSE(t)
	c := newCLI(t)
	missing := filepath.Join(t.TempDir(), "nope")
	c.fail(1, "does not exist", "mount", missing)
	c.fail(2, "verify", "mount", "--verify=fast", t.TempDir())
	c.fail(2, "MOUNTPOINT", "mount")
	c.fail(2, "keeps no namespaces", "--kv", "mem:", "mount", t.TempDir())

	mnt := t.TempDir()
	d := startDaemon(t, t.TempDir(), mnt)
	c.fail(1, "busy", "mount", mnt)
	d.cmd.Process.Signal(syscall.SIGTERM)
	if code := d.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, d.stderr.String())
	}
}

// TestMountStops: SIGINT and SIGTERM unmount and exit 0; so does an
// umount by someone else.
func TestMountStops(t *testing.T) {
	t.Parallel()
	requireFUSE(t)
	for _, how := range []string{"SIGINT", "SIGTERM", "umount"} {
		t.Run(how, func(t *testing.T) {
			mnt := t.TempDir()
			d := startDaemon(t, t.TempDir(), mnt)
			if err := os.Mkdir(filepath.Join(mnt, "ns"), 0o755); err != nil {
				t.Fatal(err)
			}
			switch how {
			case "SIGINT":
				d.cmd.Process.Signal(syscall.SIGINT)
			case "SIGTERM":
				d.cmd.Process.Signal(syscall.SIGTERM)
			case "umount":
				if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
					t.Fatalf("umount: %v: %s", err, out)
				}
			}
			if code := d.wait(20 * time.Second); code != 0 {
				t.Fatalf("exit %d:\n%s", code, d.stderr.String())
			}
			if isMounted(t, mnt) {
				t.Fatal("still mounted")
			}
			if !strings.Contains(d.stderr.String(), "unmounted") {
				t.Fatalf("no unmount log line:\n%s", d.stderr.String())
			}
		})
	}
}

func fileSHA(t *testing.T, p string) string {
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

// TestKillDuringWrite: kill -9 of the daemon in the middle of a large
// write into incoming/. The next mount clears the stale mount, start-up
// removes the stage file, nothing of the interrupted file is published,
// and everything published before is intact.
func TestKillDuringWrite(t *testing.T) {
	// Not parallel: its files open on the mount must see no close but its
	// own, and another test's fork and exec closes copies of them (a FLUSH each).
	requireFUSE(t)
	size := int64(256 << 20)
	if os.Getenv("ALKBLOBFS_LONG") == "1" {
		size = 1 << 30
	}
	data, mnt := newCLI(t).data, t.TempDir()
	d := startDaemon(t, data, mnt)
	ns := filepath.Join(mnt, "ns")
	if err := os.Mkdir(ns, 0o755); err != nil {
		t.Fatal(err)
	}
	// Published before the crash: kv tier, large tier, an empty file.
	src := t.TempDir()
	var want []string
	// Small: this process's RSS at fork shows up in its children's
	// ru_maxrss, which TestPeakRSSBounded measures.
	for i, n := range []int{0, 1000, 200 << 10, 1 << 20} {
		b := randomBytes(n, uint64(100+i))
		p := filepath.Join(src, fmt.Sprintf("f%d", i))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		want = append(want, sum(b))
	}
	if out, err := exec.Command("cp", "-r", src+"/.", filepath.Join(ns, "incoming")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	slices.Sort(want)

	// The interrupted write.
	f, err := os.Create(filepath.Join(ns, "incoming", "big"))
	if err != nil {
		t.Fatal(err)
	}
	var written int64
	var werr error
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		chunk := make([]byte, 256<<10)
		r := rand.New(rand.NewPCG(1, 2))
		for written < size {
			for i := 0; i < len(chunk); i += 8 {
				v := r.Uint64()
				for j := range 8 {
					chunk[i+j] = byte(v >> (8 * j))
				}
			}
			n, err := f.Write(chunk)
			written += int64(n)
			if err != nil {
				werr = err
				return
			}
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if fi, err := f.Stat(); err == nil && fi.Size() >= size/4 {
			break
		}
		select {
		case <-wrote:
			t.Fatalf("writer ended before the kill: %d bytes, %v", written, werr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("writer too slow")
		}
		time.Sleep(5 * time.Millisecond)
	}
	d.cmd.Process.Kill()
	d.wait(20 * time.Second)
	<-wrote
	f.Close()
	if werr == nil {
		t.Fatalf("the write of %d bytes survived the kill", written)
	}
	if _, err := os.Stat(mnt); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("after kill -9, stat of the mountpoint: %v (want ENOTCONN)", err)
	}

	// Remount: the stale mount is detected and cleared.
	d2 := startDaemon(t, data, mnt)
	if !strings.Contains(d2.stderr.String(), "stale mount") {
		t.Fatalf("no log line about the stale mount:\n%s\nfirst daemon:\n%s", d2.stderr.String(), d.stderr.String())
	}
	if ents, err := os.ReadDir(filepath.Join(data, "large", "stage")); err != nil || len(ents) != 0 {
		t.Fatalf("stage files after start-up: %v %v", ents, err)
	}
	ents, err := os.ReadDir(ns)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		if e.Name() != "incoming" {
			got = append(got, e.Name())
			if s := fileSHA(t, filepath.Join(ns, e.Name())); s != e.Name() {
				t.Fatalf("%s hashes to %s", e.Name(), s)
			}
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("namespace after the crash lists %v, want %v", got, want)
	}
	// Nothing half-published in the pool either.
	c := &cli{t: t, data: data}
	pool := lines(c.ok("ls"))
	slices.Sort(pool)
	if !slices.Equal(pool, want) {
		t.Fatalf("pool after the crash holds %v, want %v", pool, want)
	}
	d2.cmd.Process.Signal(syscall.SIGTERM)
	if code := d2.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d:\n%s", code, d2.stderr.String())
	}
}

// TestTwoMountsOneStore: two daemons mount one embedded store, beside CLI
// commands. A file held open through mount B survives a CLI rm, a CLI
// sweep and sweeps through mount A's control file, and reads to its last
// byte; once it is closed and unlinked, the next sweeps collect it. Blobs
// put through A read back through B.
func TestTwoMountsOneStore(t *testing.T) {
	t.Parallel()
	requireFUSE(t)
	c := newCLI(t)
	c.ok("ns", "create", "ns")
	mntA, mntB := t.TempDir(), t.TempDir()
	dmA := startDaemon(t, c.data, mntA, "--pin-ttl", "3s")
	dmB := startDaemon(t, c.data, mntB, "--pin-ttl", "3s")

	content := randomBytes(largeSize, 42)
	d := sum(content)
	if err := os.WriteFile(filepath.Join(mntA, "ns", "incoming", "f"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	f := openWithin(t, filepath.Join(mntB, "ns", d), 30*time.Second)
	defer f.Close()
	head := make([]byte, 4096)
	if _, err := io.ReadFull(f, head); err != nil {
		t.Fatal(err)
	}
	// Drop the only reference, then try every way to delete it.
	c.ok("unlink", "ns", d)
	c.fail(1, "protected", "rm", d)
	for range 2 {
		c.ok("sweep")
		sweepVia(t, mntA)
	}
	readsTo(t, f, head, d)
	if out := c.ok("ls"); !strings.Contains(out, d) {
		t.Fatal("a blob open on mount B was deleted")
	}
	f.Close()
	// Closed: B's row is dropped at its next renewal tick (TTL/3 = 1 s),
	// and sweeps then collect the blob.
	collected(t, c, d, func() { sweepVia(t, mntA) })
	stopDaemon(t, dmA)
	stopDaemon(t, dmB)
}

// TestKilledMountPinsExpire: the pin rows of a mount killed with kill -9,
// which never deletes them, stop protecting its blobs after --pin-ttl; a
// later sweep from another process then collects what nothing links.
func TestKilledMountPinsExpire(t *testing.T) {
	t.Parallel()
	requireFUSE(t)
	c := newCLI(t)
	c.ok("ns", "create", "ns")
	src := filepath.Join(t.TempDir(), "f")
	content := randomBytes(largeSize, 3)
	if err := os.WriteFile(src, content, 0o644); err != nil {
		t.Fatal(err)
	}
	d := strings.TrimSpace(c.ok("put", "--ns", "ns", src))
	mnt := t.TempDir()
	dm := startDaemon(t, c.data, mnt, "--pin-ttl", "2s")
	f, err := os.Open(filepath.Join(mnt, "ns", d))
	if err != nil {
		t.Fatal(err)
	}
	c.ok("unlink", "ns", d)
	c.ok("sweep")
	c.ok("sweep")
	if !strings.Contains(c.ok("ls"), d) {
		t.Fatal("swept while open on the mount")
	}
	dm.cmd.Process.Kill()
	dm.wait(20 * time.Second)
	f.Close()
	syscall.Unmount(mnt, syscall.MNT_DETACH)
	took := collected(t, c, d, func() { c.ok("sweep") })
	t.Logf("collected %s after the kill (pin TTL 2s)", took.Round(100*time.Millisecond))
}

// TestUmount: umount with a file open fails and changes nothing; without,
// it unmounts (the daemon exits 0); --force frees the
// mountpoint of a daemon that cannot answer (stopped here), aborting its
// connection; a directory that is not a mountpoint is an error.
func TestUmount(t *testing.T) {
	t.Parallel()
	requireFUSE(t)
	c := newCLI(t)
	mnt := t.TempDir()
	dm := startDaemon(t, c.data, mnt)
	// With a file open it fails (exit 1) and changes nothing.
	held, err := os.Open(filepath.Join(mnt, ".alkblobfs", "stats"))
	if err != nil {
		t.Fatal(err)
	}
	c.fail(1, "busy", "umount", mnt)
	if _, err := os.Stat(filepath.Join(mnt, ".alkblobfs", "stats")); err != nil {
		t.Fatalf("the mount after a refused umount: %v", err)
	}
	held.Close()
	c.ok("umount", mnt)
	if code := dm.wait(20 * time.Second); code != 0 {
		t.Fatalf("daemon exit %d after umount:\n%s", code, dm.stderr.String())
	}
	c.fail(1, "not a mountpoint", "umount", mnt)

	dm = startDaemon(t, c.data, mnt)
	dm.cmd.Process.Signal(syscall.SIGSTOP)
	defer dm.cmd.Process.Signal(syscall.SIGCONT)
	done := make(chan result, 1)
	go func() { done <- c.run(nil, "umount", "--force", mnt) }()
	select {
	case r := <-done:
		if r.code != 0 {
			t.Fatalf("umount --force: exit %d: %s", r.code, r.stderr)
		}
	case <-time.After(20 * time.Second):
		abortFUSE(t, mnt)
		t.Fatal("umount --force of a stopped daemon's mount hung")
	}
	if isMounted(t, mnt) {
		t.Fatal("still mounted after umount --force")
	}
	dm.cmd.Process.Signal(syscall.SIGCONT)
	dm.wait(20 * time.Second) // its connection is gone: it stops serving
	// The mountpoint takes a new mount at once.
	dm = startDaemon(t, c.data, mnt)
	stopDaemon(t, dm)
}

// TestReadOnlyMount: --read-only serves reads beside a read-write mount of
// the same store; every change through it is EROFS, and it does not sweep.
func TestReadOnlyMount(t *testing.T) {
	t.Parallel()
	requireFUSE(t)
	c := newCLI(t)
	c.ok("ns", "create", "ns")
	src, _, d := writeFile(t, t.TempDir(), largeSize, 4)
	c.ok("put", "--ns", "ns", src)
	rw, ro := t.TempDir(), t.TempDir()
	dmRW := startDaemon(t, c.data, rw)
	dmRO := startDaemon(t, c.data, ro, "--read-only")
	if b, err := os.ReadFile(filepath.Join(ro, "ns", d)); err != nil || sum(b) != d {
		t.Fatalf("read through the read-only mount: %v", err)
	}
	for what, err := range map[string]error{
		"write into incoming/": os.WriteFile(filepath.Join(ro, "ns", "incoming", "f"), []byte("x"), 0o644),
		"mkdir a namespace":    os.Mkdir(filepath.Join(ro, "other"), 0o755),
		"rm a blob":            os.Remove(filepath.Join(ro, "ns", d)),
		"sweep":                os.WriteFile(filepath.Join(ro, ".alkblobfs", "sweep"), []byte("run\n"), 0o644),
	} {
		if !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s through a read-only mount: %v; want EROFS", what, err)
		}
	}
	// A put through the read-write mount shows on the read-only one (once
	// the writer's RELEASE has reached the read-write mount: another
	// mount does not wait for it).
	if err := os.WriteFile(filepath.Join(rw, "ns", "incoming", "g"), []byte("from rw"), 0o644); err != nil {
		t.Fatal(err)
	}
	g := openWithin(t, filepath.Join(ro, "ns", sum([]byte("from rw"))), 30*time.Second)
	b, err := io.ReadAll(g)
	g.Close()
	if err != nil || string(b) != "from rw" {
		t.Fatalf("a blob put through the read-write mount, read through the read-only one: %q, %v", b, err)
	}
	c.fail(2, "does not sweep", "mount", "--read-only", "--sweep-every", "1h", t.TempDir())
	stopDaemon(t, dmRO)
	stopDaemon(t, dmRW)
}

// TestSystemdNotify: under a service manager (NOTIFY_SOCKET set), the
// mount says READY=1 once it serves and STOPPING=1 when it begins to stop.
func TestSystemdNotify(t *testing.T) {
	t.Parallel()
	requireFUSE(t)
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := newCLI(t)
	mnt := t.TempDir()
	dm := startDaemonEnv(t, []string{"NOTIFY_SOCKET=" + sock}, c.data, mnt)
	read := func() string {
		t.Helper()
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, 512)
		n, err := conn.Read(b)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		return string(b[:n])
	}
	if got := read(); !strings.HasPrefix(got, "READY=1\n") || !isMounted(t, mnt) {
		t.Fatalf("first notification %q (mounted: %v); want READY=1 once serving", got, isMounted(t, mnt))
	}
	dm.cmd.Process.Signal(syscall.SIGTERM)
	if got := read(); got != "STOPPING=1" {
		t.Fatalf("second notification %q; want STOPPING=1", got)
	}
	if code := dm.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}
