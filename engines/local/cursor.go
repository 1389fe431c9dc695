package local

import (
	"errors"
	"io"
	"os"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

var _ engines.FileCursor = (*cursor)(nil)

// cursor reads a committed (immutable) blob file with pread, so
// concurrent ReadAt calls are safe and the descriptor's offset is never
// used.
type cursor struct {
	e    *Engine
	d    blob.Digest
	f    *os.File
	size int64
}

func (c *cursor) Len() int64 { return c.size }

func (c *cursor) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.f.ReadAt(p, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return n, c.e.wrap("read", c.d, err)
	}
	return n, err
}

// SeekData returns the first region of data at or after off, [start,
// end), or io.EOF when only a hole follows (see stage.SeekData): an
// upload seeded with a sparse blob keeps its holes. It moves the
// descriptor's offset, which nothing else uses.
func (c *cursor) SeekData(off int64) (start, end int64, err error) {
	start, end, err = seekData(c.f, off)
	if err != nil && err != io.EOF {
		err = c.e.wrap("seek", c.d, err)
	}
	return start, end, err
}

// File implements engines.FileCursor. The cursor owns it.
func (c *cursor) File() engines.FileHandle { return c.f }

func (c *cursor) Close() error {
	if err := c.f.Close(); err != nil {
		return c.e.wrap("close", c.d, err)
	}
	return nil
}
