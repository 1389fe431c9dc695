package cache

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
)

// startCLI starts `alkblobfs ARGS` in the background with c's flags,
// its stderr kept.
func startCLI(t *testing.T, c *clitest.CLI, args ...string) (*exec.Cmd, *clitest.SyncBuffer, *exited) {
	t.Helper()
	cmd := exec.Command(clitest.Bin, append(append([]string{"--data", c.Data}, c.Flags...), args...)...)
	cmd.Env = c.Environ()
	stderr := new(clitest.SyncBuffer)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := &exited{ch: make(chan struct{})}
	go func() { done.err = cmd.Wait(); close(done.ch) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		<-done.ch
	})
	return cmd, stderr, done
}

// exited is a started process's end: ch closes once it exited with err.
type exited struct {
	ch  chan struct{}
	err error
}

func waitExit(t *testing.T, what string, done *exited, stderr *clitest.SyncBuffer) {
	t.Helper()
	select {
	case <-done.ch:
		if done.err != nil {
			t.Fatalf("%s: %v\n%s", what, done.err, stderr)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("%s still running after 60 s\n%s", what, stderr)
	}
}

// waitLog waits for a line containing want on a process's stderr.
func waitLog(t *testing.T, stderr *clitest.SyncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stderr.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q on the process's stderr after 30 s:\n%s", want, stderr)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stopMidFill starts `cache warm D` and stops it (SIGSTOP) as soon as its
// fill has written to D's stage (it then holds no lock but the stage's);
// ok is false if the fill ended first.
func stopMidFill(t *testing.T, c *clitest.CLI, cdir, d string) (cmd *exec.Cmd, stderr *clitest.SyncBuffer, done *exited, ok bool) {
	t.Helper()
	cmd, stderr, done = startCLI(t, c, "cache", "warm", d)
	deadline := time.Now().Add(30 * time.Second)
	for {
		// Blocks, not the size: a claim sizes its stage to the blob at once.
		if fi, err := os.Stat(filepath.Join(cdir, "stage", "stage-"+d)); err == nil && fi.Sys().(*syscall.Stat_t).Blocks > 0 {
			cmd.Process.Signal(syscall.SIGSTOP)
			if _, err := os.Stat(clitest.CachedFile(cdir, d)); err == nil {
				return cmd, stderr, done, false
			}
			return cmd, stderr, done, true
		}
		if _, err := os.Stat(clitest.CachedFile(cdir, d)); err == nil {
			return cmd, stderr, done, false
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stage for %s after 30 s\n%s", d, stderr)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCacheOneFillPerHost: two processes of a host that miss the same
// blob at once fetch it once: the second (`cache warm`, another process)
// finds the first's fill claimed, waits for it while it is stopped, and
// once it goes on and publishes, takes its copy: one fill on the host,
// the blob's bytes filled once. When the first filler is killed
// instead, the waiting process takes the fill over and caches the blob.
func TestCacheOneFillPerHost(t *testing.T) {
	t.Parallel()
	cdir := filepath.Join(t.TempDir(), "cache")
	c := clitest.NewCLI(t, "--large", s3test.URL(t), "--cache", cdir, "--cache-size", "512MiB")
	const n = 64 << 20
	fa, _, da := clitest.WriteFile(t, t.TempDir(), n, 31)
	fb, _, db := clitest.WriteFile(t, t.TempDir(), n, 32)
	c.OK("put", fa, fb)
	c.OK("cache", "drop")
	const waiting = "another process is filling this blob; waiting for its copy"

	// The first filler stopped, then resumed.
	a, aerr, adone, ok := stopMidFill(t, c, cdir, da)
	if !ok {
		t.Skip("the first fill ended before the test could stop it (a fast machine): nothing to wait for")
	}
	dbg := &clitest.CLI{T: t, Data: c.Data, Home: c.Home, Flags: append([]string{"--log-level", "debug"}, c.Flags...)}
	_, berr, bdone := startCLI(t, dbg, "cache", "warm", da)
	waitLog(t, berr, waiting)
	if _, err := os.Stat(clitest.CachedFile(cdir, da)); err == nil {
		t.Fatal("the blob was published while its filler was stopped: the second process filled it too")
	}
	a.Process.Signal(syscall.SIGCONT)
	waitExit(t, "the first cache warm", adone, aerr)
	waitExit(t, "the second cache warm", bdone, berr)
	h := cacheStat(t, c)["host"].(map[string]any)
	if h["fills"].(float64) != 1 || h["bytes_filled"].(float64) != n {
		t.Fatalf("two processes missing one blob: host counters %v; want 1 fill of %d bytes", h, n)
	}

	// The first filler killed: the waiting process fills.
	a, _, adone, ok = stopMidFill(t, c, cdir, db)
	if !ok {
		t.Skip("the first fill ended before the test could stop it (a fast machine): nothing to wait for")
	}
	_, berr, bdone = startCLI(t, dbg, "cache", "warm", db)
	waitLog(t, berr, waiting)
	a.Process.Kill()
	<-adone.ch
	waitExit(t, "the second cache warm, its filler killed", bdone, berr)
	if _, err := os.Stat(clitest.CachedFile(cdir, db)); err != nil {
		t.Fatalf("the filler killed, the waiting process did not cache the blob: %v\n%s", err, berr)
	}
	if m, _ := filepath.Glob(filepath.Join(cdir, "stage", "*")); len(m) != 0 {
		t.Fatalf("stages left: %v", m)
	}
	c.OK("get", db, "-o", filepath.Join(t.TempDir(), "b")) // whole and right (get verifies it)
}

// TestCacheRoomCountsOtherProcesses: a process's room check before a fill
// counts another process's fill in flight (its stage, sized to its blob
// at the claim): with one blob cached and another being filled by a
// stopped process, a third blob's fill in a second process evicts the
// cached one, and once both fills publish the cache is within its limit.
func TestCacheRoomCountsOtherProcesses(t *testing.T) {
	t.Parallel()
	const n = 32 << 20
	cdir := filepath.Join(t.TempDir(), "cache")
	c := clitest.NewCLI(t, "--large", s3test.URL(t), "--cache", cdir, "--cache-size", "80MiB") // two blobs fit, not three
	fz, _, dz := clitest.WriteFile(t, t.TempDir(), n, 33)
	fx, _, dx := clitest.WriteFile(t, t.TempDir(), n, 34)
	fy, _, dy := clitest.WriteFile(t, t.TempDir(), n, 35)
	c.OK("put", fz, fx, fy)
	c.OK("cache", "drop")
	c.OK("cache", "warm", dz)
	a, aerr, adone, ok := stopMidFill(t, c, cdir, dx)
	if !ok {
		t.Skip("the fill of x ended before the test could stop it (a fast machine)")
	}
	c.OK("cache", "warm", dy) // another process, while x's fill is in flight
	if _, err := os.Stat(clitest.CachedFile(cdir, dz)); err == nil {
		t.Fatal("z was not evicted for y while another process filled x: that fill was not counted (z, x and y are over the limit)")
	}
	a.Process.Signal(syscall.SIGCONT)
	waitExit(t, "the stopped cache warm", adone, aerr)
	if _, err := os.Stat(clitest.CachedFile(cdir, dx)); err != nil {
		t.Fatalf("x not cached after its fill went on: %v", err)
	}
	if b := cacheStat(t, c)["bytes"].(float64); b > 80<<20 {
		t.Fatalf("%v bytes cached, over the 80 MiB limit", b)
	}
}
