package cache

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
)

// TestCacheFlagsRefused: --cache is for a remote large tier; with a local,
// mem or no large tier, and --cache-size alone, it is a usage error that
// opens nothing.
func TestCacheFlagsRefused(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	cdir := filepath.Join(t.TempDir(), "cache")
	c.Fail(2, "not remote", "--cache", cdir, "ls")
	c.Fail(2, "not remote", "--cache", cdir, "--large", "mem:", "ls")
	c.Fail(2, "not remote", "--cache", cdir, "--large", "none", "ls")
	c.Fail(2, "give --cache DIR too", "--cache-size", "1GiB", "ls")
	if _, err := os.Stat(cdir); !os.IsNotExist(err) {
		t.Fatalf("a refused --cache created its directory: %v", err)
	}
}

func waitCached(t *testing.T, cdir, d string) {
	t.Helper()
	clitest.Eventually(t, 20*time.Second, d+" to be in the cache", func() bool {
		_, err := os.Stat(clitest.CachedFile(cdir, d))
		return err == nil
	})
}

// TestCacheMountS3Down: a mount on S3 with --cache fills the cache on the
// first read; with the S3 server stopped, the cached blob still reads
// through the mount and an uncached one is EIO.
func TestCacheMountS3Down(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	srv := s3test.FaultServer(t)
	cdir := filepath.Join(t.TempDir(), "cache")
	flags := []string{"--large", srv.URL, "--cache", cdir, "--cache-size", "64MiB"}
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "p")
	src := t.TempDir()
	fa, a, da := clitest.WriteFile(t, src, 3<<20, 1)
	fb, _, db := clitest.WriteFile(t, src, 3<<20, 2)
	c.OK("put", "--ns", "p", fa, fb)
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt, flags...)
	got, err := os.ReadFile(filepath.Join(mnt, "p", da))
	if err != nil || !bytes.Equal(got, a) {
		t.Fatalf("first read through the mount: %v", err)
	}
	waitCached(t, cdir, da)
	if _, err := os.Stat(clitest.CachedFile(cdir, db)); err == nil {
		t.Fatalf("%s is cached without a read", db)
	}

	srv.Stop(t)
	clitest.DropPageCache(t)
	got, err = os.ReadFile(filepath.Join(mnt, "p", da))
	if err != nil || !bytes.Equal(got, a) {
		t.Fatalf("cached blob with S3 stopped: %v", err)
	}
	_, err = os.ReadFile(filepath.Join(mnt, "p", db))
	if !errorsIsErrno(err, syscall.EIO) {
		t.Fatalf("uncached blob with S3 stopped: %v, want EIO", err)
	}
	srv.Start(t)
	clitest.StopDaemon(t, dm)
}

func errorsIsErrno(err error, want syscall.Errno) bool {
	var pe *os.PathError
	if e, ok := err.(*os.PathError); ok {
		pe = e
	}
	return pe != nil && pe.Err == want
}

// TestCacheKill9MidFill: a mount killed while it fills the cache leaves a
// stage file and no copy; the next process that opens the cache removes
// the stage, and the blob then fills and reads whole.
func TestCacheKill9MidFill(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	cdir := filepath.Join(t.TempDir(), "cache")
	flags := []string{"--large", s3test.URL(t), "--cache", cdir}
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "p")
	f, b, d := clitest.WriteFile(t, t.TempDir(), 96<<20, 3)
	c.OK("put", "--ns", "p", f)
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt, flags...)
	fh, err := os.Open(filepath.Join(mnt, "p", d))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.Read(make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	stages := func() []string { m, _ := filepath.Glob(filepath.Join(cdir, "stage", "stage-*")); return m }
	if len(stages()) == 0 {
		t.Skip("the fill ended before the test saw its stage (a fast machine): nothing to kill mid-fill")
	}
	dm.Cmd.Process.Kill()
	dm.Wait(15 * time.Second)
	clitest.AbortFUSE(t, mnt)
	if _, err := os.Stat(clitest.CachedFile(cdir, d)); err == nil {
		t.Fatal("a fill cut by kill -9 published a copy")
	}
	if len(stages()) == 0 {
		t.Fatal("the kill left no stage (nothing was mid-fill)")
	}
	c.OK("ls", "p") // opens the cache
	if s := stages(); len(s) != 0 {
		t.Fatalf("stages left after the next start: %v", s)
	}
	mnt2 := t.TempDir()
	dm2 := clitest.StartDaemon(t, c.Data, mnt2, flags...)
	got, err := os.ReadFile(filepath.Join(mnt2, "p", d))
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("read after the restart: %v", err)
	}
	waitCached(t, cdir, d)
	clitest.StopDaemon(t, dm2)
}

// cacheStat runs `alkblobfs cache stat --json`.
func cacheStat(t *testing.T, c *clitest.CLI) map[string]any {
	t.Helper()
	var m map[string]any
	out := c.OK("cache", "stat", "--json")
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("cache stat --json: %v\n%s", err, out)
	}
	return m
}

