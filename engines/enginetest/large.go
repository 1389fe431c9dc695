package enginetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

func (s *suite) testLarge(t *testing.T) {
	t.Run("StreamCommit", s.testStreamCommit)
	t.Run("EmptyCommit", s.testEmptyCommit)
	t.Run("DiscardBeforeCommit", s.testDiscardBeforeCommit)
	t.Run("DiscardTwice", s.testDiscardTwice)
	t.Run("DiscardAfterCommit", s.testDiscardAfterCommit)
	t.Run("CommitExisting", s.testCommitExisting)
	t.Run("AbandonedWriter", s.testAbandonedWriter)
	t.Run("CommitCanceled", s.testCommitCanceled)
	t.Run("UseAfterEnd", s.testUseAfterEnd)
	t.Run("ConcurrentSameDigest", s.testStageConcurrentSameDigest)
	t.Run("RandomStage", s.testRandomStage)
}

func (s *suite) large(t *testing.T) engines.Large {
	return s.engine(t).(engines.Large)
}

// checkResidue asserts the exact number of stage leftovers.
func checkResidue(t *testing.T, e engines.Engine, want int) {
	t.Helper()
	n, err := e.(engines.ResidueCounter).StageResidue(t.Context())
	if err != nil {
		t.Fatalf("StageResidue: %v", err)
	}
	if n != want {
		t.Fatalf("StageResidue = %d; want exactly %d", n, want)
	}
}

// stage opens a stage holding v and checks it is counted as residue.
func stage(t *testing.T, e engines.Large, v []byte) engines.Stage {
	t.Helper()
	st, err := e.Stage(t.Context())
	if err != nil {
		t.Fatalf("Stage: %v", err)
	}
	t.Cleanup(func() { st.Discard() })
	if n, err := st.Write(v); n != len(v) || err != nil {
		t.Fatalf("stage Write = %d, %v; want %d, nil", n, err, len(v))
	}
	return st
}

func discard(t *testing.T, st engines.Stage) {
	t.Helper()
	if err := st.Discard(); err != nil {
		t.Fatalf("Discard: %v", err)
	}
}

func (s *suite) testStreamCommit(t *testing.T) {
	e := s.large(t)
	v := value(3<<20+123, 9)
	d := blob.Sum(v)
	st, err := e.Stage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Discard()
	for off := 0; off < len(v); off += 64 << 10 {
		if _, err := st.Write(v[off:min(off+64<<10, len(v))]); err != nil {
			t.Fatalf("Write at %d: %v", off, err)
		}
	}
	checkResidue(t, e, 1) // the counter sees a live stage
	checkAbsent(t, e, d)  // nothing visible before Commit
	if err := st.Commit(t.Context(), d); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	checkResidue(t, e, 0)
	checkContent(t, e, d, v)
}

func (s *suite) testEmptyCommit(t *testing.T) {
	e := s.large(t)
	st := stage(t, e, nil)
	d := blob.Sum(nil)
	if err := st.Commit(t.Context(), d); err != nil {
		t.Fatalf("Commit of an empty stage: %v", err)
	}
	checkResidue(t, e, 0)
	checkContent(t, e, d, nil)
}

func (s *suite) testDiscardBeforeCommit(t *testing.T) {
	e := s.large(t)
	v := value(10000, 1)
	st := stage(t, e, v)
	checkResidue(t, e, 1)
	discard(t, st)
	checkResidue(t, e, 0)
	checkAbsent(t, e, blob.Sum(v))
	checkOnly(t, e)
}

func (s *suite) testDiscardTwice(t *testing.T) {
	e := s.large(t)
	st := stage(t, e, value(100, 1))
	discard(t, st)
	discard(t, st)
	checkResidue(t, e, 0)
	checkOnly(t, e)
}

