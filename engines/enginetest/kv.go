package enginetest

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

func (s *suite) testKV(t *testing.T) {
	t.Run("Dedup", s.testKVDedup)
	t.Run("NilValue", s.testKVNilValue)
	t.Run("ConcurrentSameDigest", s.testKVConcurrentSameDigest)
}

func (s *suite) testKVDedup(t *testing.T) {
	e := s.engine(t).(engines.KV)
	ctx := t.Context()
	v := value(500, 1)
	d := put(t, e, v)
	if ins, err := e.Put(ctx, d, v); ins || err != nil {
		t.Fatalf("re-Put = %v, %v; want false, nil", ins, err)
	}
	// Insert-or-ignore, not insert-or-replace: different bytes under a
	// present digest change nothing. (The store never does this; the
	// engine must not care.)
	if ins, err := e.Put(ctx, d, value(900, 2)); ins || err != nil {
		t.Fatalf("Put of other bytes under a present digest = %v, %v; want false, nil", ins, err)
	}
	checkContent(t, e, d, v)
}

func (s *suite) testKVNilValue(t *testing.T) {
	e := s.engine(t).(engines.KV)
	d := blob.Sum(nil)
	if ins, err := e.Put(t.Context(), d, nil); !ins || err != nil {
		t.Fatalf("Put(nil) = %v, %v; want true, nil", ins, err)
	}
	checkContent(t, e, d, nil)
}

func (s *suite) testKVConcurrentSameDigest(t *testing.T) {
	e := s.engine(t).(engines.KV)
	v := value(2000, 5)
	d := blob.Sum(v)
	const workers = 16
	var inserted atomic.Int32
	errs := make(chan error, workers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			<-start
			ins, err := e.Put(t.Context(), d, v)
			if err != nil {
				errs <- err
			}
			if ins {
				inserted.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("racing Put: %v", err)
	}
	if n := inserted.Load(); n != 1 {
		t.Fatalf("%d of %d racing Puts reported inserted; want exactly 1", n, workers)
	}
	checkContent(t, e, d, v)
	checkOnly(t, e, d)
}
