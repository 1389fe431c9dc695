package enginetest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

func (s *suite) testName(t *testing.T) {
	if name := s.engine(t).Name(); name == "" {
		t.Fatal("Name is empty; messages need the engine kind and location")
	}
}

func (s *suite) testPutGet(t *testing.T) {
	e := s.engine(t)
	for i, n := range []int{0, 1, 4096, 100<<10 + 7} {
		v := value(n, uint64(i))
		d := put(t, e, v)
		checkContent(t, e, d, v)
	}
}

func (s *suite) testMissing(t *testing.T) {
	e := s.engine(t)
	put(t, e, []byte("present"))
	d := blob.Sum([]byte("absent"))
	checkAbsent(t, e, d)
	if c, err := e.Open(t.Context(), d); !errors.Is(err, blob.ErrMissing) {
		if err == nil {
			c.Close()
		}
		t.Fatalf("Open of a missing key: err = %v; want blob.ErrMissing", err)
	}
	if err := e.Delete(t.Context(), d); !errors.Is(err, blob.ErrMissing) {
		t.Fatalf("Delete of a missing key: err = %v; want blob.ErrMissing", err)
	}
}

// testReadAt checks io.ReaderAt semantics at, across and past the end.
func (s *suite) testReadAt(t *testing.T) {
	e := s.engine(t)
	const size = 1000
	v := value(size, 7)
	d := put(t, e, v)
	c, err := e.Open(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer closeCursor(t, c)
	if c.Len() != size {
		t.Fatalf("Len = %d; want %d", c.Len(), size)
	}
	for _, tc := range []struct {
		off, len int64
		n        int
		eof      string // "yes", "no", "either"
	}{
		{0, 10, 10, "no"},
		{500, 100, 100, "no"},
		{990, 10, 10, "either"}, // ends exactly at Len: io.ReaderAt allows both
		{0, size, size, "either"},
		{995, 10, 5, "yes"}, // crosses Len
		{0, size + 1, size, "yes"},
		{size - 1, 1, 1, "either"},
		{size, 10, 0, "yes"}, // starts at Len
		{size + 1, 1, 0, "yes"},
		{1 << 40, 10, 0, "yes"}, // far past Len
	} {
		t.Run(fmt.Sprintf("off=%d,len=%d", tc.off, tc.len), func(t *testing.T) {
			p := make([]byte, tc.len)
			n, err := c.ReadAt(p, tc.off)
			if n != tc.n {
				t.Fatalf("n = %d (err %v); want %d", n, err, tc.n)
			}
			switch {
			case tc.eof == "yes" && err != io.EOF,
				tc.eof == "no" && err != nil,
				tc.eof == "either" && err != nil && err != io.EOF:
				t.Fatalf("err = %v; want io.EOF: %s", err, tc.eof)
			}
			if n > 0 && !bytes.Equal(p[:n], v[tc.off:tc.off+int64(n)]) {
				t.Fatalf("bytes at %d differ from the value", tc.off)
			}
		})
	}
	if n, err := c.ReadAt(make([]byte, 4), -1); err == nil || n != 0 {
		t.Fatalf("ReadAt at offset -1 = %d, %v; want 0 and an error", n, err)
	}
}

// testConcurrentReadAt: io.ReaderAt clients may call ReadAt in parallel on
// one source.
func (s *suite) testConcurrentReadAt(t *testing.T) {
	e := s.engine(t)
	v := value(256<<10, 11)
	d := put(t, e, v)
	c, err := e.Open(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer closeCursor(t, c)
	const workers, chunk = 8, 4096
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			p := make([]byte, chunk)
			for off := int64(w * chunk); off < int64(len(v)); off += workers * chunk {
				n, err := c.ReadAt(p, off)
				if n != chunk || (err != nil && err != io.EOF) || !bytes.Equal(p, v[off:off+chunk]) {
					errs <- fmt.Errorf("ReadAt(%d) = %d, %v or wrong bytes", off, n, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func (s *suite) testDelete(t *testing.T) {
	e := s.engine(t)
	v, other := value(300, 1), value(300, 2)
	d, od := put(t, e, v), put(t, e, other)
	if err := e.Delete(t.Context(), d); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	checkAbsent(t, e, d)
	if err := e.Delete(t.Context(), d); !errors.Is(err, blob.ErrMissing) {
		t.Fatalf("second Delete: err = %v; want blob.ErrMissing", err)
	}
	checkContent(t, e, od, other) // a neighbour is untouched
	put(t, e, v)                  // a deleted key can come back
	checkContent(t, e, d, v)
}

func (s *suite) testCursorSurvivesDelete(t *testing.T) {
	e := s.engine(t)
	if ds, ok := e.(engines.DeleteSafe); !ok || !ds.CursorsSurviveDelete() {
		t.Skipf("%s does not promise that cursors survive Delete", e.Name())
	}
	v := value(64<<10, 3)
	d := put(t, e, v)
	c, err := e.Open(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer closeCursor(t, c)
	if err := e.Delete(t.Context(), d); err != nil {
		t.Fatalf("Delete with an open cursor: %v", err)
	}
	checkAbsent(t, e, d)
	p := make([]byte, len(v)+1)
	n, err := c.ReadAt(p, 0)
	if n != len(v) || err != io.EOF || !bytes.Equal(p[:n], v) {
		t.Fatalf("ReadAt after Delete = %d, %v (equal %v); want %d, io.EOF and the value", n, err, bytes.Equal(p[:n], v), len(v))
	}
	if c.Len() != int64(len(v)) {
		t.Fatalf("Len after Delete = %d; want %d", c.Len(), len(v))
	}
}

// testConcurrentDistinct runs puts, reads and deletes of distinct keys from
// many goroutines; the race detector does most of the checking.
func (s *suite) testConcurrentDistinct(t *testing.T) {
	e := s.engine(t)
	const workers, each = 16, 8
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				v := value(100+w*each+i, uint64(w*each+i))
				d := blob.Sum(v)
				if err := tryPut(t, e, d, v); err != nil {
					errs <- err
					return
				}
				c, err := e.Open(t.Context(), d)
				if err != nil {
					errs <- err
					return
				}
				p := make([]byte, len(v))
				n, err := c.ReadAt(p, 0)
				c.Close()
				if n != len(v) || (err != nil && err != io.EOF) || !bytes.Equal(p, v) {
					errs <- fmt.Errorf("read back %s: %d, %v", d.Short(), n, err)
					return
				}
				if i%2 == 0 {
					if err := e.Delete(t.Context(), d); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	n := 0
	for _, err := range e.List(t.Context(), blob.Digest{}) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if want := workers * each / 2; n != want {
		t.Fatalf("listed %d entries after the workers; want %d", n, want)
	}
}
