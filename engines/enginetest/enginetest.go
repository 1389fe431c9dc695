package enginetest

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Run runs the conformance suite against engines made by open.
func Run(t *testing.T, open func(t *testing.T) engines.Engine) {
	s := &suite{open: open}

	probe := s.engine(t)
	_, isKV := probe.(engines.KV)
	_, isLarge := probe.(engines.Large)
	_, isPutter := probe.(meta.Putter)
	if !isKV && !isLarge {
		t.Fatalf("%s implements neither engines.KV nor engines.Large: nothing can put into it", probe.Name())
	}
	if _, ok := probe.(engines.ResidueCounter); isLarge && !ok {
		t.Fatalf("%s is engines.Large but not engines.ResidueCounter: stage residue cannot be counted", probe.Name())
	}

	t.Run("Name", s.testName)
	t.Run("PutGet", s.testPutGet)
	t.Run("Missing", s.testMissing)
	t.Run("ReadAt", s.testReadAt)
	t.Run("ConcurrentReadAt", s.testConcurrentReadAt)
	t.Run("Delete", s.testDelete)
	t.Run("CursorSurvivesDelete", s.testCursorSurvivesDelete)
	t.Run("FileCursor", s.testFileCursor)
	t.Run("ConcurrentDistinct", s.testConcurrentDistinct)
	t.Run("List", s.testList)
	if isKV {
		t.Run("KV", s.testKV)
	}
	if isLarge {
		t.Run("Large", s.testLarge)
	}
	if isPutter {
		t.Run("Putter", s.testPutter)
	}
	if _, ok := probe.(engines.BatchDeleter); ok {
		t.Run("DeleteMany", s.testDeleteMany)
	}
	if _, ok := probe.(engines.BatchSizer); ok {
		t.Run("SizeMany", s.testSizeMany)
	}
}

type suite struct {
	open func(t *testing.T) engines.Engine
}

// engine opens a fresh engine that is closed when t ends.
func (s *suite) engine(t *testing.T) engines.Engine {
	t.Helper()
	e := s.open(t)
	if e == nil {
		t.Fatal("open returned a nil engine")
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

// value returns n deterministic pseudo-random bytes.
func value(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, uint64(n)))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		u := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(u >> (8 * j))
		}
	}
	return b
}

// put stores v under its sha256 and returns the digest.
func put(t *testing.T, e engines.Engine, v []byte) blob.Digest {
	t.Helper()
	d := blob.Sum(v)
	putAs(t, e, d, v)
	return d
}

// putAs stores v under d through the engine's put shape (KV first).
func putAs(t *testing.T, e engines.Engine, d blob.Digest, v []byte) {
	t.Helper()
	if err := tryPut(t, e, d, v); err != nil {
		t.Fatalf("put %s (%d bytes): %v", d.Short(), len(v), err)
	}
}

func tryPut(t *testing.T, e engines.Engine, d blob.Digest, v []byte) error {
	ctx := t.Context()
	switch x := e.(type) {
	case engines.KV:
		_, err := x.Put(ctx, d, v)
		return err
	case engines.Large:
		st, err := x.Stage(ctx)
		if err != nil {
			return err
		}
		defer st.Discard()
		if _, err := st.Write(v); err != nil {
			return err
		}
		return st.Commit(ctx, d)
	}
	return errors.New("engine has no put shape")
}

// putMany stores n distinct small values with a few workers (a Large engine
// may fsync per commit) and returns their digests in ascending order.
func putMany(t *testing.T, e engines.Engine, n int) []blob.Digest {
	t.Helper()
	return putRange(t, e, 0, n)
}

// putRange is putMany of the values from to to of the same sequence: the
// values of putRange(0, m) and putRange(m, n) are putMany's n.
func putRange(t *testing.T, e engines.Engine, from, to int) []blob.Digest {
	t.Helper()
	n := to - from
	ds := make([]blob.Digest, n)
	vs := make([][]byte, n)
	for i := range n {
		vs[i] = value(8+(from+i)%64, uint64(from+i)+1<<32)
		ds[i] = blob.Sum(vs[i])
	}
	const workers = 8
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				if err := tryPut(t, e, ds[i], vs[i]); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("putMany: %v", err)
	}
	sortDigests(ds)
	return ds
}

func sortDigests(ds []blob.Digest) {
	slices.SortFunc(ds, blob.Digest.Compare)
}

// readAll reads d whole through a cursor and checks the cursor's EOF
// behaviour at the end of the value.
func readAll(t *testing.T, e engines.Engine, d blob.Digest) []byte {
	t.Helper()
	c, err := e.Open(t.Context(), d)
	if err != nil {
		t.Fatalf("Open %s: %v", d.Short(), err)
	}
	defer closeCursor(t, c)
	n := c.Len()
	if n < 0 {
		t.Fatalf("Open %s: Len = %d", d.Short(), n)
	}
	// One byte more than Len: the read must stop at Len with io.EOF.
	buf := make([]byte, n+1)
	got, err := c.ReadAt(buf, 0)
	if int64(got) != n || err != io.EOF {
		t.Fatalf("ReadAt(%d bytes, 0) of a %d-byte blob = %d, %v; want %d, io.EOF", len(buf), n, got, err, n)
	}
	return buf[:n]
}

func closeCursor(t *testing.T, c engines.Cursor) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Errorf("cursor Close: %v", err)
	}
}

func checkContent(t *testing.T, e engines.Engine, d blob.Digest, want []byte) {
	t.Helper()
	if got := readAll(t, e, d); !bytes.Equal(got, want) {
		t.Fatalf("content of %s: got %d bytes (%s), want %d bytes (%s)", d.Short(), len(got), short(got), len(want), short(want))
	}
	size, err := e.Size(t.Context(), d)
	if err != nil || size != int64(len(want)) {
		t.Fatalf("Size %s = %d, %v; want %d, nil", d.Short(), size, err, len(want))
	}
	if ok, err := e.Has(t.Context(), d); !ok || err != nil {
		t.Fatalf("Has %s = %v, %v; want true, nil", d.Short(), ok, err)
	}
}

func checkAbsent(t *testing.T, e engines.Engine, d blob.Digest) {
	t.Helper()
	if ok, err := e.Has(t.Context(), d); ok || err != nil {
		t.Fatalf("Has %s = %v, %v; want false, nil", d.Short(), ok, err)
	}
	if _, err := e.Size(t.Context(), d); !errors.Is(err, blob.ErrMissing) {
		t.Fatalf("Size %s: err = %v; want blob.ErrMissing", d.Short(), err)
	}
}

func short(b []byte) string {
	if len(b) > 16 {
		return hex.EncodeToString(b[:16]) + "…"
	}
	return hex.EncodeToString(b)
}
