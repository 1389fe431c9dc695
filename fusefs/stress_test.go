//go:build linux

package fusefs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestStressMount runs 16 writers, 16 readers and a sweep every 100 ms
// against one mount: writers publish files of mixed sizes (both tiers)
// through incoming/ and remove some of them again (garbage for the
// sweeps); readers read published blobs and check their sha256. Every
// referenced digest verifies at the end. 5 s here, 60 s under
// ALKBLOBFS_LONG=1; run under -race by make test.
func TestStressMount(t *testing.T) {
	dur := 5 * time.Second
	if os.Getenv("ALKBLOBFS_LONG") == "1" {
		dur = 60 * time.Second
	}
	e := mountStore(t, defaultSpec)
	e.mkns("s")

	var (
		mu      sync.Mutex
		kept    []string // published and never removed
		writes  atomic.Int64
		removed atomic.Int64
		reads   atomic.Int64
		bytesW  atomic.Int64
		bytesR  atomic.Int64
		sweeps  atomic.Int64
		failed  atomic.Bool
	)
	fail := func(format string, args ...any) {
		failed.Store(true)
		t.Errorf(format, args...)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 77))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				n := r.IntN(8 << 10)
				if r.IntN(8) == 0 {
					n = 300<<10 + r.IntN(1<<20) // the large tier
				}
				// Unique content: no digest is both removed and kept.
				b := fmt.Appendf(make([]byte, 0, n+16), "w%d-%d:", w, i)
				for range n {
					b = append(b, byte(r.Uint32()))
				}
				name := e.path("s", incomingName, fmt.Sprintf("w%d-%d", w, i))
				if err := os.WriteFile(name, b, 0o644); err != nil {
					fail("writer %d: %v", w, err)
					return
				}
				writes.Add(1)
				bytesW.Add(int64(len(b)))
				d := sum(b)
				if r.IntN(3) == 0 {
					if err := os.Remove(e.path("s", d)); err != nil && !os.IsNotExist(err) {
						fail("writer %d: rm: %v", w, err)
						return
					}
					removed.Add(1)
					continue
				}
				mu.Lock()
				kept = append(kept, d)
				mu.Unlock()
			}
		})
	}
	for rd := range 16 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(rd), 78))
			for {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				if len(kept) == 0 {
					mu.Unlock()
					time.Sleep(time.Millisecond)
					continue
				}
				d := kept[r.IntN(len(kept))]
				mu.Unlock()
				got, n, err := hashFile(e.path("s", d))
				if err != nil || got != d {
					fail("reader %d: %s: got %s, %v", rd, d, got, err)
					return
				}
				reads.Add(1)
				bytesR.Add(n)
			}
		})
	}
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if err := os.WriteFile(e.path(".alkblobfs", "sweep"), []byte("run"), 0); err != nil {
				fail("sweep: %v", err)
				return
			}
			sweeps.Add(1)
		}
	})
	deadline := time.After(dur)
	for !failed.Load() {
		select {
		case <-deadline:
			failed.Store(true) // stop
		case <-time.After(100 * time.Millisecond):
			continue
		}
	}
	close(stop)
	wg.Wait()
	if t.Failed() {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	for _, d := range kept {
		if got, _, err := hashFile(e.path("s", d)); err != nil || got != d {
			t.Errorf("at the end: %s: got %s, %v", d, got, err)
		}
	}
	if writes.Load() == 0 || reads.Load() == 0 || sweeps.Load() == 0 {
		t.Fatalf("nothing happened: %d writes, %d reads, %d sweeps", writes.Load(), reads.Load(), sweeps.Load())
	}
	t.Logf("%s: %d files written (%d MiB), %d removed, %d reads (%d MiB), %d sweeps; %d blobs referenced at the end, all verified",
		dur, writes.Load(), bytesW.Load()>>20, removed.Load(), reads.Load(), bytesR.Load()>>20, sweeps.Load(), len(kept))
}

// hashFile returns the sha256 of a file's content and its size.
func hashFile(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil)), n, err
}
