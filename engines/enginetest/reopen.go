package enginetest

import (
	"io"
	"testing"

	"github.com/alkblobfs/alkblobfs/engines"
)

// Reopen checks durability across a close: a value put is there,
// unchanged, when the engine is opened again on the same storage. reopen
// opens the same storage on every call. (The shared state's rows, the
// window's, are metatest.Reopen's.)
func Reopen(t *testing.T, reopen func(t *testing.T) engines.Engine) {
	ctx := t.Context()
	e := reopen(t)
	v := []byte("durable")
	d := put(t, e, v)
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
}
