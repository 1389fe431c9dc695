//go:build linux

package fusefs

import (
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestListingTakesFewRoundTrips: a namespace directory's st_blksize is
// 1 MiB, so that ls reads it with 1 MiB getdents64 and the kernel asks
// for ~4 800 entries with 64-hex names per READDIRPLUS, not ~150: a cold
// ls -l of 6 000 entries takes a handful of round trips (40 with the
// default block size), and lists every entry.
func TestListingTakesFewRoundTrips(t *testing.T) {
	const n = 6000
	var mu sync.Mutex
	ops := map[string]int{}
	count := func(c *Config) {
		c.Observe = func(op string, _ time.Duration) {
			mu.Lock()
			ops[op]++
			mu.Unlock()
		}
	}
	e := mountStore(t, memSpec, count)
	e.mkns("w")
	e.fill("w", n)
	fi, err := os.Stat(e.path("w"))
	if err != nil {
		t.Fatal(err)
	}
	if bs := fi.Sys().(*syscall.Stat_t).Blksize; bs != listBlockSize {
		t.Errorf("the namespace directory's st_blksize is %d, want %d", bs, listBlockSize)
	}
	mu.Lock()
	clear(ops)
	mu.Unlock()
	// ls -l in a child process (this one serves the mount).
	out := run(t, "", "ls", "-l", e.path("w"))
	if got := strings.Count(out, "\n-r"); got != n {
		t.Fatalf("ls -l listed %d blobs, want %d", got, n)
	}
	mu.Lock()
	rt := ops["readdirplus"] + ops["readdir"]
	mu.Unlock()
	// 6 000 entries of ~216 bytes fill two 1 MiB pages, and an empty one
	// ends the listing.
	if rt > 4 {
		t.Errorf("ls -l of %d entries took %d READDIR(PLUS) round trips, want at most 4", n, rt)
	}
}
