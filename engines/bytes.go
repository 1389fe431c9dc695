package engines

import (
	"errors"
	"io"
)

// BytesCursor is a Cursor over a value held in memory: what every kv
// engine's Open returns, since kv values are read whole. The bytes are
// immutable, so concurrent ReadAt calls need no lock.
type BytesCursor []byte

var errNegativeOffset = errors.New("negative offset")

func (b BytesCursor) Len() int64   { return int64(len(b)) }
func (b BytesCursor) Close() error { return nil }

// ReadAt follows io.ReaderAt.
func (b BytesCursor) ReadAt(p []byte, off int64) (int, error) {
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
