package metatest

import (
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// Reopen checks that the window's rows survive a close: two rows staged
// are there when the engine is opened again on the same storage, each
// with its time (the due one is due, the other is not). reopen opens the
// same storage on every call. The blobs' own durability is
// enginetest.Reopen's.
func Reopen(t *testing.T, reopen func(t *testing.T) engines.Engine) {
	ctx := t.Context()
	e := reopen(t)
	w := state(t, e).Window
	if w == nil {
		e.Close()
		t.Fatalf("%s keeps no meta.Window", e.Name())
	}
	due, later := blob.Sum([]byte("window")), blob.Sum([]byte("window, later"))
	if err := w.WindowQueue(ctx, []blob.Digest{due}, 0); err != nil {
		t.Fatal(err)
	}
	if err := w.WindowQueue(ctx, []blob.Digest{later}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	e = reopen(t)
	defer e.Close()
	w = state(t, e).Window
	ds, err := w.WindowDue(ctx, blob.Digest{}, 10)
	if err != nil || len(ds) != 1 || ds[0] != due {
		t.Fatalf("WindowDue after reopen = %v, %v; want the due row alone", ds, err)
	}
	if n, err := w.WindowLen(ctx); n != 2 || err != nil {
		t.Fatalf("WindowLen after reopen = %d, %v; want both rows", n, err)
	}
	if err := w.WindowRemove(ctx, []blob.Digest{due, later}); err != nil {
		t.Fatal(err)
	}
}
