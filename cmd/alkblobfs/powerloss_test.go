//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/local"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/store"
	"golang.org/x/sys/unix"
)

// TestPowerLoss cuts the power under a mount: the store's data directory
// is on an ext4 filesystem in a loop device, and the cut is the ext4
// shutdown ioctl without a log flush (xfstests' godown), after which
// nothing that is not on disk yet reaches it: dirty pages and the journal
// not yet committed are dropped, as a power loss drops them. Then the
// daemon is killed, the filesystem unmounted, the loop device detached
// and attached again and the filesystem mounted (replaying its journal),
// and the store must open and hold, intact:
//
//   - A': files put by `alkblobfs put --ns` (a command's Close syncs);
//   - A: files copied into incoming/, and then Store.Sync called (by a
//     child process that opens the store as a library: the fsync(2) of an
//     incoming/ file will call it in the daemon);
//   - B: files copied into incoming/ more than the sync timer's 1s (plus
//     a margin) before the cut;
//   - F: files written into incoming/ by dd conv=fsync just before the
//     cut: the fsync(2) in the daemon commits and syncs. F is checked in
//     the unguarded run too (the fsync is not part of what it turns off).
//
// C, files copied right before the cut, may be lost; the test reports
// what survived. Every blob left in the store must verify, and the
// next mount of the mountpoint must list A', A and B in the namespace.
// Each set is small files (the kv tier) and one large one.
//
// With ALKBLOBFS_POWERLOSS_UNGUARDED=1 it runs without the guard (the
// timer off, no Store.Sync) and must fail, losing the small files of A
// and B: that shows the cut drops what was not synced. Nothing else may
// sync for the store within the test: the ext4 is mounted with commit=60
// (its journal commit is every 5s by default), the kernel writes dirty
// pages back only after 30s (vm.dirty_expire_centisecs), longer than the
// test runs, and the sets are small, as SQLite checkpoints (and syncs)
// the WAL at 1000 pages, which a close in incoming/ adds about 12 to.
func TestPowerLoss(t *testing.T) {
	// Not parallel: the sync timer must have run within its interval and a margin.
	clitest.RequireFUSE(t)
	requirePowerCut(t)
	guarded := os.Getenv("ALKBLOBFS_POWERLOSS_UNGUARDED") != "1"
	var env []string // every command's and daemon's
	if !guarded {
		env = []string{syncEveryEnv + "=off"}
		t.Log("unguarded: no sync timer, no Store.Sync; this run must fail")
	}
	disk := newLoopDisk(t)
	data := filepath.Join(disk.dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	c := clitest.NewCLI(t)
	c.Data = data
	c.Env = env
	cliWithin(t, c, "ns", "create", "p")
	mnt, src := t.TempDir(), t.TempDir()
	dm := clitest.StartDaemonEnv(t, env, data, mnt)

	aPut := newPowerSet(t, src, "A'", "put --ns", 3, 1)
	cliWithin(t, c, append([]string{"put", "--ns", "p"}, aPut.files...)...)
	wal := walHeader(data)
	a := newPowerSet(t, src, "A", "cp into incoming/, then Store.Sync", 10, 2)
	a.copyIn(t, mnt)
	if guarded {
		syncStore(t, data)
	}
	b := newPowerSet(t, src, "B", "cp into incoming/ before the timer's interval", 10, 3)
	b.copyIn(t, mnt)
	// The timer's interval, and a margin for a loaded machine.
	time.Sleep(time.Until(b.acked.Add(store.DefaultSyncEvery + 2*time.Second)))
	fs := newPowerSet(t, src, "F", "dd conv=fsync into incoming/ just before the cut", 5, 5)
	fs.fsyncIn(t, mnt)
	cs := newPowerSet(t, src, "C", "cp into incoming/ just before the cut", 5, 4)
	cs.copyIn(t, mnt)
	// A plain file, never synced: whether the cut dropped it says whether
	// the cut works (a sync(2) elsewhere on the machine may save it).
	sentinel := filepath.Join(disk.dir, "sentinel")
	if err := os.WriteFile(sentinel, []byte("written just before the cut\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	if !bytes.Equal(walHeader(data), wal) {
		// Safe, but the sets are then synced by SQLite, not only by the
		// store: an unguarded run may pass. Keep the sets small.
		t.Log("SQLite checkpointed the WAL while the sets were written (about 1000 pages), which syncs it")
	}
	disk.cut()
	cutAt := time.Now()
	dm.Cmd.Process.Kill()
	select {
	case <-dm.Done:
	case <-time.After(15 * time.Second):
		clitest.AbortFUSE(t, mnt)
		t.Fatal("the killed daemon did not exit within 15s")
	}
	if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
		t.Fatalf("detach the dead mount %s: %v", mnt, err)
	}
	if err := disk.umount(); err != nil {
		t.Fatal(err)
	}
	disk.detach()
	disk.attach()
	disk.mount()
	t.Logf("B acknowledged %s before the cut, C %s before", cutAt.Sub(b.acked).Round(time.Millisecond), cutAt.Sub(cs.acked).Round(time.Millisecond))
	if fi, err := os.Stat(sentinel); err == nil && fi.Size() > 0 {
		t.Log("the unsynced sentinel file survived the cut: something synced the filesystem (a sync(2) elsewhere?)")
	}

	// Present, readable and hashing to its name: verify reads each blob
	// whole and checks its sha256.
	must := slices.Concat(aPut.digests, a.digests, b.digests, fs.digests)
	r := cliRun(t, c, append([]string{"verify"}, must...)...)
	if r.Code != 0 {
		for _, l := range clitest.Lines(r.Stdout) {
			f := strings.Fields(l)
			if len(f) < 2 || f[0] != "MISSING" && f[0] != "CORRUPT" && f[0] != "UNREADABLE" {
				continue
			}
			for _, s := range []*powerSet{aPut, a, b, fs} {
				if slices.Contains(s.digests, f[1]) {
					s.lost = append(s.lost, f[0]+" "+f[1][:12])
				}
			}
		}
		for _, s := range []*powerSet{aPut, a, b, fs} {
			if len(s.lost) > 0 {
				t.Errorf("set %s (%s): %d of %d blobs not intact after the power cut: %s", s.name, s.how, len(s.lost), len(s.digests), strings.Join(s.lost, ", "))
			}
		}
		t.Fatalf("verify of sets A', A, B and F: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if r := cliRun(t, c, "verify"); r.Code != 0 {
		t.Fatalf("verify of the whole store after the cut: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}

	// The recovery mount links what the dead one had only committed.
	dm = clitest.StartDaemonEnv(t, env, data, mnt)
	var listed []string
	deadline := time.Now().Add(20 * time.Second)
	for {
		listed = clitest.Lines(cliWithin(t, c, "ls", "p"))
		missing := 0
		for _, d := range must {
			if !slices.Contains(listed, d) {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20s after the recovery mount, %d of the %d blobs of A', A, B and F are not in the namespace", missing, len(must))
		}
		time.Sleep(100 * time.Millisecond)
	}
	kept := 0
	for _, d := range cs.digests {
		if slices.Contains(listed, d) {
			kept++
		}
	}
	clitest.StopDaemon(t, dm)
	integrityCheck(t, filepath.Join(data, "kv.db"))
	t.Logf("A' %d, A %d, B %d, F %d blobs intact and listed; C (no guarantee): %d of %d survived", len(aPut.digests), len(a.digests), len(b.digests), len(fs.digests), kept, len(cs.digests))
}

// requirePowerCut skips without root, which the loop device and the ext4
// mount need, unless ALKBLOBFS_REQUIRE_FUSE=1 says the machine has it
// (make test): then it fails, as it does when a tool is missing.
func requirePowerCut(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("ALKBLOBFS_REQUIRE_FUSE") == "1" {
			t.Fatal("the power-loss test needs root (a loop device, an ext4 mount)")
		}
		t.Skip("the power-loss test needs root (a loop device, an ext4 mount)")
	}
	for _, tool := range []string{"mkfs.ext4", "losetup", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found (scripts/ci-deps.sh installs it): %v", tool, err)
		}
	}
}

// powerSet is a set of files written into the store together.
type powerSet struct {
	name, how string
	files     []string // the sources, outside the store
	digests   []string
	acked     time.Time // when the last write of the set returned
	lost      []string
}

// newPowerSet writes n files into src: n-1 small ones (the kv tier) and
// one for the large tier. how says how they are to be written.
func newPowerSet(t *testing.T, src, name, how string, n int, seed uint64) *powerSet {
	t.Helper()
	s := &powerSet{name: name, how: how}
	r := rand.New(rand.NewPCG(seed, 0x9e3779b9))
	for i := range n {
		size := 100 + r.IntN(3000)
		if i == n-1 {
			size = 200 << 10
		}
		b := clitest.RandomBytes(size, seed<<32|uint64(i))
		p := filepath.Join(src, fmt.Sprintf("set%d-%d", seed, i))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		s.files = append(s.files, p)
		s.digests = append(s.digests, clitest.Sum(b))
	}
	return s
}

// copyIn copies the set into the namespace's incoming/ with one cp, which
// fails if any close does; its success is the set's acknowledgement.
func (s *powerSet) copyIn(t *testing.T, mnt string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "cp", append(append([]string{"--"}, s.files...), filepath.Join(mnt, "p", "incoming")+"/")...).CombinedOutput()
	if err != nil {
		t.Fatalf("cp of set %s into %s: %v: %s", s.name, mnt, err, out)
	}
	s.acked = time.Now()
}

// fsyncIn writes each file of the set into incoming/ with dd conv=fsync,
// which fails unless the fsync and the close both return 0.
func (s *powerSet) fsyncIn(t *testing.T, mnt string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, p := range s.files {
		of := filepath.Join(mnt, "p", "incoming", filepath.Base(p))
		out, err := exec.CommandContext(ctx, "dd", "if="+p, "of="+of, "bs=64k", "conv=fsync", "status=none").CombinedOutput()
		if err != nil {
			t.Fatalf("dd conv=fsync of set %s into %s: %v: %s", s.name, mnt, err, out)
		}
	}
	s.acked = time.Now()
}

// syncChildEnv makes the test binary a child that opens the store in the
// data directory it names, calls Store.Sync and exits (init, below).
const syncChildEnv = "ALKBLOBFS_TEST_SYNC_STORE"

func init() {
	if data := os.Getenv(syncChildEnv); data != "" {
		if err := syncChild(data); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("synced")
		os.Exit(0)
	}
}

func syncChild(data string) error {
	ctx := context.Background()
	kv, err := sqlite.Open(ctx, filepath.Join(data, "kv.db"))
	if err != nil {
		return err
	}
	large, err := local.Open(ctx, filepath.Join(data, "large"), nil)
	if err != nil {
		kv.Close()
		return err
	}
	s, err := store.Open(ctx, store.Config{KV: kv, Large: large, SyncEvery: -1})
	if err != nil {
		kv.Close()
		large.Close()
		return err
	}
	return errors.Join(s.Sync(ctx), s.Close())
}

// syncStore runs Store.Sync on the store in data, in a child process.
func syncStore(t *testing.T, data string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), syncChildEnv+"="+data)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Equal(out, []byte("synced\n")) {
		t.Fatalf("Store.Sync in a child: %v: %s", err, out)
	}
}

