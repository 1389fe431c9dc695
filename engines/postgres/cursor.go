package postgres

import (
	"errors"
	"io"
)

// cursor reads a materialized value; it is immutable, so concurrent ReadAt
// calls need no lock.
type cursor struct {
	b []byte
}

func (c *cursor) Len() int64   { return int64(len(c.b)) }
func (c *cursor) Close() error { return nil }

func (c *cursor) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("negative offset")
	}
	if off >= int64(len(c.b)) {
		return 0, io.EOF
	}
	n := copy(p, c.b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
