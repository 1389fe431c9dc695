//go:build linux

package main

import (
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

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// TestMountScrubAndStrict: the mount flags reach the mount: its stats show
// the verify mode and the scrub's timer and rate, and the timer scrubs.
func TestMountScrubAndStrict(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	src, _, _ := clitest.WriteFile(t, t.TempDir(), 300<<10, 3)
	c.OK("ns", "create", "s")
	c.OK("put", "--ns", "s", src)
	mnt := t.TempDir()
	clitest.StartDaemon(t, c.Data, mnt, "--verify=strict", "--scrub-every", "1s", "--scrub-rate", "50")
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
	clitest.Eventually(t, 10*time.Second, "a timed scrub", func() bool {
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
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	missing := filepath.Join(t.TempDir(), "nope")
	c.Fail(1, "does not exist", "mount", missing)
	c.Fail(2, "verify", "mount", "--verify=fast", t.TempDir())
	c.Fail(2, "MOUNTPOINT", "mount")
	c.Fail(2, "keeps no namespaces", "--kv", "mem:", "mount", t.TempDir())

	mnt := t.TempDir()
	d := clitest.StartDaemon(t, t.TempDir(), mnt)
	c.Fail(1, "busy", "mount", mnt)
	d.Cmd.Process.Signal(syscall.SIGTERM)
	if code := d.Wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, d.Stderr.String())
	}
}

// TestMountStops: SIGINT and SIGTERM unmount and exit 0; so does an
// umount by someone else.
func TestMountStops(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	for _, how := range []string{"SIGINT", "SIGTERM", "umount"} {
		t.Run(how, func(t *testing.T) {
			mnt := t.TempDir()
			d := clitest.StartDaemon(t, t.TempDir(), mnt)
			if err := os.Mkdir(filepath.Join(mnt, "ns"), 0o755); err != nil {
				t.Fatal(err)
			}
			switch how {
			case "SIGINT":
				d.Cmd.Process.Signal(syscall.SIGINT)
			case "SIGTERM":
				d.Cmd.Process.Signal(syscall.SIGTERM)
			case "umount":
				if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
					t.Fatalf("umount: %v: %s", err, out)
				}
			}
			if code := d.Wait(20 * time.Second); code != 0 {
				t.Fatalf("exit %d:\n%s", code, d.Stderr.String())
			}
			if clitest.IsMounted(t, mnt) {
				t.Fatal("still mounted")
			}
			if !strings.Contains(d.Stderr.String(), "unmounted") {
				t.Fatalf("no unmount log line:\n%s", d.Stderr.String())
			}
		})
	}
}

// TestKillDuringWrite: kill -9 of the daemon in the middle of a large
// write into incoming/. The next mount clears the stale mount, start-up
// removes the stage file, nothing of the interrupted file is published,
// and everything published before is intact.
func TestKillDuringWrite(t *testing.T) {
	// Not parallel: its files open on the mount must see no close but its
	// own, and another test's fork and exec closes copies of them (a FLUSH each).
	clitest.RequireFUSE(t)
	size := int64(256 << 20)
	if os.Getenv("ALKBLOBFS_LONG") == "1" {
		size = 1 << 30
	}
	data, mnt := clitest.NewCLI(t).Data, t.TempDir()
	d := clitest.StartDaemon(t, data, mnt)
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
		b := clitest.RandomBytes(n, uint64(100+i))
		p := filepath.Join(src, fmt.Sprintf("f%d", i))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		want = append(want, clitest.Sum(b))
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
	d.Cmd.Process.Kill()
	d.Wait(20 * time.Second)
	<-wrote
	f.Close()
	if werr == nil {
		t.Fatalf("the write of %d bytes survived the kill", written)
	}
	if _, err := os.Stat(mnt); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("after kill -9, stat of the mountpoint: %v (want ENOTCONN)", err)
	}

	// Remount: the stale mount is detected and cleared.
	d2 := clitest.StartDaemon(t, data, mnt)
	if !strings.Contains(d2.Stderr.String(), "stale mount") {
		t.Fatalf("no log line about the stale mount:\n%s\nfirst daemon:\n%s", d2.Stderr.String(), d.Stderr.String())
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
			if s := clitest.FileSHA(t, filepath.Join(ns, e.Name())); s != e.Name() {
				t.Fatalf("%s hashes to %s", e.Name(), s)
			}
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("namespace after the crash lists %v, want %v", got, want)
	}
	// Nothing half-published in the pool either.
	c := &clitest.CLI{T: t, Data: data}
	pool := clitest.Lines(c.OK("ls"))
	slices.Sort(pool)
	if !slices.Equal(pool, want) {
		t.Fatalf("pool after the crash holds %v, want %v", pool, want)
	}
	d2.Cmd.Process.Signal(syscall.SIGTERM)
	if code := d2.Wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d:\n%s", code, d2.Stderr.String())
	}
}

