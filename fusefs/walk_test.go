package fusefs

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestIncomingWalk is a model-based test of the write path: a seeded
// random walk of file operations (writes at random offsets, appends,
// truncates, reopens with O_TRUNC or O_APPEND, sizes on both sides of the
// kv threshold) runs on a file in incoming/ and on a plain file side by
// side. After each close the receipt must read back as the plain file, its
// digest xattr must be the plain file's sha256, and the namespace must list
// that digest.
func TestIncomingWalk(t *testing.T) {
	steps := 60
	if os.Getenv("ALKBLOBFS_LONG") != "" {
		steps = 600
	}
	for _, spec := range []storeSpec{defaultSpec, memSpec} {
		t.Run(spec.name, func(t *testing.T) {
			e := mountStore(t, spec)
			e.mkns("w")
			native := t.TempDir()
			rng := rand.New(rand.NewPCG(42, uint64(len(spec.name))))
			var published []string
			for step := range steps {
				name := fmt.Sprintf("f%d", rng.IntN(4))
				mine := filepath.Join(e.path("w", "incoming"), name)
				model := filepath.Join(native, name)
				flags := os.O_WRONLY | os.O_CREATE
				switch rng.IntN(4) {
				case 0:
					flags |= os.O_TRUNC
				case 1:
					flags |= os.O_APPEND
				}
				if _, err := os.Stat(model); err != nil {
					flags |= os.O_TRUNC // a new file: both start empty
				}
				fm, err := os.OpenFile(model, flags, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				fx, err := os.OpenFile(mine, flags, 0o644)
				if err != nil {
					t.Fatalf("step %d: open %s flags %#x: %v", step, name, flags, err)
				}
				for range 1 + rng.IntN(4) {
					walkOp(t, rng, step, fm, fx, flags&os.O_APPEND != 0)
				}
				if err := fm.Close(); err != nil {
					t.Fatal(err)
				}
				if err := fx.Close(); err != nil {
					t.Fatalf("step %d: close %s: %v", step, name, err)
				}
				want, got := mustRead(t, model), mustRead(t, mine)
				if !bytes.Equal(want, got) {
					t.Fatalf("step %d: receipt %s holds %d bytes, the model %d", step, name, len(got), len(want))
				}
				x := make([]byte, 64)
				n, err := unix.Getxattr(mine, xattrDigest, x)
				if err != nil || string(x[:n]) != sum(want) {
					t.Fatalf("step %d: digest xattr %q, %v; want %s", step, x[:n], err, sum(want))
				}
				published = append(published, sum(want))
			}
			// Every final version is listed (each step's close ended a
			// separate open, so earlier versions stay listed too).
			listed := e.listNS(t, "w")
			for i := range 4 {
				model := filepath.Join(native, fmt.Sprintf("f%d", i))
				if b, err := os.ReadFile(model); err == nil && !slices.Contains(listed, sum(b)) {
					t.Fatalf("final version of f%d (%s) not listed", i, sum(b)[:12])
				}
			}
			for _, d := range listed {
				if got := fileSum(t, e.path("w", d)); got != d {
					t.Fatalf("published %s reads back as %s", d[:12], got[:12])
				}
			}
		})
	}
}

// walkOp applies one random operation to both files.
func walkOp(t *testing.T, rng *rand.Rand, step int, model, mine *os.File, appending bool) {
	t.Helper()
	size := func() int64 {
		fi, err := model.Stat()
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	// Sizes straddle the 128 KiB kv threshold and the 64 KiB chunk.
	n := []int{1, 100, 4096, 64 << 10, 130 << 10, 300 << 10}[rng.IntN(6)]
	buf := make([]byte, n)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	switch op := rng.IntN(4); {
	case op <= 1 || appending: // sequential: append at the end
		if _, err := model.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := mine.Write(buf); err != nil {
			t.Fatalf("step %d: write: %v", step, err)
		}
		if !appending {
			// keep both offsets at the end for the next sequential write
			model.Seek(0, 2)
			mine.Seek(0, 2)
		}
	case op == 2: // random offset, possibly past the end (a hole)
		off := rng.Int64N(size() + 200<<10)
		if _, err := model.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
		if _, err := mine.WriteAt(buf, off); err != nil {
			t.Fatalf("step %d: pwrite at %d: %v", step, off, err)
		}
	default: // truncate, shrinking or extending
		to := rng.Int64N(size() + 200<<10)
		if err := model.Truncate(to); err != nil {
			t.Fatal(err)
		}
		if err := mine.Truncate(to); err != nil {
			t.Fatalf("step %d: ftruncate %d: %v", step, to, err)
		}
	}
}
