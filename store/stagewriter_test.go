package store_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/mem"
	"github.com/alkblobfs/alkblobfs/store"
)

// TestUploadAppendFailureSticks: sequential appends reach the stage on
// the stage writer's goroutine, so a failed one (a full disk) surfaces at
// a later call. Whenever it does, the upload has lost bytes and fails for
// good: every later write, truncate and Commit report it, nothing is
// published, and no stage file or pin is left. The failure here is of one
// write only, the later ones succeed, as a disk that frees up would let
// them: the content then has a hole where that write was, and publishing
// it would be wrong.
func TestUploadAppendFailureSticks(t *testing.T) {
	const chunk = 1 << 20
	for _, failAt := range []int64{2 * chunk, 7 * chunk} { // in the middle; the last write
		l := &failOnce{Large: localLarge(t, t.TempDir()), at: failAt}
		s := openWith(t, store.Config{KV: mem.New(), Large: l})
		u, err := s.NewUpload(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		data := randBytes(8 * chunk)
		var werr error
		for off := 0; off < len(data); off += chunk {
			if _, err := u.WriteAt(data[off:off+chunk], int64(off)); err != nil && werr == nil {
				werr = err
			}
		}
		if werr != nil && !errors.Is(werr, syscall.ENOSPC) {
			t.Fatalf("a write failed with %v; want ENOSPC or nothing (reported later)", werr)
		}
		if werr != nil {
			if err := u.Truncate(0); !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Truncate after the failed write = %v; want ENOSPC", err)
			}
		}
		d, pin, err := u.Commit(t.Context(), nil)
		if err == nil {
			pin.Release()
			t.Fatalf("fail at %d: Commit published %s (%v) after a write failed; want ENOSPC", failAt, d.Short(), d == blob.Sum(data))
		}
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("fail at %d: Commit = %v; want ENOSPC", failAt, err)
		}
		if !l.failed.Load() {
			t.Fatalf("fail at %d: the stage never failed a write", failAt)
		}
		if n := count(t, s); n != 0 {
			t.Fatalf("fail at %d: %d blobs published; want none", failAt, n)
		}
		assertClean(t, s)
	}
}

// TestPutStageFailure: a put whose stage write fails (on the stage
// writer's goroutine) returns that error, publishes nothing and leaves no
// stage file or pin, whether the size is known or not.
func TestPutStageFailure(t *testing.T) {
	for _, size := range []int64{8 << 20, -1} {
		l := &failOnce{Large: localLarge(t, t.TempDir()), at: 3 << 20}
		s := openWith(t, store.Config{KV: mem.New(), Large: l})
		data := randBytes(8 << 20)
		d, pin, err := s.Put(t.Context(), bytes.NewReader(data), size)
		if err == nil {
			pin.Release()
			t.Fatalf("size %d: Put published %s though a stage write failed", size, d.Short())
		}
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("size %d: Put = %v; want ENOSPC", size, err)
		}
		if !l.failed.Load() {
			t.Fatalf("size %d: the stage never failed a write", size)
		}
		if n := count(t, s); n != 0 {
			t.Fatalf("size %d: %d blobs published; want none", size, n)
		}
		assertClean(t, s)
	}
}

