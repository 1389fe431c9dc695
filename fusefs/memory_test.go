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
//
// The kernel forgets entries under memory pressure, or when anyone on the
// machine drops the caches. The mount then frees their nodes but not the
// room its tables grew for them (Go maps do not shrink), and dividing the
// heap by the entries kept charges that room to them: with a quarter of
// the entries kept, 911 bytes each instead of 497. So the test lists
// again until the kernel holds nearly every entry, and only then is the
// heap per kept entry the cost of an entry.
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
	d, _ := e.srv.fs.nsDirFor("big")
	before := liveHeap()
	// A child process lists: this one serves the mount.
	list := func() {
		out := run(t, "", "bash", "-ec", `ls -l "$0" | wc -l`, e.path("big"))
		if got := strings.TrimSpace(out); got != strconv.Itoa(n+2) { // "total" and incoming/
			t.Fatalf("ls -l printed %s lines, want %d", got, n+2)
		}
	}
	list() // cold
	const listings, nearlyAll = 5, n * 99 / 100
	var growth int64
	kept := 0
	for i := 2; i <= listings; i++ {
		list() // warm; then again for what the kernel forgot
		growth = int64(liveHeap()) - int64(before)
		kept = len(d.Children()) - 1 // incoming/
		t.Logf("after %d listings: live heap %.1f MiB before, %.1f MiB more, with %d entries kept: %d bytes per entry",
			i, float64(before)/(1<<20), float64(growth)/(1<<20), kept, growth/int64(max(kept, 1)))
		if kept >= nearlyAll {
			break
		}
	}
	per := growth / int64(max(kept, 1))
	switch {
	case per <= heapPerEntryMax:
		// Within the bound even if the kernel forgot some: the room
		// for those only adds to per.
	case kept >= nearlyAll:
		t.Errorf("%d bytes of live heap per listed entry, want at most %d", per, heapPerEntryMax)
	case growth/n > heapPerEntryMax:
		t.Errorf("%d bytes of live heap per listed entry even counting the %d the kernel forgot, want at most %d", growth/n, n-kept, heapPerEntryMax)
	default:
		t.Skipf("the kernel kept only %d of %d listed entries after %d listings (memory pressure, or caches dropped): "+
			"between %d and %d bytes per entry, and the bound %d in between; nothing to conclude",
			kept, n, listings, growth/n, per, heapPerEntryMax)
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
