package pglo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// readTimeout bounds one lo_get of at most 8 windows (4 MiB).
const readTimeout = time.Minute

// cursor reads one blob by lo_get windows. It holds no connection between
// reads; its Len comes from the companion row read at Open.
type cursor struct {
	e    *Engine
	d    blob.Digest
	oid  uint32
	size int64

	mu     sync.Mutex
	winOff int64  // offset of win in the blob
	win    []byte // the last window read, nil before the first
}

func (c *cursor) Len() int64 { return c.size }

func (c *cursor) Close() error {
	c.mu.Lock()
	c.win = nil
	c.mu.Unlock()
	return nil
}

// ReadAt implements io.ReaderAt. Reads of a window or more go straight into
// p; smaller ones are served from the cached window around off.
func (c *cursor) ReadAt(p []byte, off int64) (int, error) {
	n, err := engines.ReadAtSized(p, off, c.size, c.read)
	if err != nil && err != io.EOF {
		err = c.e.wrap("read", c.d, missingObject(err))
	}
	return n, err
}

// read fills a prefix of p (at least one byte) from off < size.
func (c *cursor) read(p []byte, off int64) (int, error) {
	if len(p) >= window {
		return c.get(p[:min(len(p), 8*window)], off)
	}
	c.mu.Lock()
	if c.win != nil && off >= c.winOff && off < c.winOff+int64(len(c.win)) {
		n := copy(p, c.win[off-c.winOff:])
		c.mu.Unlock()
		return n, nil
	}
	c.mu.Unlock()
	start := off - off%window
	buf := make([]byte, min(window, c.size-start))
	if _, err := c.get(buf, start); err != nil {
		return 0, err
	}
	c.mu.Lock()
	c.win, c.winOff = buf, start
	c.mu.Unlock()
	return copy(p, buf[off-start:]), nil
}

// get reads exactly len(p) bytes at off with one lo_get; the range is
// within the blob.
func (c *cursor) get(p []byte, off int64) (int, error) {
	// io.ReaderAt has no context, and the Open that made the cursor may be
	// long over: a deadline keeps a dead server from hanging a reader.
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	rows, err := c.e.pool.Query(ctx, `SELECT lo_get($1, $2, $3)`, c.oid, off, len(p))
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return 0, err
		}
		return 0, errors.New("lo_get returned no row")
	}
	var n int
	if rows.FieldDescriptions()[0].Format == pgx.BinaryFormatCode {
		// Binary bytea is the bytes themselves: copy from the wire
		// buffer, no allocation.
		n = copy(p, rows.RawValues()[0])
	} else {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return 0, err
		}
		n = copy(p, b)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if n != len(p) {
		// The object is shorter than its companion row says.
		return n, fmt.Errorf("large object %d: %d bytes at %d, want %d: object shorter than its recorded size %d", c.oid, n, off, len(p), c.size)
	}
	return n, nil
}
