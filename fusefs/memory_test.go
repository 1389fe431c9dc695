//go:build linux

package fusefs

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/alkblobfs/alkblobfs/blob"
)

// TestBlobFileSize keeps the node of a blob file, which the mount holds for
// every entry the kernel has looked up, at 192 bytes (a Go size class)
// with go-fuse's Inode: the state of open blobs lives in a blobOpen, the
// digest in the name.
func TestBlobFileSize(t *testing.T) {
	if n := unsafe.Sizeof(blobFile{}); n > 192 {
		t.Errorf("blobFile is %d bytes, want at most 192", n)
	}
}

// heapPerEntryMax bounds the daemon's live heap per entry of a namespace
// that ls -l listed, while the kernel keeps the entries: our blobFile (192
// bytes), go-fuse's identity tables (about 140), its entry in the
// directory's children (about 65) and the link to its parent (24), and
// the name (64). It was about 680 bytes with 320-byte blob files and, once
// listed twice, two copies of each name.
const heapPerEntryMax = 520

// TestListingHeapPerEntry lists a namespace of 100 000 blobs with ls -l
// twice (a READDIRPLUS and a lookup for each entry) and checks the live
// heap the listings left: the nodes the mount keeps for as long as the
// kernel keeps the entries.
func TestListingHeapPerEntry(t *testing.T) {
	const n = 100_000
	e := mountStore(t, memSpec)
	e.mkns("big")
	ctx := context.Background()
	ds := make([]blob.Digest, 0, 1000)
	for i := range n {
		d, pin, err := e.st.PutBytes(ctx, fmt.Appendf(nil, "entry %d", i))
		if err != nil {
			t.Fatal(err)
		}
		pin.Release()
		ds = append(ds, d)
		if len(ds) == cap(ds) || i == n-1 {
			if _, err := e.reg.LinkMany(ctx, "big", ds); err != nil {
				t.Fatal(err)
			}
			ds = ds[:0]
		}
	}
	before := liveHeap()
	// A child process lists, twice (as cold and warm): this one serves
	// the mount.
	for range 2 {
		out := run(t, "", "bash", "-ec", `ls -l "$0" | wc -l`, e.path("big"))
		if got := strings.TrimSpace(out); got != strconv.Itoa(n+2) { // "total" and incoming/
			t.Fatalf("ls -l printed %s lines, want %d", got, n+2)
		}
	}
	after := liveHeap()
	// What the listing left is the nodes of the entries the kernel still
	// holds (it forgets entries under memory pressure, or when someone
	// drops the caches): count those.
	d, _ := e.srv.fs.nsDirFor("big")
	kept := len(d.Children()) - 1 // incoming/
	if kept < n/2 {
		t.Fatalf("the mount keeps %d of %d listed entries: the kernel forgot most, nothing to measure", kept, n)
	}
	per := (int64(after) - int64(before)) / int64(kept)
	t.Logf("live heap %.1f MiB before the listing, %.1f MiB after, with %d entries kept: %d bytes per entry",
		float64(before)/(1<<20), float64(after)/(1<<20), kept, per)
	if per > heapPerEntryMax {
		t.Errorf("%d bytes of live heap per listed entry, want at most %d", per, heapPerEntryMax)
	}
}

// liveHeap is the heap in use after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
