package store_test

import (
	"bytes"
	"context"
	"errors"
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

// TestUploadAppendsReadBack: appends that the stage writer may not have
// written yet read back, and a rewrite of them and a truncate apply after
// them, so the content published is what was written in that order.
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
	back := make([]byte, len(data))
	if n, err := u.ReadAt(back, 0); n != len(data) || !bytes.Equal(back, data) {
		t.Fatalf("read back %d bytes, %v: differs from the appends", n, err)
	}
	// A rewrite at the start, then a cut: both after every append.
	copy(data, "rewritten")
	if _, err := u.WriteAt([]byte("rewritten"), 0); err != nil {
		t.Fatal(err)
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

// failOnce is a large engine whose stages fail the one write at offset
// at with ENOSPC.
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
	return failOnceStage{st.(engines.RandomStage), l}, nil
}

type failOnceStage struct {
	engines.RandomStage
	l *failOnce
}

func (s failOnceStage) WriteAt(p []byte, off int64) (int, error) {
	if off == s.l.at && s.l.failed.CompareAndSwap(false, true) {
		return 0, syscall.ENOSPC
	}
	return s.RandomStage.WriteAt(p, off)
}
