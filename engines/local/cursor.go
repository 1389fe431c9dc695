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

// File implements engines.FileCursor. The cursor owns it.
func (c *cursor) File() engines.FileHandle { return c.f }

func (c *cursor) Close() error {
	if err := c.f.Close(); err != nil {
		return c.e.wrap("close", c.d, err)
	}
	return nil
}
