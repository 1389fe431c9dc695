package store_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/local"
	"github.com/alkblobfs/alkblobfs/engines/mem"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/store"
)

const threshold = 4 << 10 // small, so tests exercise both tiers cheaply

type layout struct {
	name  string
	open  func(t testing.TB, dir string) store.Config
	large bool // has a large tier
	kv    bool
}

func sqliteKV(t testing.TB, dir string) *sqlite.Engine {
	t.Helper()
	e, err := sqlite.Open(t.Context(), filepath.Join(dir, "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func localLarge(t testing.TB, dir string) engines.Large {
	t.Helper()
	e, err := local.Open(t.Context(), filepath.Join(dir, "large"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

var layouts = []layout{
	{"mem-only", func(t testing.TB, dir string) store.Config {
		return store.Config{KV: mem.New(), Mode: store.ModeMemOnly}
	}, false, true},
	{"kv-only-sqlite", func(t testing.TB, dir string) store.Config {
		return store.Config{KV: sqliteKV(t, dir)}
	}, false, true},
	{"sqlite+local", func(t testing.TB, dir string) store.Config {
		return store.Config{KV: sqliteKV(t, dir), Large: localLarge(t, dir)}
	}, true, true},
	{"mem+local", func(t testing.TB, dir string) store.Config {
		return store.Config{KV: mem.New(), Large: localLarge(t, dir)}
	}, true, true},
	{"mem+mem", func(t testing.TB, dir string) store.Config {
		return store.Config{KV: mem.New(), Large: mem.New()}
	}, true, true},
	{"large-only-local", func(t testing.TB, dir string) store.Config {
		return store.Config{Large: localLarge(t, dir)}
	}, true, false},
}

func openStore(t testing.TB, l layout, dir string) *store.Store {
	t.Helper()
	cfg := l.open(t, dir)
	cfg.Threshold = threshold
	cfg.ScratchDir = t.TempDir()
	s, err := store.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func readAll(t *testing.T, s *store.Store, d store.Digest) []byte {
	t.Helper()
	r, ok, err := s.Get(t.Context(), d)
	if err != nil || !ok {
		t.Fatalf("get %s: ok=%v err=%v", d.Short(), ok, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read %s: %v", d.Short(), err)
	}
	return b
}

// residue is the stage residue of the large engine (0 without one).
func residue(t *testing.T, s *store.Store) int {
	t.Helper()
	rc, ok := s.Large().(engines.ResidueCounter)
	if !ok {
		return 0
	}
	n, err := rc.StageResidue(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func assertClean(t *testing.T, s *store.Store) {
	t.Helper()
	if n := residue(t, s); n != 0 {
		t.Errorf("stage residue: %d, want 0", n)
	}
	if d, p := s.GC().PinCount(); d != 0 || p != 0 {
		t.Errorf("leaked pins: %d digests, %d pins", d, p)
	}
}

func count(t *testing.T, s *store.Store) int {
	t.Helper()
	n := 0
	for _, err := range s.List(t.Context()) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	return n
}

func TestRoundTripAllLayouts(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			s := openStore(t, l, t.TempDir())
			sizes := []int{0, 1, threshold - 1, threshold}
			if l.large {
				sizes = append(sizes, threshold+1, 3*64<<10+17, 1<<20)
			}
			for _, n := range sizes {
				for _, known := range []bool{true, false} {
					data := randBytes(n)
					size := int64(n)
					if !known {
						size = -1
					}
					d, pin, err := s.Put(t.Context(), bytes.NewReader(data), size)
					if err != nil {
						t.Fatalf("put %d bytes (known=%v): %v", n, known, err)
					}
					pin.Release()
					if d != sha256.Sum256(data) {
						t.Fatalf("digest mismatch")
					}
					info, ok, err := s.Stat(t.Context(), d)
					if err != nil || !ok || info.Size != int64(n) {
						t.Fatalf("stat: %+v %v %v", info, ok, err)
					}
					wantTier := store.TierKV
					if n > threshold || !l.kv {
						wantTier = store.TierLarge
					}
					if info.Tier != wantTier {
						t.Errorf("%d bytes landed in %s, want %s", n, info.Tier, wantTier)
					}
					if got := readAll(t, s, d); !bytes.Equal(got, data) {
						t.Fatalf("read back %d bytes differs", n)
					}
					if ok, err := s.Has(t.Context(), d); !ok || err != nil {
						t.Fatalf("has: %v %v", ok, err)
					}
				}
			}
			assertClean(t, s)
		})
	}
}

func TestDedupReturnsPin(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			s := openStore(t, l, t.TempDir())
			n := threshold / 2
			if l.large {
				n = threshold * 3
			}
			data := randBytes(n)
			d1, p1, err := s.Put(t.Context(), bytes.NewReader(data), int64(n))
			if err != nil {
				t.Fatal(err)
			}
			d2, p2, err := s.Put(t.Context(), bytes.NewReader(data), -1)
			if err != nil || d1 != d2 || p2 == nil {
				t.Fatalf("re-put: %v %v %v", d2, p2, err)
			}
			if _, pins := s.GC().PinCount(); pins != 2 {
				t.Fatalf("pins = %d, want 2", pins)
			}
			p1.Release()
			p2.Release()
			if c := count(t, s); c != 1 {
				t.Fatalf("%d entries after a dedup, want 1", c)
			}
			assertClean(t, s)
		})
	}
}

func TestMalformedDigest(t *testing.T) {
	for _, bad := range []string{"", "abc", strings.Repeat("g", 64), strings.Repeat("a", 63), strings.Repeat("a", 65), "../../etc/passwd"} {
		if _, err := store.ParseDigest(bad); !errors.Is(err, store.ErrKeyInvalid) {
			t.Errorf("ParseDigest(%q) = %v, want ErrKeyInvalid", bad, err)
		}
	}
}

func TestFailingReaderLeavesNothing(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			s := openStore(t, l, t.TempDir())
			boom := errors.New("disk on fire")
			sizes := []int{threshold / 2}
			if l.large {
				sizes = append(sizes, threshold*40)
			}
			for _, n := range sizes {
				for _, size := range []int64{int64(n), -1} {
					r := io.MultiReader(bytes.NewReader(randBytes(n)), iotest.ErrReader(boom))
					if _, _, err := s.Put(t.Context(), r, size); !errors.Is(err, boom) && size == -1 {
						t.Fatalf("put with a failing reader (size %d): %v", size, err)
					} else if err == nil {
						t.Fatalf("put with a failing reader (size %d) succeeded", size)
					}
				}
			}
			// Short and long content for a declared size.
			if _, _, err := s.Put(t.Context(), bytes.NewReader(randBytes(10)), 11); err == nil {
				t.Fatal("short content accepted")
			}
			if _, _, err := s.Put(t.Context(), bytes.NewReader(randBytes(12)), 11); err == nil {
				t.Fatal("long content accepted")
			}
			if l.large {
				if _, _, err := s.Put(t.Context(), bytes.NewReader(randBytes(threshold*3)), threshold*3+5); err == nil {
					t.Fatal("short large content accepted")
				}
			}
			if c := count(t, s); c != 0 {
				t.Fatalf("%d entries after failed puts", c)
			}
			assertClean(t, s)
		})
	}
}

