package cache_test

import (
	"errors"
	"io"
	"strings"
	"syscall"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/cache"
)

// faultCursor serves b, then, from offset at, fails with err (nil: the
// bytes end there).
type faultCursor struct {
	b   []byte
	at  int
	err error
}

func (c faultCursor) Len() int64   { return int64(len(c.b)) }
func (c faultCursor) Close() error { return nil }
func (c faultCursor) ReadAt(p []byte, off int64) (int, error) {
	if int(off) >= c.at {
		return 0, c.err
	}
	n := copy(p, c.b[off:c.at])
	if n < len(p) {
		return n, c.err
	}
	return n, nil
}

// TestWarmCheckDamagedOnly: Warm drops a cached copy only when its bytes
// are wrong (a hash or size mismatch): a read error (a transient EIO)
// says nothing of them, and the copy is kept.
func TestWarmCheckDamagedOnly(t *testing.T) {
	b := randBytes(3<<20, 9)
	d := blob.Sum(b)
	if err := cache.CheckWhole(faultCursor{b, len(b), nil}, d); err != nil {
		t.Fatalf("intact copy: %v", err)
	}
	eio := cache.CheckWhole(faultCursor{b, 1 << 20, syscall.EIO}, d)
	if !errors.Is(eio, syscall.EIO) || errors.Is(eio, cache.ErrDamaged) {
		t.Fatalf("a read error: %v; want EIO, not damage", eio)
	}
	for _, end := range []error{nil, io.EOF} {
		err := cache.CheckWhole(faultCursor{b, 1 << 20, end}, d)
		if !errors.Is(err, cache.ErrDamaged) || strings.Contains(err.Error(), "%!") {
			t.Fatalf("a copy ending early (%v): %q; want damage, well formatted", end, err)
		}
	}
	bad := append([]byte(nil), b...)
	bad[100] ^= 1
	if err := cache.CheckWhole(faultCursor{bad, len(bad), nil}, d); !errors.Is(err, cache.ErrDamaged) {
		t.Fatalf("wrong bytes: %v; want damage", err)
	}
}
