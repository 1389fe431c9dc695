package store_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/local"
	"github.com/alkblobfs/alkblobfs/store"
)

// countingLocal is the local engine, counting the bytes read through its
// cursors: what a read makes the store read (and hash) from the medium.
type countingLocal struct {
	*local.Engine
	n *atomic.Int64
}

func (e countingLocal) Open(ctx context.Context, d blob.Digest) (engines.Cursor, error) {
	c, err := e.Engine.Open(ctx, d)
	if err != nil {
		return nil, err
	}
	return countingCursor{c.(engines.FileCursor), e.n}, nil
}

type countingCursor struct {
	engines.FileCursor
	n *atomic.Int64
}

func (c countingCursor) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.FileCursor.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

// openCounting opens a store over sqlite and a counting local engine in
// dir; n counts the bytes its large tier reads.
func openCounting(t *testing.T, dir string) (*store.Store, *atomic.Int64) {
	t.Helper()
	e, err := local.Open(t.Context(), filepath.Join(dir, "large"), nil)
	if err != nil {
		t.Fatal(err)
	}
	n := new(atomic.Int64)
	s, err := store.Open(t.Context(), store.Config{KV: sqliteKV(t, dir), Large: countingLocal{e, n}, Threshold: threshold})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, n
}

// TestCorruptRangeReadRecorded: a range read of a corrupt large blob
// hashes it whole to tell damaged checksums from damaged content; the
// verdict goes to the corrupt ledger, so that the next Get, in this
// process or another, refuses it up front instead of hashing it whole
// again before it answers.
func TestCorruptRangeReadRecorded(t *testing.T) {
	dir := t.TempDir()
	s, n := openCounting(t, dir)
	other := openStore(t, layouts[2], dir)
	ctx := t.Context()
	size := 4 << 20
	data := randBytes(size)
	d, pin, err := s.Put(ctx, bytes.NewReader(data), int64(size))
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	flip(t, blobPath(dir, d), 3<<20)

	r, ok, err := s.Get(ctx, d)
	if err != nil || !ok {
		t.Fatalf("first Get: %v, %v", ok, err)
	}
	buf := make([]byte, 4096)
	if _, err := r.ReadAt(buf, 3<<20); !errors.Is(err, store.ErrVerification) {
		t.Fatalf("range read of a corrupt chunk: %v; want ErrVerification", err)
	}
	r.Close()
	before := n.Load()
	if before < int64(size) {
		t.Fatalf("the first read read %d bytes; the whole-blob hash should have read %d", before, size)
	}
	wantRefused(t, s, d, "the next Get")
	wantRefused(t, other, d, "another store over the same database")
	if got := n.Load(); got != before {
		t.Fatalf("refusing the blob read %d more bytes", got-before)
	}
}

// TestDamagedSumsRehashOnce: a blob whose chunk checksums alone are
// damaged is hashed whole once; the next readers check its chunks with
// the checksums computed from that verified content, reading only the
// chunks they touch.
func TestDamagedSumsRehashOnce(t *testing.T) {
	dir := t.TempDir()
	s, n := openCounting(t, dir)
	ctx := t.Context()
	size := 4 << 20
	data := randBytes(size)
	d, pin, err := s.Put(ctx, bytes.NewReader(data), int64(size))
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	h := d.String()
	flip(t, filepath.Join(dir, "large", "sums", h[:2], h), 8+4*10) // chunk 10's checksum

	read := func(who string) int64 {
		t.Helper()
		start := n.Load()
		r, ok, err := s.Get(ctx, d)
		if err != nil || !ok {
			t.Fatalf("%s: Get: %v, %v", who, ok, err)
		}
		defer r.Close()
		buf := make([]byte, 4096)
		off := int64(10<<16 + 100)
		if k, err := r.ReadAt(buf, off); k != len(buf) || err != nil {
			t.Fatalf("%s: range read of an intact chunk with a damaged checksum: %d, %v", who, k, err)
		}
		if !bytes.Equal(buf, data[off:off+int64(len(buf))]) {
			t.Fatalf("%s: wrong bytes", who)
		}
		return n.Load() - start
	}
	if got := read("first reader"); got < int64(size) {
		t.Fatalf("first reader read %d bytes; want the whole blob hashed", got)
	}
	if got := read("second reader"); got > 1<<16 {
		t.Fatalf("second reader read %d bytes; want one chunk (no whole hash again)", got)
	}
	if cs, err := s.Corrupt(ctx); err != nil || len(cs) != 0 {
		t.Fatalf("Corrupt() = %v, %v; the content is intact", cs, err)
	}
}

// TestBytesOutWholeForm: a blob without chunk checksums (served in the
// whole-blob form) counts each byte handed out once.
func TestBytesOutWholeForm(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, layouts[2], dir)
	size := 1<<20 + 7
	data := randBytes(size)
	d, pin, err := s.Put(t.Context(), bytes.NewReader(data), int64(size))
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	h := d.String()
	if err := os.Remove(filepath.Join(dir, "large", "sums", h[:2], h)); err != nil {
		t.Fatal(err)
	}
	before := s.Stats().BytesOut
	if got := readAll(t, s, d); !bytes.Equal(got, data) {
		t.Fatal("wrong bytes")
	}
	if got := s.Stats().BytesOut - before; got != int64(size) {
		t.Fatalf("a full Read counted %d bytes out; want %d", got, size)
	}
	r, _, err := s.Get(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	before = s.Stats().BytesOut
	buf := make([]byte, 4096)
	if _, err := r.ReadAt(buf, 100); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats().BytesOut - before; got != int64(len(buf)) {
		t.Fatalf("a ReadAt counted %d bytes out; want %d", got, len(buf))
	}
}
