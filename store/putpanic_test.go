package store_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/meta"
	"github.com/alkblobfs/alkblobfs/store"
)

// panickingKV is a SQLite engine whose joint put panics while panics is
// set, as meta.Batcher raises a job's panic again in its caller.
type panickingKV struct {
	*sqlite.Engine
	panics atomic.Bool
}

func (e *panickingKV) PutRows(ctx context.Context, d blob.Digest, value []byte, rows meta.Rows) (bool, error) {
	if e.panics.Load() {
		panic("PutRows panicked (test)")
	}
	return e.Engine.PutRows(ctx, d, value, rows)
}

// TestPutRowsPanicEndsPublish: a joint put whose kv engine panics ends
// its publish on the way out, so the collector's row lock and the
// digest's row claim are free again: the next put of the same digest
// writes its row, and Close returns.
func TestPutRowsPanicEndsPublish(t *testing.T) {
	dir := t.TempDir()
	db, large := sqliteKV(t, dir), localLarge(t, dir)
	kv := &panickingKV{Engine: db}
	s, err := store.Open(t.Context(), store.Config{KV: kv, Large: large, Threshold: threshold})
	if err != nil {
		t.Fatal(err)
	}
	b := []byte("a put whose kv engine panics once")
	kv.panics.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the put did not panic")
			}
		}()
		s.PutBytes(t.Context(), b)
	}()
	kv.panics.Store(false)
	done := make(chan error, 1)
	go func() {
		_, pin, err := s.PutBytes(t.Context(), b)
		if err != nil {
			done <- err
			return
		}
		pin.Release()
		done <- s.Close()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("30 s after a put that panicked, the next put of its digest and Close still wait: its publish was never ended")
	}
}
