package namespaces_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces/nstest"
)

// TestSQLiteMillion measures linking 1 000 000 references into one
// namespace on SQLite (LinkMany, 10 000 or 100 000 per transaction, digests
// in hash order as real content produces them) and listing them all with
// Entries.
// It takes tens of seconds, so it runs only with ALKBLOBFS_NS_1M=1:
//
//	ALKBLOBFS_NS_1M=1 go test -run Million -v ./namespaces/
func TestSQLiteMillion(t *testing.T) {
	if os.Getenv("ALKBLOBFS_NS_1M") == "" {
		t.Skip("set ALKBLOBFS_NS_1M=1 to link and list 1 000 000 references on SQLite")
	}
	for _, batch := range []int{10_000, 100_000} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) { million(t, batch) })
	}
}

func million(t *testing.T, batch int) {
	const total = 1_000_000
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "kv.db")
	r, _ := openSQLiteEngine(t, path, nil)
	mustDo(t, r.Create(ctx, "big"))

	start := time.Now()
	in := make([]blob.Digest, batch)
	for i := 0; i < total; i += batch {
		for j := range in {
			in[j] = nstest.D(i + j)
		}
		if n, err := r.LinkMany(ctx, "big", in); err != nil || n != batch {
			t.Fatalf("LinkMany = %d, %v", n, err)
		}
	}
	link := time.Since(start)

	start = time.Now()
	n, err := r.Count(ctx, "big")
	if err != nil || n != total {
		t.Fatalf("Count = %d, %v", n, err)
	}
	count := time.Since(start)

	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapAlloc, uint64(0)
	start = time.Now()
	listed := 0
	var prev blob.Digest
	for ref, err := range r.Entries(ctx, "big", blob.Digest{}) {
		if err != nil {
			t.Fatal(err)
		}
		if listed > 0 && ref.Digest.Compare(prev) <= 0 {
			t.Fatal("not ascending")
		}
		prev = ref.Digest
		if listed++; listed%100_000 == 0 {
			runtime.ReadMemStats(&ms) // no forced GC: the timing is the point here
			peak = max(peak, ms.HeapAlloc)
		}
	}
	list := time.Since(start)
	if listed != total {
		t.Fatalf("listed %d, want %d", listed, total)
	}

	start = time.Now()
	live := 0
	for _, err := range r.Live(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		live++
	}
	liveT := time.Since(start)

	start = time.Now()
	for i := range 10_000 {
		if ok, err := r.IsLive(ctx, nstest.D(i*97)); err != nil || !ok {
			t.Fatalf("IsLive = %v, %v", ok, err)
		}
	}
	probe := time.Since(start) / 10_000

	fi, _ := os.Stat(path)
	var wal int64
	if w, err := os.Stat(path + "-wal"); err == nil {
		wal = w.Size()
	}
	t.Logf("link %d refs (LinkMany, %d per tx): %v (%.0f refs/s)", total, batch, link.Round(time.Millisecond), float64(total)/link.Seconds())
	t.Logf("Entries, all %d: %v (%.0f refs/s); heap %d KiB before, ≤ %d KiB during (unforced GC)", total, list.Round(time.Millisecond), float64(total)/list.Seconds(), base>>10, peak>>10)
	t.Logf("Count: %v; Live (%d distinct): %v; IsLive probe: %v", count.Round(time.Millisecond), live, liveT.Round(time.Millisecond), probe.Round(time.Microsecond))
	t.Logf("database %d MiB + WAL %d MiB", fi.Size()>>20, wal>>20)
}