func TestPutVerified(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			s := openStore(t, l, t.TempDir())
			for i, n := range []int{100, threshold * 5} {
				if n > threshold && !l.large {
					continue
				}
				data := randBytes(n)
				wrong := blob.Sum([]byte("something else"))
				if _, err := s.PutVerified(t.Context(), wrong, bytes.NewReader(data), int64(n)); !errors.Is(err, store.ErrVerification) {
					t.Fatalf("mismatch: %v, want ErrVerification", err)
				}
				if c := count(t, s); c != i {
					t.Fatalf("mismatched put stored an entry: %d, want %d", c, i)
				}
				pin, err := s.PutVerified(t.Context(), sha256.Sum256(data), bytes.NewReader(data), -1)
				if err != nil {
					t.Fatal(err)
				}
				pin.Release()
			}
			assertClean(t, s)
		})
	}
}

func TestKVOnlyRejectsOverThreshold(t *testing.T) {
	s := openStore(t, layouts[1], t.TempDir())
	// Known length: rejected before reading anything.
	r := &countingReader{r: bytes.NewReader(randBytes(threshold + 1))}
	if _, _, err := s.Put(t.Context(), r, threshold+1); !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("known length: %v, want ErrTooLarge", err)
	}
	if r.n != 0 {
		t.Fatalf("known-length rejection read %d bytes first", r.n)
	}
	// Unknown length: rejected when the buffer overflows, not at EOF.
	r = &countingReader{r: io.LimitReader(neverEnding{}, 1<<30)}
	if _, _, err := s.Put(t.Context(), r, -1); !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("unknown length: %v, want ErrTooLarge", err)
	}
	if r.n > threshold+1 {
		t.Fatalf("unknown-length rejection read %d bytes, want at most threshold+1", r.n)
	}
	u, err := s.NewUpload(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.WriteAt(randBytes(threshold+1), 0); !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("upload over threshold: %v", err)
	}
	u.Discard()
	if c := count(t, s); c != 0 {
		t.Fatalf("%d entries stored", c)
	}
	assertClean(t, s)
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