// TestTwoMountsOneStore: two daemons mount one embedded store, beside CLI
// commands. A file held open through mount B survives a CLI rm, a CLI
// sweep and sweeps through mount A's control file, and reads to its last
// byte; once it is closed and unlinked, the next sweeps collect it. Blobs
// put through A read back through B.
func TestTwoMountsOneStore(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "ns")
	mntA, mntB := t.TempDir(), t.TempDir()
	dmA := clitest.StartDaemon(t, c.Data, mntA, "--pin-ttl", "3s")
	dmB := clitest.StartDaemon(t, c.Data, mntB, "--pin-ttl", "3s")

	content := clitest.RandomBytes(clitest.LargeSize, 42)
	d := clitest.Sum(content)
	if err := os.WriteFile(filepath.Join(mntA, "ns", "incoming", "f"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	f := clitest.OpenWithin(t, filepath.Join(mntB, "ns", d), 30*time.Second)
	defer f.Close()
	head := make([]byte, 4096)
	if _, err := io.ReadFull(f, head); err != nil {
		t.Fatal(err)
	}
	// Drop the only reference, then try every way to delete it.
	c.OK("unlink", "ns", d)
	c.Fail(1, "protected", "rm", d)
	for range 2 {
		c.OK("sweep")
		clitest.SweepVia(t, mntA)
	}
	clitest.ReadsTo(t, f, head, d)
	if out := c.OK("ls"); !strings.Contains(out, d) {
		t.Fatal("a blob open on mount B was deleted")
	}
	f.Close()
	// Closed: B's row is dropped at its next renewal tick (TTL/3 = 1 s),
	// and sweeps then collect the blob.
	clitest.Collected(t, c, d, func() { clitest.SweepVia(t, mntA) })
	clitest.StopDaemon(t, dmA)
	clitest.StopDaemon(t, dmB)
}

// TestKilledMountPinsExpire: the pin rows of a mount killed with kill -9,
// which never deletes them, stop protecting its blobs after --pin-ttl; a
// later sweep from another process then collects what nothing links.
func TestKilledMountPinsExpire(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "ns")
	src := filepath.Join(t.TempDir(), "f")
	content := clitest.RandomBytes(clitest.LargeSize, 3)
	if err := os.WriteFile(src, content, 0o644); err != nil {
		t.Fatal(err)
	}
	d := strings.TrimSpace(c.OK("put", "--ns", "ns", src))
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt, "--pin-ttl", "2s")
	f, err := os.Open(filepath.Join(mnt, "ns", d))
	if err != nil {
		t.Fatal(err)
	}
	c.OK("unlink", "ns", d)
	c.OK("sweep")
	c.OK("sweep")
	if !strings.Contains(c.OK("ls"), d) {
		t.Fatal("swept while open on the mount")
	}
	dm.Cmd.Process.Kill()
	dm.Wait(20 * time.Second)
	f.Close()
	syscall.Unmount(mnt, syscall.MNT_DETACH)
	took := clitest.Collected(t, c, d, func() { c.OK("sweep") })
	t.Logf("collected %s after the kill (pin TTL 2s)", took.Round(100*time.Millisecond))
}

