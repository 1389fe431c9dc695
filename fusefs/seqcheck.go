package fusefs

import (
	"crypto/sha256"
	"encoding"
	"fmt"
	"hash"
	"maps"
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
	failure error       // sticky: the blob did not hash to d
	got     blob.Digest // what it hashed to, when failure
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
		c.fail(got)
	}
	c.stop()
}

// fail records that the blob read from 0 to its end hashed to got.
func (c *seqCheck) fail(got blob.Digest) {
	c.got = got
	c.failure = fmt.Errorf("%w: the blob read from 0 to its end hashes to %s", blob.ErrVerification, got)
}

func (c *seqCheck) stop() {
	c.h, c.ahead, c.aheadN = nil, nil, 0
}

// seqState is a seqCheck carried across an upgrade (handover.go), so
// that a strict reader whose reads span the handover is still checked
// whole at its end: the sha256 state of the bytes hashed so far (its
// MarshalBinary), the reads buffered ahead, and a failure already found.
type seqState struct {
	Next    int64
	Hash    []byte           `json:",omitempty"` // nil: stopped (a seek) or done
	Ahead   map[int64][]byte `json:",omitempty"`
	Failure string           `json:",omitempty"` // the digest it hashed to, in hex
}

// export is the check's state, for a successor.
func (c *seqCheck) export() (seqState, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := seqState{Next: c.next, Ahead: maps.Clone(c.ahead)}
	if c.failure != nil {
		st.Failure = c.got.String()
	}
	if c.h != nil {
		m, ok := c.h.(encoding.BinaryMarshaler)
		if !ok {
			return seqState{}, fmt.Errorf("a %T cannot be carried", c.h)
		}
		b, err := m.MarshalBinary()
		if err != nil {
			return seqState{}, err
		}
		st.Hash = b
	}
	return st, nil
}

// restoreSeqCheck is export's inverse, for the blob d of size bytes.
func restoreSeqCheck(d blob.Digest, size int64, st seqState) (*seqCheck, error) {
	c := &seqCheck{d: d, size: size, next: st.Next, ahead: st.Ahead}
	for _, p := range st.Ahead {
		c.aheadN += len(p)
	}
	if st.Failure != "" {
		got, err := blob.Parse(st.Failure)
		if err != nil {
			return nil, fmt.Errorf("strict check: %w", err)
		}
		c.fail(got)
		return c, nil
	}
	if st.Hash != nil {
		h := sha256.New()
		if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(st.Hash); err != nil {
			return nil, fmt.Errorf("strict check: %w", err)
		}
		c.h = h
	}
	return c, nil
}