type neverEnding struct{}

func (neverEnding) Read(p []byte) (int, error) { return len(p), nil }

func TestFallThroughAndMissing(t *testing.T) {
	s := openStore(t, layouts[2], t.TempDir())
	s.GC().Register(&refs{m: map[blob.Digest]bool{}}) // deletes need a source
	absent := blob.Sum([]byte("absent"))
	if _, ok, err := s.Get(t.Context(), absent); ok || err != nil {
		t.Fatalf("get absent: %v %v", ok, err)
	}
	if _, ok, err := s.Stat(t.Context(), absent); ok || err != nil {
		t.Fatalf("stat absent: %v %v", ok, err)
	}
	if ok, err := s.Has(t.Context(), absent); ok || err != nil {
		t.Fatalf("has absent: %v %v", ok, err)
	}
	if _, _, err := s.ReadRange(t.Context(), absent, 0, 1); !errors.Is(err, store.ErrMissing) {
		t.Fatalf("read range absent: %v", err)
	}
	if err := s.Delete(t.Context(), absent); !errors.Is(err, store.ErrMissing) {
		t.Fatalf("delete absent: %v", err)
	}
	small, big := randBytes(100), randBytes(threshold*3)
	ds, ps, _ := s.Put(t.Context(), bytes.NewReader(small), -1)
	dl, pl, _ := s.Put(t.Context(), bytes.NewReader(big), -1)
	for _, c := range []struct {
		d    store.Digest
		data []byte
	}{{ds, small}, {dl, big}} {
		got, sum, err := s.ReadRange(t.Context(), c.d, 10, 50)
		if err != nil || !bytes.Equal(got, c.data[10:60]) || sum != sha256.Sum256(c.data[10:60]) {
			t.Fatalf("read range: %v", err)
		}
		got, _, err = s.ReadRange(t.Context(), c.d, int64(len(c.data))-5, 50)
		if err != nil || !bytes.Equal(got, c.data[len(c.data)-5:]) {
			t.Fatalf("read range across EOF: %d bytes, %v", len(got), err)
		}
		got, _, err = s.ReadRange(t.Context(), c.d, int64(len(c.data))+5, 50)
		if err != nil || len(got) != 0 {
			t.Fatalf("read range past EOF: %d bytes, %v", len(got), err)
		}
	}
	// Protected: refused.
	if err := s.Delete(t.Context(), ds); !errors.Is(err, store.ErrGcRefuse) {
		t.Fatalf("delete pinned: %v, want ErrGcRefuse", err)
	}
	ps.Release()
	pl.Release()
	for _, d := range []store.Digest{ds, dl} {
		if err := s.Delete(t.Context(), d); err != nil {
			t.Fatal(err)
		}
		if ok, _ := s.Has(t.Context(), d); ok {
			t.Fatal("still there after delete")
		}
	}
}

