package store_test

import (
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/meta"
)

// TestPinRowsLifecycle on the embedded default: the first pin of a digest
// writes one row and further pins none; a released row is dropped at the
// next renewal tick; Close deletes the instance's rows and stops its
// renewal goroutine.
func TestPinRowsLifecycle(t *testing.T) {
	before := runtime.NumGoroutine()
	dir := t.TempDir()
	s := openDurable(t, dir, 0, nil)
	host := s.KV().(meta.Holder).Meta().Host
	ctx := t.Context()
	rows := func() int64 {
		t.Helper()
		n, err := host.PinCount(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	d := blob.Sum([]byte("pinned"))
	p1, err := s.Pin(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := s.Pin(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if n := rows(); n != 1 {
		t.Fatalf("%d rows after two pins of one digest; want 1", n)
	}
	p1.Release()
	if err := s.GC().Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rows(); n != 1 {
		t.Fatalf("%d rows while a pin is still held; want 1", n)
	}
	p2.Release()
	if err := s.GC().Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rows(); n != 0 {
		t.Fatalf("%d rows after the last release and a tick; want 0", n)
	}
	if _, err := s.PinMany(ctx, []blob.Digest{d, blob.Sum([]byte("x")), d}); err != nil {
		t.Fatal(err)
	}
	if n := rows(); n != 2 {
		t.Fatalf("%d rows after PinMany of 2 digests; want 2", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	other, err := sqlite.Open(ctx, filepath.Join(dir, "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := other.Meta().Host.PinCount(ctx)
	other.Close()
	if err != nil || n != 0 {
		t.Fatalf("%d rows after Close (%v); want 0", n, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after Close, %d before Open: renewal leaked", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := s.Pin(ctx, d); err == nil {
		t.Fatal("Pin after Close succeeded")
	}
}