// TestCacheSharedAndSweep: two mounts of one store with the same --cache
// fill it once between them (the second reads the first's copy), and a
// sweep that deletes the blob from S3 deletes it from the cache too.
func TestCacheSharedAndSweep(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	cdir := filepath.Join(t.TempDir(), "cache")
	flags := []string{"--large", s3test.URL(t), "--cache", cdir, "--gc-window", "0"}
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "p")
	f, b, d := clitest.WriteFile(t, t.TempDir(), 4<<20, 4)
	c.OK("put", "--ns", "p", f)
	mntA, mntB := t.TempDir(), t.TempDir()
	dmA := clitest.StartDaemon(t, c.Data, mntA, flags...)
	dmB := clitest.StartDaemon(t, c.Data, mntB, flags...)
	if got, err := os.ReadFile(filepath.Join(mntA, "p", d)); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("read through A: %v", err)
	}
	waitCached(t, cdir, d)
	if got, err := os.ReadFile(filepath.Join(mntB, "p", d)); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("read through B: %v", err)
	}
	clitest.StopDaemon(t, dmB) // its counters go to the host's
	var s map[string]any
	clitest.Eventually(t, 10*time.Second, "A's fill and B's hit to reach the host's counters (A flushes every 2 s, B at its exit)", func() bool {
		s = cacheStat(t, c)
		h := s["host"].(map[string]any)
		return h["fills"].(float64) >= 1 && h["hits"].(float64) >= 1
	})
	host := s["host"].(map[string]any)
	if host["fills"].(float64) != 1 || host["hits"].(float64) < 1 || s["blobs"].(float64) != 1 {
		t.Fatalf("two mounts, one cache: %v", s)
	}
	// The mount's stats file shows the cache too.
	st, err := os.ReadFile(filepath.Join(mntA, ".alkblobfs", "stats"))
	if err != nil {
		t.Fatal(err)
	}
	var ms struct {
		Cache *struct {
			Blobs int64 `json:"blobs"`
		} `json:"cache"`
	}
	if err := json.Unmarshal(st, &ms); err != nil || ms.Cache == nil || ms.Cache.Blobs != 1 {
		t.Fatalf("A's stats file: %v, cache %+v:\n%s", err, ms.Cache, st)
	}
	if err := os.Remove(filepath.Join(mntA, "p", d)); err != nil {
		t.Fatal(err)
	}
	clitest.Eventually(t, 15*time.Second, "the sweep to delete the blob and its cached copy", func() bool {
		clitest.SweepVia(t, mntA)
		_, err := os.Stat(clitest.CachedFile(cdir, d))
		return os.IsNotExist(err)
	})
	if strings.Contains(c.OK("ls"), d) {
		t.Fatal("the blob is still in the pool")
	}
	clitest.StopDaemon(t, dmA)
}

// TestCacheWarmDrop: `cache warm NS` fetches a namespace's remote blobs
// into the cache ahead of any read, `cache warm DIGEST` one blob, and
// `cache drop` empties it; the blobs stay in the store.
func TestCacheWarmDrop(t *testing.T) {
	t.Parallel()
	cdir := filepath.Join(t.TempDir(), "cache")
	c := clitest.NewCLI(t, "--large", s3test.URL(t), "--cache", cdir)
	c.OK("ns", "create", "w")
	var ds []string
	for i := range 2 {
		f, _, d := clitest.WriteFile(t, t.TempDir(), 300<<10, uint64(60+i))
		c.OK("put", "--ns", "w", f)
		ds = append(ds, d)
	}
	f, _, loose := clitest.WriteFile(t, t.TempDir(), 300<<10, 62)
	c.OK("put", f)
	c.OK("cache", "drop") // whatever the puts left there
	if n := cacheStat(t, c)["blobs"].(float64); n != 0 {
		t.Fatalf("after drop: %v blobs cached", n)
	}
	c.OK("cache", "warm", "w")
	for _, d := range ds {
		if _, err := os.Stat(clitest.CachedFile(cdir, d)); err != nil {
			t.Fatalf("warm w: %s not cached: %v", d[:12], err)
		}
	}
	if _, err := os.Stat(clitest.CachedFile(cdir, loose)); !os.IsNotExist(err) {
		t.Fatalf("warm w cached a blob w does not link: %v", err)
	}
	c.OK("cache", "warm", loose)
	if n := cacheStat(t, c)["blobs"].(float64); n != 3 {
		t.Fatalf("after warming w and one digest: %v blobs cached; want 3", n)
	}
	c.OK("cache", "drop")
	if n := cacheStat(t, c)["blobs"].(float64); n != 0 {
		t.Fatalf("after drop: %v blobs cached", n)
	}
	for _, d := range append(ds, loose) {
		if _, err := os.Stat(clitest.CachedFile(cdir, d)); !os.IsNotExist(err) {
			t.Fatalf("drop left %s: %v", d[:12], err)
		}
		c.OK("stat", d) // still in the store
	}
}