// flip flips one byte of the file at path.
func flip(t *testing.T, path string, off int64) {
	t.Helper()
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func blobPath(dir string, d store.Digest) string {
	h := d.String()
	return filepath.Join(dir, "large", "blobs", h[:2], h)
}

// A byte flipped on disk is detected on every read path: never the wrong
// bytes returned as good.
func TestFlippedByteDetected(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, layouts[2], dir)
	data := randBytes(4 << 20)
	d, pin, err := s.Put(t.Context(), bytes.NewReader(data), -1)
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	const at = 3_700_000
	flip(t, blobPath(dir, d), at)

	// Both readers open before either finds the flip: the first to find
	// it records it, and Get refuses the blob from then on.
	r, _, err := s.Get(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	rr, _, err := s.Get(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	if _, err := io.ReadAll(r); !errors.Is(err, store.ErrVerification) {
		t.Fatalf("streaming read: %v, want ErrVerification", err)
	}
	r.Close()

	buf := make([]byte, 4096)
	if _, err := rr.ReadAt(buf, 0); err != nil {
		t.Fatalf("range read of an intact chunk: %v", err)
	}
	if _, err := rr.ReadAt(buf, at-100); !errors.Is(err, store.ErrVerification) {
		t.Fatalf("range read over the flipped byte: %v, want ErrVerification", err)
	}
	if rr.FullyVerified() {
		t.Fatal("a corrupt blob reported fully verified")
	}
	wantRefused(t, s, d, "after reads found it corrupt")

	// Without chunk sums (lost sidecar), the first read hashes the whole
	// blob: it fails even where the bytes it asked for are intact.
	data2 := randBytes(4 << 20)
	d2, pin, err := s.Put(t.Context(), bytes.NewReader(data2), -1)
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	flip(t, blobPath(dir, d2), at)
	h := d2.String()
	if err := os.Remove(filepath.Join(dir, "large", "sums", h[:2], h)); err != nil {
		t.Fatal(err)
	}
	r2, _, err := s.Get(t.Context(), d2)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if _, err := r2.ReadAt(buf, 0); !errors.Is(err, store.ErrVerification) {
		t.Fatalf("no sums, read of an intact prefix: %v, want ErrVerification", err)
	}
	if _, err := r2.ReadAt(buf, int64(len(data2))-4096); !errors.Is(err, store.ErrVerification) {
		t.Fatalf("no sums, read at the end: %v, want ErrVerification", err)
	}
	wantRefused(t, s, d2, "no sums, after a read found it corrupt")
}

func TestFlippedKVValueDetected(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, layouts[2], dir)
	data := randBytes(1000)
	d, pin, _ := s.Put(t.Context(), bytes.NewReader(data), -1)
	pin.Release()
	if err := sqlite.FlipValueBit(t.Context(), s.KV().(engines.SQL).DB(), d); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(t.Context(), d); !errors.Is(err, store.ErrVerification) {
		t.Fatalf("get of a corrupt kv value: %v, want ErrVerification", err)
	}
	if _, _, err := s.ReadRange(t.Context(), d, 0, 10); !errors.Is(err, store.ErrVerification) {
		t.Fatalf("read range of a corrupt kv value: %v", err)
	}
}

func TestRangeVerificationMarksFull(t *testing.T) {
	s := openStore(t, layouts[2], t.TempDir())
	data := randBytes(5*64<<10 + 123)
	d, pin, _ := s.Put(t.Context(), bytes.NewReader(data), -1)
	pin.Release()
	r, _, _ := s.Get(t.Context(), d)
	defer r.Close()
	buf := make([]byte, 50_000) // unaligned, spans chunk boundaries
	var got []byte
	for off := int64(0); ; off += int64(len(buf)) {
		n, err := r.ReadAt(buf, off)
		got = append(got, buf[:n]...)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if r.FullyVerified() && off+int64(n) < int64(len(data)) {
			t.Fatal("fully verified before the last chunk was read")
		}
	}
	if !bytes.Equal(got, data) || !r.FullyVerified() {
		t.Fatalf("range reads: equal=%v full=%v", bytes.Equal(got, data), r.FullyVerified())
	}
}

// A blob whose chunk checksums are gone (a crash between writing a blob
// and its sidecar, or an engine that keeps none) is verified whole on the
// first range read, then served.
func TestRangeReadWithoutSums(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, layouts[2], dir)
	data := randBytes(3<<20 + 5)
	d, pin, _ := s.Put(t.Context(), bytes.NewReader(data), -1)
	pin.Release()
	h := d.String()
	if err := os.Remove(filepath.Join(dir, "large", "sums", h[:2], h)); err != nil {
		t.Fatal(err)
	}
	r, _, _ := s.Get(t.Context(), d)
	defer r.Close()
	buf := make([]byte, 10_000)
	n, err := r.ReadAt(buf, 2<<20)
	if err != nil || n != len(buf) || !bytes.Equal(buf, data[2<<20:2<<20+10_000]) {
		t.Fatalf("range read of an intact blob without sums: %d, %v", n, err)
	}
	if !r.FullyVerified() {
		t.Fatal("whole-blob verification did not mark the reader verified")
	}
}

