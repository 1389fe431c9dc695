package store_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/mem"
	"github.com/alkblobfs/alkblobfs/store"
)

// seedFrom starts an upload seeded with d, as the mount does on an open
// for writing without O_TRUNC.
func seedFrom(t *testing.T, s *store.Store, d store.Digest, trust bool) *store.Upload {
	t.Helper()
	pin, err := s.Pin(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	r, ok, err := s.Get(t.Context(), d)
	if err != nil || !ok {
		t.Fatalf("get %s: %v %v", d.Short(), ok, err)
	}
	if trust {
		r.Trust()
	}
	u, err := s.NewUpload(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Seed(t.Context(), r, pin); err != nil {
		t.Fatal(err)
	}
	return u
}

func putBlob(t *testing.T, s *store.Store, b []byte) store.Digest {
	t.Helper()
	d, pin, err := s.Put(t.Context(), bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	return d
}

// TestUploadSeed: an upload seeded with a blob reads as the blob plus
// what was written since, whatever the writes and truncations, and
// publishes exactly that; small and large bases, on every layout with a
// large tier (the local stage, and a scratch file).
func TestUploadSeed(t *testing.T) {
	scratch := layout{"mem+seqlarge", func(t testing.TB, dir string) store.Config {
		return store.Config{KV: mem.New(), Large: seqLarge{mem.New()}}
	}, true, true}
	for _, l := range append(layouts[2:4], scratch) {
		t.Run(l.name, func(t *testing.T) {
			s := openStore(t, l, t.TempDir())
			for _, n := range []int{100, threshold * 3, 1<<20 + 4321} {
				for seed := range uint64(8) {
					testSeedOps(t, s, n, seed)
				}
			}
			assertClean(t, s)
		})
	}
}

func testSeedOps(t *testing.T, s *store.Store, n int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	model := randBytes(n)
	d := putBlob(t, s, model)
	u := seedFrom(t, s, d, seed%2 == 0)
	check := func(what string) {
		t.Helper()
		if u.Size() != int64(len(model)) {
			t.Fatalf("n=%d seed=%d after %s: size %d, want %d", n, seed, what, u.Size(), len(model))
		}
		for range 4 {
			off := rng.IntN(len(model) + 1)
			p := make([]byte, rng.IntN(200<<10)+1)
			k, err := u.ReadAt(p, int64(off))
			want := model[off:min(len(model), off+len(p))]
			if k != len(want) || !bytes.Equal(p[:k], want) || (err != nil && !errors.Is(err, io.EOF)) || (k < len(p) && err == nil) {
				t.Fatalf("n=%d seed=%d after %s: ReadAt(%d, %d) = %d, %v; content differs: %v", n, seed, what, len(p), off, k, err, !bytes.Equal(p[:k], want))
			}
		}
	}
	check("seed")
	for range 1 + rng.IntN(6) {
		switch op := rng.IntN(10); {
		case op < 3: // append (>>)
			tail := randBytes(rng.IntN(100 << 10))
			if _, err := u.WriteAt(tail, int64(len(model))); err != nil {
				t.Fatal(err)
			}
			model = append(model, tail...)
		case op < 7: // overwrite in place (dd conv=notrunc, rsync --inplace)
			off := rng.IntN(len(model) + 1)
			p := randBytes(rng.IntN(150<<10) + 1)
			if _, err := u.WriteAt(p, int64(off)); err != nil {
				t.Fatal(err)
			}
			if end := off + len(p); end > len(model) {
				model = append(model, make([]byte, end-len(model))...)
			}
			copy(model[off:], p)
		case op < 9: // shrink, maybe grow back with zeros
			size := rng.IntN(len(model) + 1)
			u.Truncate(int64(size))
			model = model[:size:size]
			if rng.IntN(2) == 0 {
				grow := rng.IntN(70 << 10)
				u.Truncate(int64(size + grow))
				model = append(model, make([]byte, grow)...)
			}
		default: // a write past the end, leaving a hole
			off := len(model) + rng.IntN(200<<10)
			p := randBytes(100)
			u.WriteAt(p, int64(off))
			model = append(model, make([]byte, off-len(model))...)
			model = append(model, p...)
		}
		check("a change")
	}
	got, pin, err := u.Commit(t.Context(), nil)
	if err != nil {
		t.Fatalf("n=%d seed=%d: commit: %v", n, seed, err)
	}
	pin.Release()
	if got != sha256.Sum256(model) || !bytes.Equal(readAll(t, s, got), model) {
		t.Fatalf("n=%d seed=%d: published content differs from what was written", n, seed)
	}
}

// TestUploadSeedEnds: a seeded upload holds its base pinned, so that
// sweeps keep it, until it ends by any path: commit, discard, a failed
// verified commit, a truncate to nothing; and it leaves no stage file.
func TestUploadSeedEnds(t *testing.T) {
	s := openStore(t, layouts[2], t.TempDir())
	s.GC().Register(&refs{m: map[blob.Digest]bool{}})
	base := randBytes(1 << 20)
	for _, end := range []string{"commit", "discard", "verify", "truncate", "sweep"} {
		d := putBlob(t, s, base)
		u := seedFrom(t, s, d, false)
		if _, p := s.GC().PinCount(); p != 1 {
			t.Fatalf("%s: %d pins while seeded; want 1", end, p)
		}
		switch end {
		case "commit":
			u.WriteAt([]byte("x"), 1<<20)
			_, pin, err := u.Commit(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			pin.Release()
		case "discard":
			u.Discard()
		case "verify":
			wrong := blob.Sum(nil)
			if _, _, err := u.Commit(t.Context(), &wrong); !errors.Is(err, store.ErrVerification) {
				t.Fatalf("verified commit of the wrong digest: %v", err)
			}
		case "truncate":
			u.Truncate(0)
			if _, p := s.GC().PinCount(); p != 0 {
				t.Fatalf("truncated to nothing, the base is still pinned")
			}
			u.WriteAt([]byte("new"), 0)
			got, pin, err := u.Commit(t.Context(), nil)
			if err != nil || got != blob.Sum([]byte("new")) {
				t.Fatalf("commit after truncate: %v", err)
			}
			pin.Release()
		case "sweep":
			// Two sweeps (stage, then delete) while the upload reads the
			// base: it stays.
			sweep(t, s)
			sweep(t, s)
			if ok, _ := s.Has(t.Context(), d); !ok {
				t.Fatal("a sweep removed the base of a seeded upload")
			}
			u.WriteAt([]byte("y"), 12345)
			want := bytes.Clone(base)
			want[12345] = 'y'
			got, pin, err := u.Commit(t.Context(), nil)
			if err != nil || got != blob.Sum(want) {
				t.Fatalf("commit after sweeps: %v", err)
			}
			pin.Release()
		}
		assertClean(t, s)
	}
	// Nothing holds the bases now: sweeps take them all.
	sweep(t, s)
	sweep(t, s)
	if c := count(t, s); c != 0 {
		t.Fatalf("%d blobs after the uploads ended and two sweeps; want 0", c)
	}
}

// blocks is the disk a file takes, in bytes.
func blocks(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestUploadSparse: on the local engine, holes of an upload stay holes in
// the blob (written past the end, extended by truncate, or inherited from
// a sparse base), and the digest is that of the full content.
func TestUploadSparse(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, layouts[2], dir)
	const size = 16 << 20
	data := randBytes(4 << 10)
	u, _ := s.NewUpload(t.Context())
	u.Truncate(size)
	u.WriteAt(data, 4<<20)
	d, pin, err := u.Commit(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	want := make([]byte, size)
	copy(want[4<<20:], data)
	if d != sha256.Sum256(want) {
		t.Fatal("sparse upload: wrong digest")
	}
	if b := blocks(t, blobPath(dir, d)); b > 64<<10 {
		t.Fatalf("a %d-byte blob holding 4 KiB takes %d bytes on disk", size, b)
	}
	// Seeded with it (verified against its chunk checksums), a byte
	// appended: the new blob is sparse too.
	u = seedFrom(t, s, d, false)
	u.WriteAt([]byte("z"), size)
	d2, pin, err := u.Commit(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	if d2 != sha256.Sum256(append(want, 'z')) || !bytes.Equal(readAll(t, s, d2), append(want, 'z')) {
		t.Fatal("sparse base + append: wrong content")
	}
	if b := blocks(t, blobPath(dir, d2)); b > 64<<10 {
		t.Fatalf("seeded from a sparse blob, the new one takes %d bytes on disk", b)
	}
	assertClean(t, s)
}

// TestUploadSeedHoleChecked: a hole in a base blob where its chunk
// checksum says there was data (the file lost it) is read and fails its
// check: the upload does not publish zeros in its place. A trusted base
// is taken as it is.
func TestUploadSeedHoleChecked(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, layouts[2], dir)
	base := randBytes(1 << 20)
	d := putBlob(t, s, base)
	f, err := os.OpenFile(blobPath(dir, d), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	const mode = 0x02 | 0x01 // FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
	if err := syscall.Fallocate(int(f.Fd()), mode, 256<<10, 64<<10); err != nil {
		f.Close()
		t.Skipf("cannot punch a hole here: %v", err)
	}
	f.Close()
	// The trusted seed first: the checked one finds the base corrupt and
	// records it, and Get refuses it from then on, trusted or not.
	u := seedFrom(t, s, d, true)
	u.WriteAt([]byte("x"), 1<<20)
	got, pin, err := u.Commit(t.Context(), nil)
	if err != nil {
		t.Fatalf("trusted base: %v", err)
	}
	pin.Release()
	want := append(bytes.Clone(base), 'x')
	clear(want[256<<10 : 320<<10])
	if got != sha256.Sum256(want) {
		t.Fatal("trusted base: wrong digest")
	}
	u = seedFrom(t, s, d, false)
	u.WriteAt([]byte("x"), 1<<20)
	if _, _, err := u.Commit(t.Context(), nil); !errors.Is(err, store.ErrVerification) {
		t.Fatalf("commit over a base that lost a chunk: %v; want a verification error", err)
	}
	assertClean(t, s)
}

// TestSeedOpenCost: seeding with a large blob reads none of it.
func TestSeedOpenCost(t *testing.T) {
	s := openStore(t, layouts[2], t.TempDir())
	d := putBlob(t, s, randBytes(8<<20))
	before := s.Stats()
	u := seedFrom(t, s, d, false)
	defer u.Discard()
	if got := s.Stats().BytesOut - before.BytesOut; got != 0 {
		t.Fatalf("seeding read %d bytes of the base; want none", got)
	}
}
