package enginetest

import (
	"io"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// Reopen checks durability across a close: a value put and (for a
// WindowHost) a staged window row are there, unchanged, when the engine is
// opened again on the same storage. reopen opens the same storage on every
// call.
func Reopen(t *testing.T, reopen func(t *testing.T) engines.Engine) {
	ctx := t.Context()
	e := reopen(t)
	v := []byte("durable")
	d := put(t, e, v)
	w, later := blob.Sum([]byte("window")), blob.Sum([]byte("window, later"))
	_, isWindow := e.(engines.WindowHost)
	if isWindow {
		if err := e.(engines.WindowHost).WindowQueue(ctx, []blob.Digest{w}, 0); err != nil {
			t.Fatal(err)
		}
		if err := e.(engines.WindowHost).WindowQueue(ctx, []blob.Digest{later}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	e = reopen(t)
	defer e.Close()
	if n, err := e.Size(ctx, d); n != int64(len(v)) || err != nil {
		t.Fatalf("Size after reopen = %d, %v; want %d", n, err, len(v))
	}
	c, err := e.Open(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, len(v))
	if n, err := c.ReadAt(p, 0); n != len(v) || (err != nil && err != io.EOF) || string(p) != string(v) {
		t.Fatalf("ReadAt after reopen = %d, %v, %q", n, err, p)
	}
	c.Close()
	if isWindow {
		// Both rows are there, and each keeps its time: the due one is
		// due, the other is not.
		ds, err := e.(engines.WindowHost).WindowDue(ctx, blob.Digest{}, 10)
		if err != nil || len(ds) != 1 || ds[0] != w {
			t.Fatalf("WindowDue after reopen = %v, %v; want the due row alone", ds, err)
		}
		if n, err := e.(engines.WindowHost).WindowLen(ctx); n != 2 || err != nil {
			t.Fatalf("WindowLen after reopen = %d, %v; want both rows", n, err)
		}
	}
}