func TestStatMany(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			s := openStore(t, l, t.TempDir())
			var ds []store.Digest
			for _, n := range []int{10, threshold * 2, 100} {
				if n > threshold && !l.large {
					continue
				}
				d, pin, err := s.Put(t.Context(), bytes.NewReader(randBytes(n)), int64(n))
				if err != nil {
					t.Fatal(err)
				}
				pin.Release()
				ds = append(ds, d)
			}
			absent := blob.Sum([]byte("absent"))
			got, err := s.StatMany(t.Context(), append(ds, absent, ds[0]))
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := got[absent]; ok || len(got) != len(ds) {
				t.Fatalf("StatMany = %v", got)
			}
			for _, d := range ds {
				want, _, _ := s.Stat(t.Context(), d)
				if got[d] != want {
					t.Fatalf("StatMany[%s] = %+v, Stat = %+v", d.Short(), got[d], want)
				}
			}
		})
	}
}

// TestUnknownSizePutAllocatesWhatArrives: a put of unknown length buffers
// what it receives, not the threshold: 10 bytes under a 1 GiB threshold
// cost kilobytes, not a gigabyte.
func TestUnknownSizePutAllocatesWhatArrives(t *testing.T) {
	s, err := store.Open(t.Context(), store.Config{KV: mem.New(), Mode: store.ModeMemOnly, Threshold: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, pin, err := s.Put(t.Context(), strings.NewReader("ten bytes!"), -1)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	if got := after.TotalAlloc - before.TotalAlloc; got > 128<<20 { // the old code: 1 GiB; slack for other goroutines
		t.Fatalf("a 10-byte put of unknown length allocated %d bytes", got)
	}
}

// TestReadRangeBounded: one range read returns at most MaxReadRange bytes
// in memory; a larger range is refused, not allocated.
func TestReadRangeBounded(t *testing.T) {
	s := openStore(t, layouts[2], t.TempDir())
	big := make([]byte, store.MaxReadRange+1)
	d, pin, err := s.Put(t.Context(), bytes.NewReader(big), int64(len(big)))
	if err != nil {
		t.Fatal(err)
	}
	defer pin.Release()
	if _, _, err := s.ReadRange(t.Context(), d, 0, int64(len(big))); !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("ReadRange of %d bytes = %v; want ErrTooLarge", len(big), err)
	}
	got, _, err := s.ReadRange(t.Context(), d, 1, store.MaxReadRange)
	if err != nil || len(got) != store.MaxReadRange {
		t.Fatalf("ReadRange of MaxReadRange bytes: %d, %v", len(got), err)
	}
}
