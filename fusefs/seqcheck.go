package fusefs

import (
	"crypto/sha256"
	"fmt"
	"hash"
	"sync"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/store"
)

// seqCheck is --verify=strict's end-to-end check: it hashes what one
// handle reads, in offset order, and when the reads have covered the blob
// from 0 to its end it compares the sha256 with the digest, so that a
// program reading the whole blob gets EIO before it can see EOF on wrong
// content, even if every chunk passed its CRC.
//
// The kernel sends readahead in parallel requests that may arrive out of
// order, so reads past the next offset wait in a bounded reorder buffer.
// A handle that seeks (or outruns the buffer) stops the check; its reads
// stay chunk-verified.
type seqCheck struct {
	d    blob.Digest
	size int64

	mu      sync.Mutex
	h       hash.Hash // nil: stopped (a seek) or done
	next    int64     // offset hashed up to
	ahead   map[int64][]byte
	aheadN  int
	failure error // sticky: the blob did not hash to d
}

// seqAheadMax bounds the reorder buffer, and how far past the hashed
// bytes a read may land and still be buffered: above the kernel's window
// of parallel readahead requests. A read further ahead (a seek) stops
// the check.
const seqAheadMax = 8 << 20

func newSeqCheck(d blob.Digest, size int64) *seqCheck {
	c := &seqCheck{d: d, size: size, h: sha256.New()}
	if size == 0 {
		c.finish()
	}
	return c
}

// add accounts for p read at off. It returns an error wrapping
// ErrVerification once the hashed content is complete and wrong, and for
// every read after that.
func (c *seqCheck) add(p []byte, off int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failure != nil {
		return c.failure
	}
	if c.h == nil || len(p) == 0 {
		return nil
	}
	switch {
	case off == c.next:
		c.h.Write(p)
		c.next += int64(len(p))
		for {
			q, ok := c.ahead[c.next]
			if !ok {
				break
			}
			delete(c.ahead, c.next)
			c.aheadN -= len(q)
			c.h.Write(q)
			c.next += int64(len(q))
		}
	case off > c.next && off-c.next <= seqAheadMax && c.aheadN+len(p) <= seqAheadMax:
		if _, dup := c.ahead[off]; !dup {
			if c.ahead == nil {
				c.ahead = make(map[int64][]byte)
			}
			c.ahead[off] = append([]byte(nil), p...)
			c.aheadN += len(p)
		}
		return nil
	case off+int64(len(p)) <= c.next:
		return nil // a re-read of hashed bytes
	default:
		c.stop()
		return nil
	}
	if c.next >= c.size {
		c.finish()
	}
	return c.failure
}

func (c *seqCheck) finish() {
	var got store.Digest
	c.h.Sum(got[:0])
	if got != c.d {
		c.failure = fmt.Errorf("%w: the blob read from 0 to its end hashes to %s", blob.ErrVerification, got)
	}
	c.stop()
}

func (c *seqCheck) stop() {
	c.h, c.ahead, c.aheadN = nil, nil, 0
}