func (s *suite) testDiscardAfterCommit(t *testing.T) {
	e := s.large(t)
	v := value(100, 1)
	d := blob.Sum(v)
	st := stage(t, e, v)
	if err := st.Commit(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	discard(t, st) // the deferred Discard of every caller: a no-op
	discard(t, st)
	checkResidue(t, e, 0)
	checkContent(t, e, d, v)
}

func (s *suite) testCommitExisting(t *testing.T) {
	e := s.large(t)
	v := value(4000, 1)
	d := put(t, e, v)
	// Same bytes: the common dedup.
	st := stage(t, e, v)
	if err := st.Commit(t.Context(), d); err != nil {
		t.Fatalf("dedup Commit: %v", err)
	}
	checkResidue(t, e, 0)
	// Other bytes under a present digest: dropped, never replacing what is
	// there (a reader may have the entry open).
	st = stage(t, e, value(5000, 2))
	if err := st.Commit(t.Context(), d); err != nil {
		t.Fatalf("dedup Commit of other bytes: %v", err)
	}
	checkResidue(t, e, 0)
	discard(t, st)
	checkResidue(t, e, 0)
	checkContent(t, e, d, v)
	checkOnly(t, e, d)
}

// testAbandonedWriter: the source fails halfway; the caller discards.
func (s *suite) testAbandonedWriter(t *testing.T) {
	e := s.large(t)
	st, err := e.Stage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	v := value(200<<10, 4)
	src := io.MultiReader(bytes.NewReader(v[:100<<10]), errReader{})
	if _, err := io.Copy(st, src); !errors.Is(err, errSource) {
		t.Fatalf("io.Copy from a failing source: err = %v; want the source's error", err)
	}
	checkResidue(t, e, 1)
	discard(t, st)
	checkResidue(t, e, 0)
	checkOnly(t, e)
}

var errSource = errors.New("source failed")

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errSource }

// testCommitCanceled: a Commit may fail (here: its context is canceled).
// Either it fails and nothing is visible, or it succeeds; either way the
// stage is over and leaves nothing behind, before any Discard.
func (s *suite) testCommitCanceled(t *testing.T) {
	e := s.large(t)
	v := value(50000, 5)
	d := blob.Sum(v)
	st := stage(t, e, v)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := st.Commit(ctx, d)
	checkResidue(t, e, 0)
	if err != nil {
		checkAbsent(t, e, d)
		checkOnly(t, e)
	} else {
		checkContent(t, e, d, v)
	}
	discard(t, st)
	checkResidue(t, e, 0)
}

func (s *suite) testUseAfterEnd(t *testing.T) {
	e := s.large(t)
	v := value(100, 6)
	d := blob.Sum(v)

	st := stage(t, e, v)
	discard(t, st)
	if _, err := st.Write([]byte("x")); err == nil {
		t.Fatal("Write after Discard succeeded")
	}
	if err := st.Commit(t.Context(), d); err == nil {
		t.Fatal("Commit after Discard succeeded")
	}
	checkAbsent(t, e, d)
	checkResidue(t, e, 0)

	st = stage(t, e, v)
	if err := st.Commit(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("x")); err == nil {
		t.Fatal("Write after Commit succeeded")
	}
	if rs, ok := st.(engines.RandomStage); ok {
		if _, err := rs.WriteAt([]byte("x"), 0); err == nil {
			t.Fatal("WriteAt after Commit succeeded")
		}
		if err := rs.Truncate(0); err == nil {
			t.Fatal("Truncate after Commit succeeded")
		}
	}
	checkContent(t, e, d, v)
	checkResidue(t, e, 0)
}

