package store_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/mem"
	"github.com/alkblobfs/alkblobfs/store"
)

// syncKV is a mem kv engine that counts the syncs asked of it.
type syncKV struct {
	engines.KV
	syncs atomic.Int64
}

func (e *syncKV) Sync(ctx context.Context) error {
	e.syncs.Add(1)
	return nil
}

func openSyncStore(t *testing.T, every time.Duration) (*store.Store, *syncKV) {
	t.Helper()
	kv := &syncKV{KV: mem.New()}
	s, err := store.Open(t.Context(), store.Config{KV: kv, Large: mem.New(), SyncEvery: every})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, kv
}

// TestSyncAsksSyncers: Sync and Close sync the engine that needs it; Sync
// after Close is ErrClosed.
func TestSyncAsksSyncers(t *testing.T) {
	s, kv := openSyncStore(t, -1)
	if err := s.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := kv.syncs.Load(); n != 1 {
		t.Fatalf("%d syncs after Sync; want 1", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := kv.syncs.Load(); n != 2 {
		t.Fatalf("%d syncs after Close; want 2: Close syncs", n)
	}
	if err := s.Sync(t.Context()); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Sync after Close: %v; want ErrClosed", err)
	}
}

// TestSyncTimer: the store syncs every SyncEvery by itself, and stops at
// Close.
func TestSyncTimer(t *testing.T) {
	s, kv := openSyncStore(t, 10*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for kv.syncs.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d syncs in 5s with SyncEvery 10ms", kv.syncs.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	n := kv.syncs.Load()
	time.Sleep(50 * time.Millisecond)
	if m := kv.syncs.Load(); m != n {
		t.Fatalf("%d syncs after Close; the timer still runs", m-n)
	}
}

// TestSyncTimerOff: a negative SyncEvery leaves syncing to Sync and Close.
func TestSyncTimerOff(t *testing.T) {
	_, kv := openSyncStore(t, -1)
	time.Sleep(30 * time.Millisecond)
	if n := kv.syncs.Load(); n != 0 {
		t.Fatalf("%d syncs with the timer off", n)
	}
}

// TestSyncSQLite: Sync on the default layout, after puts to both tiers.
func TestSyncSQLite(t *testing.T) {
	s := openStore(t, layouts[2], t.TempDir())
	for _, n := range []int{100, 3 * threshold} {
		if _, pin, err := s.PutBytes(t.Context(), randBytes(n)); err != nil {
			t.Fatal(err)
		} else {
			pin.Release()
		}
	}
	if err := s.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
}
