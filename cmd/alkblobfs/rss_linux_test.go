//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// rssLimit bounds the binary's peak RSS for a 100 MiB blob. A streaming
// put or get needs a few MiB of buffers on top of the Go runtime and the
// SQLite engine; buffering the blob would take 100 MiB.
const rssLimit = 64 << 20

func peakRSS(t *testing.T, r result) int64 {
	t.Helper()
	ru, ok := r.state.SysUsage().(*syscall.Rusage)
	if !ok {
		t.Fatalf("no rusage: %T", r.state.SysUsage())
	}
	return ru.Maxrss << 10 // KiB on Linux
}

func TestPeakRSSBounded(t *testing.T) {
	const size = 100 << 20
	c := newCLI(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "big")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	chunk := randomBytes(1<<20, 11)
	for i := range size >> 20 {
		chunk[0] = byte(i) // no two MiB alike
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	put := c.run(nil, "put", p)
	if put.code != 0 {
		t.Fatalf("put: exit %d, stderr %q", put.code, put.stderr)
	}
	d := strings.TrimSpace(put.stdout)
	rss := peakRSS(t, put)
	t.Logf("put of 100 MiB: peak RSS %.1f MiB", float64(rss)/(1<<20))
	if rss > rssLimit {
		t.Errorf("put of 100 MiB: peak RSS %d MiB, want under %d MiB", rss>>20, rssLimit>>20)
	}

	get := c.run(nil, "get", d, "-o", filepath.Join(dir, "out"))
	if get.code != 0 {
		t.Fatalf("get: exit %d, stderr %q", get.code, get.stderr)
	}
	rss = peakRSS(t, get)
	t.Logf("get -o of 100 MiB: peak RSS %.1f MiB", float64(rss)/(1<<20))
	if rss > rssLimit {
		t.Errorf("get -o of 100 MiB: peak RSS %d MiB, want under %d MiB", rss>>20, rssLimit>>20)
	}
	if fi, err := os.Stat(filepath.Join(dir, "out")); err != nil || fi.Size() != size {
		t.Errorf("get -o: %v, %v", fi, err)
	}
}