// cliRun is c.Run bounded to a minute.
func cliRun(t *testing.T, c *clitest.CLI, args ...string) clitest.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, clitest.Bin, append(append([]string{"--data", c.Data}, c.Flags...), args...)...)
	cmd.Env = c.Environ()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if _, isExit := err.(*exec.ExitError); err != nil && !isExit {
		t.Fatalf("alkblobfs %s: %v", strings.Join(args, " "), err)
	}
	if ctx.Err() != nil {
		t.Fatalf("alkblobfs %s: still running after a minute", strings.Join(args, " "))
	}
	return clitest.ResultOf(stdout.String(), stderr.String(), cmd.ProcessState)
}

// cliWithin is c.OK bounded to a minute.
func cliWithin(t *testing.T, c *clitest.CLI, args ...string) string {
	t.Helper()
	r := cliRun(t, c, args...)
	if r.Code != 0 || r.Stderr != "" {
		t.Fatalf("alkblobfs %s: exit %d, stderr %q", strings.Join(args, " "), r.Code, r.Stderr)
	}
	return r.Stdout
}

// loopDisk is an ext4 filesystem in a file, on a loop device, mounted.
type loopDisk struct {
	t       *testing.T
	img     string // the image file
	dir     string // the mountpoint
	dev     string // the loop device; "" while detached
	mounted bool
}

