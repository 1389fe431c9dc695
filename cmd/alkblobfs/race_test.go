//go:build linux

package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// TestCrossProcessRace races, as separate OS processes on the embedded
// default store, a mount that sweeps through its control file every 50 ms
// against loops of CLI put --ns, link, unlink, rm and sweep over a few
// contents, so that blobs die, get staged, and are put, linked and deleted
// again while sweeps arbitrate them. At the end every digest that any
// namespace lists must read back verified: a namespace never links a blob
// the store lost. 10 s here (on a loaded machine, until it has done
// enough); 120 s under ALKBLOBFS_LONG=1 (make test-long).
func TestCrossProcessRace(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	dur := 10 * time.Second
	if os.Getenv("ALKBLOBFS_LONG") == "1" {
		dur = 120 * time.Second
	}
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "a", "b")
	dir := t.TempDir()
	var files, digests []string
	for i := range 8 {
		n := clitest.SmallSize + i
		if i >= 6 {
			n = clitest.LargeSize + i // two in the large tier
		}
		p, _, d := clitest.WriteFile(t, dir, n, uint64(100+i))
		files, digests = append(files, p), append(digests, d)
	}
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt, "--pin-ttl", "3s")

	run := func(args ...string) (int, string) {
		r, err := c.Exec(nil, args...)
		if err != nil {
			return -1, err.Error()
		}
		return r.Code, r.Stderr
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sweeps, failures atomic.Int64
	errs := make(chan error, 100)
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctl := filepath.Join(mnt, ".alkblobfs", "sweep")
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if err := os.WriteFile(ctl, []byte("run\n"), 0o644); err != nil {
				errs <- fmt.Errorf("sweep through the mount: %w", err)
				return
			}
			sweeps.Add(1)
		}
	}()
	var ops [5]atomic.Int64 // put, link, unlink, rm, sweep: exit 0
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := r.IntN(len(files))
				ns := []string{"a", "b"}[r.IntN(2)]
				var op int
				var code int
				var stderr string
				switch k := r.IntN(10); {
				case k < 3:
					op = 0
					code, stderr = run("put", "--ns", ns, files[i])
				case k < 5:
					op = 1
					code, stderr = run("link", ns, digests[i])
				case k < 8:
					op = 2
					code, stderr = run("unlink", ns, digests[i])
				case k < 9:
					op = 3
					code, stderr = run("rm", digests[i])
				default:
					op = 4
					code, stderr = run("sweep")
				}
				switch {
				case code == 0:
					ops[op].Add(1)
				case code == 1:
					failures.Add(1) // refused or absent: expected outcomes
				default:
					errs <- fmt.Errorf("op %d exit %d: %s", op, code, stderr)
					return
				}
			}
		}()
	}
	// The race runs for dur, and on a loaded machine, where a command
	// takes seconds, on until it has done enough to be a race: puts,
	// unlinks and sweeps through the mount, at most raceBound in all.
	start := time.Now()
	enough := func() bool {
		return ops[0].Load() >= 3 && ops[2].Load() >= 3 && sweeps.Load() >= 10
	}
	const raceBound = 3 * time.Minute
	tick := time.NewTicker(100 * time.Millisecond)
	for time.Since(start) < dur || !enough() && time.Since(start) < raceBound {
		<-tick.C
	}
	tick.Stop()
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	took := time.Since(start).Round(time.Second)
	t.Logf("%s: %d sweeps through the mount; exit 0: %d put, %d link, %d unlink, %d rm, %d sweep; %d refused",
		took, sweeps.Load(), ops[0].Load(), ops[1].Load(), ops[2].Load(), ops[3].Load(), ops[4].Load(), failures.Load())
	if !enough() {
		t.Fatalf("the race did not run: in %s, fewer than 3 puts, 3 unlinks or 10 sweeps through the mount succeeded", took)
	}

	lost := 0
	for _, ns := range []string{"a", "b"} {
		for _, d := range clitest.Lines(c.OK("ls", ns)) {
			code, stderr := run("get", d, "-o", filepath.Join(t.TempDir(), "out"))
			if code != 0 {
				lost++
				t.Errorf("namespace %s links %s, which does not read back: %s", ns, d, strings.TrimSpace(stderr))
				continue
			}
			if got := clitest.FileSHA(t, filepath.Join(mnt, ns, d)); got != d {
				t.Errorf("%s/%s through the mount hashes to %s", ns, d, got)
			}
		}
	}
	if lost > 0 {
		t.Fatalf("%d linked blobs lost", lost)
	}
	clitest.StopDaemon(t, dm)
}
