package s3

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

const (
	// minWindow is what one ranged GET fetches for a small read out of
	// sequence; each sequential read that reaches a window's second half
	// starts fetching the next window, twice as large, up to maxWindow. So
	// a sequential reader has at most two windows (32 MiB) and one GET
	// ahead of it, and a random one a 1 MiB GET per miss.
	minWindow = 1 << 20
	maxWindow = 16 << 20
	// maxDirect caps one GET straight into a caller's large buffer.
	maxDirect = 32 << 20
	// bodyAttempts bounds the GETs of one range whose body failed midway
	// (a reset connection): the client retries failed requests itself,
	// not a body that breaks after the response began.
	bodyAttempts = 3
)

// window is one ranged GET's bytes, or the GET in flight.
type window struct {
	off  int64
	n    int
	done chan struct{} // closed when buf or err is set
	buf  []byte        // n bytes at off; read only after done
	err  error
}

func (w *window) has(off int64) bool { return off >= w.off && off < w.off+int64(w.n) }

// failed reports whether the window's GET ended in an error.
func (w *window) failed() bool {
	select {
	case <-w.done:
		return w.err != nil
	default:
		return false
	}
}

// cursor reads one blob by ranged GETs. It holds no connection between
// reads; Len is the HEAD's at Open. After a Delete of its blob, its next
// GET fails with an error wrapping blob.ErrMissing.
type cursor struct {
	e    *Engine
	d    blob.Digest
	key  string
	size int64

	// ctx bounds every GET of the cursor; Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	wins    []*window // at most 2 kept, oldest first
	lastEnd int64     // where the last small read ended
	span    int       // the next window's size
}

func newCursor(e *Engine, d blob.Digest, key string, size int64) *cursor {
	ctx, cancel := context.WithCancel(context.Background())
	return &cursor{e: e, d: d, key: key, size: size, ctx: ctx, cancel: cancel, lastEnd: -1, span: minWindow}
}

func (c *cursor) Len() int64 { return c.size }

func (c *cursor) Close() error {
	c.cancel()
	c.mu.Lock()
	c.wins = nil
	c.mu.Unlock()
	return nil
}

// ReadAt implements io.ReaderAt. Reads of a window or more go straight into
// p; smaller ones are served from windows.
func (c *cursor) ReadAt(p []byte, off int64) (int, error) {
	n, err := engines.ReadAtSized(p, off, c.size, c.read)
	if err != nil && err != io.EOF {
		err = c.e.wrap("read", c.d, err)
	}
	return n, err
}

// read fills a prefix of p (at least one byte) from off < size.
func (c *cursor) read(p []byte, off int64) (int, error) {
	if len(p) >= maxWindow {
		return c.get(p[:min(len(p), maxDirect)], off)
	}
	c.mu.Lock()
	seq := off == c.lastEnd
	w := c.find(off)
	if w == nil {
		if !seq {
			c.span = minWindow
		}
		w = c.start(off)
	}
	c.mu.Unlock()

	select {
	case <-w.done:
	case <-c.ctx.Done():
		return 0, c.ctx.Err()
	}
	if w.err != nil {
		c.mu.Lock()
		c.drop(w)
		c.mu.Unlock()
		return 0, w.err
	}
	n := copy(p, w.buf[off-w.off:])
	end := off + int64(n)

	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastEnd = end
	// A sequential read into the window's second half: fetch the next one.
	next := w.off + int64(w.n)
	if seq && end-w.off > int64(w.n)/2 && next < c.size && c.find(next) == nil {
		c.span = min(2*c.span, maxWindow)
		c.start(next)
	}
	return n, nil
}

// find returns the window holding off or fetching it; c.mu is held.
func (c *cursor) find(off int64) *window {
	for _, w := range c.wins {
		if w.has(off) && !w.failed() {
			return w
		}
	}
	return nil
}

// start begins fetching a window at off in the background, evicting the
// oldest settled one past two; c.mu is held.
func (c *cursor) start(off int64) *window {
	n := int(min(int64(c.span), c.size-off))
	w := &window{off: off, n: n, done: make(chan struct{})}
	if len(c.wins) >= 2 {
		for i, old := range c.wins {
			select {
			case <-old.done:
				c.wins = append(c.wins[:i], c.wins[i+1:]...)
			default:
				continue
			}
			break
		}
	}
	c.wins = append(c.wins, w)
	go func() {
		b := make([]byte, n)
		_, w.err = c.get(b, off)
		w.buf = b
		close(w.done)
	}()
	return w
}

// drop forgets a failed window, so that the next read tries again.
func (c *cursor) drop(w *window) {
	for i, x := range c.wins {
		if x == w {
			c.wins = append(c.wins[:i], c.wins[i+1:]...)
			return
		}
	}
}

// get reads exactly len(p) bytes at off, within the blob, with a ranged
// GET, again if its body breaks midway (at most bodyAttempts in all).
func (c *cursor) get(p []byte, off int64) (int, error) {
	var err error
	for attempt := range bodyAttempts {
		if attempt > 0 {
			select {
			case <-time.After(time.Duration(100<<attempt) * time.Millisecond):
			case <-c.ctx.Done():
				return 0, c.ctx.Err()
			}
		}
		var retry bool
		retry, err = c.getOnce(p, off)
		if err == nil {
			return len(p), nil
		}
		if !retry {
			break
		}
	}
	return 0, err
}

func (c *cursor) getOnce(p []byte, off int64) (retry bool, err error) {
	ctx, cancel := context.WithTimeout(c.ctx, dataTimeout)
	defer cancel()
	var opts minio.GetObjectOptions
	opts.SetRange(off, off+int64(len(p))-1)
	req := fmt.Sprintf("GET [%d,%d) of", off, off+int64(len(p)))
	body, _, _, err := c.e.core.GetObject(ctx, c.e.cfg.Bucket, c.key, opts)
	if err != nil {
		return false, c.e.reqErr(req, c.key, err) // the client retried
	}
	defer body.Close()
	if n, err := io.ReadFull(body, p); err != nil {
		// A short body is a broken connection, or an object shorter than
		// the size Open saw (replaced under the cursor).
		return ctx.Err() == nil, fmt.Errorf("%s %s: %d of %d bytes (size at open %d): %w", req, c.key, n, len(p), c.size, err)
	}
	return false, nil
}