// newLoopDisk makes a 256 MiB ext4 image, attaches and mounts it; the
// test's cleanup unmounts and detaches it whatever happened.
func newLoopDisk(t *testing.T) *loopDisk {
	t.Helper()
	tmp := t.TempDir()
	d := &loopDisk{t: t, img: filepath.Join(tmp, "ext4.img"), dir: filepath.Join(tmp, "mnt")}
	if err := os.Mkdir(d.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(d.img)
	if err == nil {
		err = errors.Join(f.Truncate(256<<20), f.Close())
	}
	if err != nil {
		t.Fatal(err)
	}
	// Inode tables and journal written now: no lazy initialization in the
	// background while the test runs.
	runWithin(t, "mkfs.ext4", "-q", "-F", "-b", "4096", "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", d.img)
	t.Cleanup(d.cleanup)
	d.attach()
	d.mount()
	return d
}

func (d *loopDisk) attach() {
	d.t.Helper()
	d.dev = strings.TrimSpace(runWithin(d.t, "losetup", "--find", "--show", d.img))
}

func (d *loopDisk) detach() {
	d.t.Helper()
	runWithin(d.t, "losetup", "--detach", d.dev)
	d.dev = ""
}

// mount mounts the device with a journal commit every 60s (not 5s), so
// that ext4 itself does not make the store's commits durable during the
// test.
func (d *loopDisk) mount() {
	d.t.Helper()
	runWithin(d.t, "mount", "-t", "ext4", "-o", "commit=60", d.dev, d.dir)
	d.mounted = true
}

// umount unmounts the filesystem, retrying for a while: the kernel may
// hold files of a FUSE mount just detached for a moment.
func (d *loopDisk) umount() error {
	var out []byte
	var err error
	for range 100 {
		if out, err = exec.Command("umount", d.dir).CombinedOutput(); err == nil {
			d.mounted = false
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("umount %s: %v: %s", d.dir, err, out)
}

// cut is the power loss: EXT4_IOC_SHUTDOWN with
// EXT4_GOING_FLAGS_NOLOGFLUSH. The filesystem fails every operation from
// now on, and what it had not written yet is never written.
func (d *loopDisk) cut() {
	d.t.Helper()
	const (
		ext4IOCShutdown          = 0x8004587d // _IOR('X', 125, __u32)
		ext4GoingFlagsNoLogFlush = 0x2
	)
	f, err := os.Open(d.dir)
	if err != nil {
		d.t.Fatal(err)
	}
	defer f.Close()
	if err := unix.IoctlSetPointerInt(int(f.Fd()), ext4IOCShutdown, ext4GoingFlagsNoLogFlush); err != nil {
		d.t.Fatalf("EXT4_IOC_SHUTDOWN on %s: %v", d.dir, err)
	}
}

func (d *loopDisk) cleanup() {
	if d.mounted {
		if err := d.umount(); err != nil {
			d.t.Errorf("%v; detaching it lazily", err)
			if out, err := exec.Command("umount", "-l", d.dir).CombinedOutput(); err != nil {
				d.t.Errorf("umount -l %s: %v: %s", d.dir, err, out)
			}
		}
	}
	if d.dev != "" {
		if out, err := exec.Command("losetup", "--detach", d.dev).CombinedOutput(); err != nil {
			d.t.Errorf("losetup --detach %s: %v: %s", d.dev, err, out)
		}
	}
}

// runWithin runs a command, bounded to a minute, and returns its output;
// a failure fails the test.
func runWithin(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// walHeader is the part of the store's WAL header that SQLite changes
// when it starts the WAL over after a checkpoint (the checkpoint sequence
// number and the salts); nil while there is no WAL.
func walHeader(data string) []byte {
	f, err := os.Open(filepath.Join(data, "kv.db-wal"))
	if err != nil {
		return nil
	}
	defer f.Close()
	b := make([]byte, 12)
	if _, err := f.ReadAt(b, 12); err != nil {
		return nil
	}
	return b
}

// TestSyncEveryEnv: $ALKBLOBFS_SYNC_EVERY takes a duration or off; a bad
// value is a usage error naming the variable.
func TestSyncEveryEnv(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	for _, v := range []string{"250ms", "off", "0"} {
		c.Env = []string{syncEveryEnv + "=" + v}
		c.OK("ls")
	}
	for _, v := range []string{"soon", "-1s"} {
		c.Env = []string{syncEveryEnv + "=" + v}
		c.Fail(2, syncEveryEnv, "ls")
	}
}
