package cache

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
)

// wchar is the bytes process pid has passed to write calls (its files,
// sockets and /dev/fuse alike), from /proc/PID/io.
func wchar(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		t.Skipf("no /proc/PID/io: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "wchar: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("no wchar in /proc/%d/io", pid)
	return 0
}

// mountStatsFile reads the mount's .alkblobfs/stats.
func mountStatsFile(t *testing.T, mnt string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(mnt, ".alkblobfs", "stats"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("stats: %v\n%s", err, b)
	}
	return m
}

// TestCacheMountWriteThrough: a file copied into incoming/ of a mount on
// S3 with --cache is in the cache once cp returns, by a link of the
// upload's scratch file: the daemon writes the content twice (its scratch
// file, the S3 upload), not three times, and fills nothing. With S3
// stopped and the kernel's caches dropped, ls -l and stat answer for it
// and for a blob the mount listed but never read, and the put's blob
// reads, passed through from the cache; the other is EIO.
func TestCacheMountWriteThrough(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	srv := s3test.FaultServer(t)
	cdir := filepath.Join(t.TempDir(), "cache")
	flags := []string{"--large", srv.URL, "--cache", cdir, "--cache-size", "64MiB"}
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "p")
	src := t.TempDir()
	fb, _, db := clitest.WriteFile(t, src, 3<<20, 12)
	c.OK("put", "--ns", "p", fb) // streamed: not cached
	const n = 8 << 20
	fa, a, da := clitest.WriteFile(t, src, n, 11)
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt, flags...)
	if pt := mountStatsFile(t, mnt)["passthrough"].(map[string]any); pt["active"] != true {
		t.Fatalf("a mount with --cache offers no passthrough: %v", pt)
	}
	before := wchar(t, dm.Cmd.Process.Pid)
	if out, err := exec.Command("cp", fa, filepath.Join(mnt, "p", "incoming", "a")).CombinedOutput(); err != nil {
		t.Fatalf("cp into incoming/: %v\n%s", err, out)
	}
	wrote := wchar(t, dm.Cmd.Process.Pid) - before
	if _, err := os.Stat(clitest.CachedFile(cdir, da)); err != nil {
		t.Fatalf("the put is not in the cache once cp returned: %v", err)
	}
	if wrote > n*5/2 {
		t.Fatalf("the daemon wrote %d bytes for a put of %d: the cache got a second copy", wrote, n)
	}
	if _, err := os.Stat(clitest.CachedFile(cdir, db)); err == nil {
		t.Fatal("a streamed put is in the cache")
	}
	want := map[string]int64{da: n, db: 3 << 20}
	// The mount's listing learns the sizes (the host's cache index keeps
	// them).
	if fis, err := os.ReadDir(filepath.Join(mnt, "p")); err != nil || len(fis) < 2 {
		t.Fatalf("list the namespace: %v %v", fis, err)
	}

	srv.Stop(t)
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200); err != nil {
		t.Skipf("cannot drop the kernel's caches: %v", err)
	}
	for d, size := range want {
		fi, err := os.Stat(filepath.Join(mnt, "p", d))
		if err != nil || fi.Size() != size {
			t.Fatalf("stat of %s with S3 stopped: %v, want %d bytes", d, err, size)
		}
	}
	out, err := exec.Command("ls", "-l", filepath.Join(mnt, "p")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), da) || !strings.Contains(string(out), db) {
		t.Fatalf("ls -l with S3 stopped: %v\n%s", err, out)
	}
	got, err := os.ReadFile(filepath.Join(mnt, "p", da))
	if err != nil || !bytes.Equal(got, a) {
		t.Fatalf("read of the put with S3 stopped: %v", err)
	}
	if _, err := os.ReadFile(filepath.Join(mnt, "p", db)); !errorsIsErrno(err, syscall.EIO) {
		t.Fatalf("read of an uncached blob with S3 stopped: %v, want EIO", err)
	}
	if pt := mountStatsFile(t, mnt)["passthrough"].(map[string]any); pt["opens"].(float64) < 1 {
		t.Fatalf("the cached read was not passed through: %v", pt)
	}
	srv.Start(t)
	s := cacheStat(t, c)
	if p := s["process"].(map[string]any); p["fills"].(float64) != 0 {
		t.Fatalf("the CLI filled the cache: %v", s)
	}
	clitest.StopDaemon(t, dm)
	s = cacheStat(t, c)
	if h := s["host"].(map[string]any); h["adopted"].(float64) != 1 || h["fills"].(float64) != 0 || h["bytes_filled"].(float64) != 0 {
		t.Fatalf("host counters after the put and the read: %v; want 1 adopted, nothing filled", h)
	}
}

// TestCachePglo: with --large pglo, a mount's first read of a blob fills
// the cache, the next one (a new open, the page cache dropped) is a hit
// passed through from the cached file (the fill verified it whole), and a
// cp into incoming/ lands in the cache by its scratch file.
func TestCachePglo(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	cdir := filepath.Join(t.TempDir(), "cache")
	flags := []string{"--kv", pgtest.DSN(t), "--large", "pglo", "--cache", cdir, "--cache-size", "64MiB"}
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "p")
	src := t.TempDir()
	fa, a, da := clitest.WriteFile(t, src, 5<<20+7, 21)
	c.OK("put", "--ns", "p", fa)
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt, flags...)
	if got, err := os.ReadFile(filepath.Join(mnt, "p", da)); err != nil || !bytes.Equal(got, a) {
		t.Fatalf("first read: %v", err)
	}
	waitCached(t, cdir, da)
	// --verify=full: the fill hashed the copy whole before it published
	// it, so the next open (the page cache dropped) passes it through, as
	// a local blob verified once in the process.
	clitest.DropPageCache(t)
	if got, err := os.ReadFile(filepath.Join(mnt, "p", da)); err != nil || !bytes.Equal(got, a) {
		t.Fatalf("second read: %v", err)
	}
	if pt := mountStatsFile(t, mnt)["passthrough"].(map[string]any); pt["active"] != true || pt["opens"].(float64) < 1 {
		t.Fatalf("the filled pglo blob was not passed through at its second read: %v", pt)
	}
	fb, _, db := clitest.WriteFile(t, src, 4<<20, 22)
	if out, err := exec.Command("cp", fb, filepath.Join(mnt, "p", "incoming", "b")).CombinedOutput(); err != nil {
		t.Fatalf("cp into incoming/: %v\n%s", err, out)
	}
	if _, err := os.Stat(clitest.CachedFile(cdir, db)); err != nil {
		t.Fatalf("the put is not in the cache once cp returned: %v", err)
	}
	clitest.StopDaemon(t, dm)
	h := cacheStat(t, c)["host"].(map[string]any)
	if h["fills"].(float64) != 1 || h["hits"].(float64) < 1 || h["adopted"].(float64) != 1 {
		t.Fatalf("host counters: %v; want 1 fill, a hit, 1 adopted", h)
	}
}
