package mem

import (
	"errors"
	"io"
)

// cursor reads a stored value. The value is immutable, so concurrent
// ReadAt calls need no lock.
type cursor struct {
	b []byte
}

func (c *cursor) Len() int64   { return int64(len(c.b)) }
func (c *cursor) Close() error { return nil }

func (c *cursor) ReadAt(p []byte, off int64) (int, error) {
	return readAt(c.b, p, off)
}

var errNegativeOffset = errors.New("negative offset")

// readAt is io.ReaderAt over b.
func readAt(b, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errNegativeOffset
	}
	if off >= int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