// TestUmount: umount with a file open fails and changes nothing; without,
// it unmounts (the daemon exits 0); --force frees the
// mountpoint of a daemon that cannot answer (stopped here), aborting its
// connection; a directory that is not a mountpoint is an error.
func TestUmount(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt)
	// With a file open it fails (exit 1) and changes nothing.
	held, err := os.Open(filepath.Join(mnt, ".alkblobfs", "stats"))
	if err != nil {
		t.Fatal(err)
	}
	c.Fail(1, "busy", "umount", mnt)
	if _, err := os.Stat(filepath.Join(mnt, ".alkblobfs", "stats")); err != nil {
		t.Fatalf("the mount after a refused umount: %v", err)
	}
	held.Close()
	c.OK("umount", mnt)
	if code := dm.Wait(20 * time.Second); code != 0 {
		t.Fatalf("daemon exit %d after umount:\n%s", code, dm.Stderr.String())
	}
	c.Fail(1, "not a mountpoint", "umount", mnt)

	dm = clitest.StartDaemon(t, c.Data, mnt)
	dm.Cmd.Process.Signal(syscall.SIGSTOP)
	defer dm.Cmd.Process.Signal(syscall.SIGCONT)
	done := make(chan clitest.Result, 1)
	go func() { done <- c.Run(nil, "umount", "--force", mnt) }()
	select {
	case r := <-done:
		if r.Code != 0 {
			t.Fatalf("umount --force: exit %d: %s", r.Code, r.Stderr)
		}
	case <-time.After(20 * time.Second):
		clitest.AbortFUSE(t, mnt)
		t.Fatal("umount --force of a stopped daemon's mount hung")
	}
	if clitest.IsMounted(t, mnt) {
		t.Fatal("still mounted after umount --force")
	}
	dm.Cmd.Process.Signal(syscall.SIGCONT)
	dm.Wait(20 * time.Second) // its connection is gone: it stops serving
	// The mountpoint takes a new mount at once.
	dm = clitest.StartDaemon(t, c.Data, mnt)
	clitest.StopDaemon(t, dm)
}

// TestReadOnlyMount: --read-only serves reads beside a read-write mount of
// the same store; every change through it is EROFS, and it does not sweep.
func TestReadOnlyMount(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "ns")
	src, _, d := clitest.WriteFile(t, t.TempDir(), clitest.LargeSize, 4)
	c.OK("put", "--ns", "ns", src)
	rw, ro := t.TempDir(), t.TempDir()
	dmRW := clitest.StartDaemon(t, c.Data, rw)
	dmRO := clitest.StartDaemon(t, c.Data, ro, "--read-only")
	if b, err := os.ReadFile(filepath.Join(ro, "ns", d)); err != nil || clitest.Sum(b) != d {
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
	g := clitest.OpenWithin(t, filepath.Join(ro, "ns", clitest.Sum([]byte("from rw"))), 30*time.Second)
	b, err := io.ReadAll(g)
	g.Close()
	if err != nil || string(b) != "from rw" {
		t.Fatalf("a blob put through the read-write mount, read through the read-only one: %q, %v", b, err)
	}
	c.Fail(2, "does not sweep", "mount", "--read-only", "--sweep-every", "1h", t.TempDir())
	clitest.StopDaemon(t, dmRO)
	clitest.StopDaemon(t, dmRW)
}

// TestSystemdNotify: under a service manager (NOTIFY_SOCKET set), the
// mount says READY=1 once it serves and STOPPING=1 when it begins to stop.
func TestSystemdNotify(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := clitest.NewCLI(t)
	mnt := t.TempDir()
	dm := clitest.StartDaemonEnv(t, []string{"NOTIFY_SOCKET=" + sock}, c.Data, mnt)
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
	if got := read(); !strings.HasPrefix(got, "READY=1\n") || !clitest.IsMounted(t, mnt) {
		t.Fatalf("first notification %q (mounted: %v); want READY=1 once serving", got, clitest.IsMounted(t, mnt))
	}
	dm.Cmd.Process.Signal(syscall.SIGTERM)
	if got := read(); got != "STOPPING=1" {
		t.Fatalf("second notification %q; want STOPPING=1", got)
	}
	if code := dm.Wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}