// TestUploadAppendsReadBack: a rewrite of appends that the stage writer
// may not have written yet applies after them, and so does a truncate;
// reads see all of it, and the content published is what was written in
// that order.
func TestUploadAppendsReadBack(t *testing.T) {
	s := openWith(t, store.Config{KV: mem.New(), Large: localLarge(t, t.TempDir())})
	u, err := s.NewUpload(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	data := randBytes(6<<20 + 123)
	for off := 0; off < len(data); off += 128 << 10 {
		if _, err := u.WriteAt(data[off:min(len(data), off+128<<10)], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	// Into the last append, likely still queued.
	at := len(data) - 100
	copy(data[at:], "rewritten")
	if _, err := u.WriteAt([]byte("rewritten"), int64(at)); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(data))
	if n, err := u.ReadAt(back, 0); n != len(data) || !bytes.Equal(back, data) {
		t.Fatalf("read back %d bytes, %v: differs from what was written", n, err)
	}
	data = data[:5<<20]
	if err := u.Truncate(int64(len(data))); err != nil {
		t.Fatal(err)
	}
	d, pin, err := u.Commit(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	if d != blob.Sum(data) || !bytes.Equal(readAll(t, s, d), data) {
		t.Fatal("published content differs from what was written")
	}
	assertClean(t, s)
}

// failOnce is a large engine whose stages fail one write with ENOSPC: the
// WriteAt at offset at, or the first Write at or past it.
type failOnce struct {
	engines.Large
	at     int64
	failed atomic.Bool
}

func (l *failOnce) Stage(ctx context.Context) (engines.Stage, error) {
	st, err := l.Large.Stage(ctx)
	if err != nil {
		return nil, err
	}
	return failOnceStage{st.(engines.RandomStage), l, new(int64)}, nil
}

type failOnceStage struct {
	engines.RandomStage
	l   *failOnce
	end *int64 // where the next Write goes
}

func (s failOnceStage) Write(p []byte) (int, error) {
	if *s.end >= s.l.at && s.l.failed.CompareAndSwap(false, true) {
		return 0, syscall.ENOSPC
	}
	n, err := s.RandomStage.Write(p)
	*s.end += int64(n)
	return n, err
}

func (s failOnceStage) WriteAt(p []byte, off int64) (int, error) {
	if off == s.l.at && s.l.failed.CompareAndSwap(false, true) {
		return 0, syscall.ENOSPC
	}
	return s.RandomStage.WriteAt(p, off)
}

// TestLargePutChunkSums: the chunk checksums of a large blob are the
// CRC-32C of each 64 KiB of its content, whichever goroutine computed them
// and however the content arrived: appends to an upload (the first ones
// held in memory, then written by the stage writer), appends around a
// truncate to the same size, and puts of known and unknown size.
func TestLargePutChunkSums(t *testing.T) {
	s := openWith(t, store.Config{KV: mem.New(), Large: localLarge(t, t.TempDir())})
	sr := s.Large().(engines.SidecarReader)
	data := randBytes(5<<20 + 1000)
	const piece = 300 << 10
	uploads := map[string]func(u *store.Upload){
		"appends": func(u *store.Upload) {
			u.WriteAt(data[:1000], 0) // in memory, then spilled
			for off := 1000; off < len(data); off += piece {
				u.WriteAt(data[off:min(len(data), off+piece)], int64(off))
			}
		},
		"truncate to the same size between appends": func(u *store.Upload) {
			u.WriteAt(data[:2<<20], 0)
			u.Truncate(2 << 20)
			u.WriteAt(data[2<<20:], 2<<20)
		},
	}
	for name, write := range uploads {
		data[0]++ // a new blob each time
		u, err := s.NewUpload(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		write(u)
		d, pin, err := u.Commit(t.Context(), nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		pin.Release()
		checkSums(t, name, sr, d, data)
	}
	for _, size := range []int64{int64(len(data)), -1} {
		data[0]++
		d, pin, err := s.Put(t.Context(), bytes.NewReader(data), size)
		if err != nil {
			t.Fatal(err)
		}
		pin.Release()
		checkSums(t, fmt.Sprintf("put of size %d", size), sr, d, data)
	}
	assertClean(t, s)
}

func checkSums(t *testing.T, name string, sr engines.SidecarReader, d blob.Digest, data []byte) {
	t.Helper()
	if d != blob.Sum(data) {
		t.Fatalf("%s: digest %s, want that of the content", name, d.Short())
	}
	got, err := sr.Sidecar(t.Context(), d)
	if err != nil {
		t.Fatalf("%s: sidecar: %v", name, err)
	}
	const chunk = 64 << 10
	want := []byte{1, 0, 0, 0}
	want = binary.LittleEndian.AppendUint32(want, chunk)
	for off := 0; off < len(data); off += chunk {
		want = binary.LittleEndian.AppendUint32(want, crc32.Checksum(data[off:min(len(data), off+chunk)], crc32.MakeTable(crc32.Castagnoli)))
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: chunk checksums differ from the CRC-32C of each 64 KiB of the content", name)
	}
}