func (s *suite) testStageConcurrentSameDigest(t *testing.T) {
	e := s.large(t)
	v := value(300<<10, 8)
	d := blob.Sum(v)
	const workers = 16
	errs := make(chan error, workers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			st, err := e.Stage(t.Context())
			if err != nil {
				errs <- err
				return
			}
			defer st.Discard()
			if _, err := st.Write(v); err != nil {
				errs <- err
				return
			}
			<-start
			if err := st.Commit(t.Context(), d); err != nil {
				errs <- fmt.Errorf("worker %d: Commit: %w", w, err)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("racing stage: %v", err)
	}
	checkResidue(t, e, 0)
	checkContent(t, e, d, v)
	checkOnly(t, e, d)
}

// testRandomStage drives a RandomStage and a byte-slice model side by side.
func (s *suite) testRandomStage(t *testing.T) {
	e := s.large(t)
	st, err := e.Stage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Discard()
	rs, ok := st.(engines.RandomStage)
	if !ok {
		t.Skipf("%s stages are not engines.RandomStage", e.Name())
	}
	var model []byte
	var modelOff int
	grow := func(n int) {
		if n > len(model) {
			model = append(model, make([]byte, n-len(model))...)
		}
	}
	check := func(step string) {
		t.Helper()
		size, err := rs.Size()
		if err != nil || size != int64(len(model)) {
			t.Fatalf("%s: Size = %d, %v; want %d", step, size, err, len(model))
		}
		p := make([]byte, len(model)+10)
		n, err := rs.ReadAt(p, 0)
		if n != len(model) || err != io.EOF || !bytes.Equal(p[:n], model) {
			t.Fatalf("%s: ReadAt(0) = %d, %v, equal=%v; want %d, io.EOF, the model", step, n, err, bytes.Equal(p[:n], model), len(model))
		}
	}
	writeAt := func(b []byte, off int) {
		t.Helper()
		if n, err := rs.WriteAt(b, int64(off)); n != len(b) || err != nil {
			t.Fatalf("WriteAt(%d bytes, %d) = %d, %v", len(b), off, n, err)
		}
		grow(off + len(b))
		copy(model[off:], b)
		check(fmt.Sprintf("WriteAt %d", off))
	}
	write := func(b []byte) {
		t.Helper()
		if n, err := rs.Write(b); n != len(b) || err != nil {
			t.Fatalf("Write(%d bytes) = %d, %v", len(b), n, err)
		}
		grow(modelOff + len(b))
		copy(model[modelOff:], b)
		modelOff += len(b)
		check("Write")
	}
	truncate := func(n int) {
		t.Helper()
		if err := rs.Truncate(int64(n)); err != nil {
			t.Fatalf("Truncate(%d): %v", n, err)
		}
		if n < len(model) {
			model = model[:n:n]
		}
		grow(n)
		check(fmt.Sprintf("Truncate %d", n))
	}

	check("empty")
	writeAt([]byte("world"), 10) // a hole of 10 zero bytes before it
	write([]byte("hello"))       // Write has its own offset, like a file's
	truncate(12)                 // cuts "world" to "wo"
	truncate(20)                 // grows with zeros; "rld" must not come back
	write([]byte("!"))
	writeAt(value(3000, 1), 1<<20) // a wide sparse hole
	writeAt(value(100, 2), 1<<20-50)
	truncate(1<<20 + 1000)

	// Reads at and past the end follow io.ReaderAt.
	p := make([]byte, 10)
	if n, err := rs.ReadAt(p, int64(len(model))-4); n != 4 || err != io.EOF {
		t.Fatalf("ReadAt across the end = %d, %v; want 4, io.EOF", n, err)
	}
	if n, err := rs.ReadAt(p, int64(len(model))+4); n != 0 || err != io.EOF {
		t.Fatalf("ReadAt past the end = %d, %v; want 0, io.EOF", n, err)
	}
	if _, err := rs.WriteAt([]byte("x"), -1); err == nil {
		t.Fatal("WriteAt(-1) succeeded")
	}
	if err := rs.Truncate(-1); err == nil {
		t.Fatal("Truncate(-1) succeeded")
	}
	check("after bad input")

	d := blob.Sum(model)
	if err := rs.Commit(t.Context(), d); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	checkResidue(t, e, 0)
	checkContent(t, e, d, model)
}
