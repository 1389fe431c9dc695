package gc

import (
	"sync"
	"sync/atomic"

	"github.com/alkblobfs/alkblobfs/blob"
)

// pins counts in-process references per digest. Its lock is the
// arbitration lock's read side: see Collector.
type pins struct {
	mu sync.Mutex
	n  map[blob.Digest]int
}

func (p *pins) add(d blob.Digest) {
	p.mu.Lock()
	if p.n == nil {
		p.n = make(map[blob.Digest]int)
	}
	p.n[d]++
	p.mu.Unlock()
}

func (p *pins) drop(d blob.Digest) {
	p.mu.Lock()
	switch c := p.n[d]; {
	case c > 1:
		p.n[d] = c - 1
	case c == 1:
		delete(p.n, d)
	}
	p.mu.Unlock()
}

func (p *pins) has(d blob.Digest) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[d] > 0
}

func (p *pins) count() (digests, refs int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.n {
		refs += c
	}
	return len(p.n), refs
}

// sorted returns the pinned digests in ascending order: a snapshot taken at
// mark time. Pins minted after it are caught by arbitration instead.
func (p *pins) sorted() []blob.Digest {
	p.mu.Lock()
	ds := make([]blob.Digest, 0, len(p.n))
	for d := range p.n {
		ds = append(ds, d)
	}
	p.mu.Unlock()
	sortDigests(ds)
	return ds
}

// Pin is one in-process reference that protects a digest from deletion.
// Release it exactly when the protection is no longer needed; Release is
// idempotent and safe for concurrent use.
type Pin struct {
	c        *Collector
	d        blob.Digest
	released atomic.Bool
}

// Digest is the pinned key.
func (p *Pin) Digest() blob.Digest { return p.d }

// Release drops the reference. Calls after the first do nothing. A nil Pin
// releases nothing, so error paths can release unconditionally.
func (p *Pin) Release() {
	if p == nil || !p.released.CompareAndSwap(false, true) {
		return
	}
	p.c.pins.drop(p.d)
}

// Clone mints a second, independent pin on the same digest (for handing a
// reference to another owner without transferring this one).
func (p *Pin) Clone() *Pin { return p.c.Pin(p.d) }

// ReleaseAll releases every pin in ps (nil entries allowed).
func ReleaseAll(ps []*Pin) {
	for _, p := range ps {
		p.Release()
	}
}
