package fusefs

import (
	"context"
	"iter"
	"slices"
	"sync"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/store"
)

// openRefs is the mount's liveness source: every digest with an open
// handle on this mount is live, counted per digest behind its own lock.
// Pins already protect open files in this process; the source states the
// same fact to the collector in the form that can leave the process
// (fleet mode turns sources into SQL).
type openRefs struct {
	mu sync.Mutex
	m  map[blob.Digest]int
}

func (c *openRefs) add(d blob.Digest) {
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[blob.Digest]int)
	}
	c.m[d]++
	c.mu.Unlock()
}

func (c *openRefs) drop(d blob.Digest) {
	c.mu.Lock()
	if c.m[d] <= 1 {
		delete(c.m, d)
	} else {
		c.m[d]--
	}
	c.mu.Unlock()
}

// len is the number of distinct digests open.
func (c *openRefs) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

func (c *openRefs) sorted() []blob.Digest {
	c.mu.Lock()
	ds := make([]blob.Digest, 0, len(c.m))
	for d := range c.m {
		ds = append(ds, d)
	}
	c.mu.Unlock()
	slices.SortFunc(ds, blob.Digest.Compare)
	return ds
}

var _ store.Source = (*openRefs)(nil)

func newOpenRefs() *openRefs { return &openRefs{} }

// IsLive implements store.Source.
func (o *openRefs) IsLive(ctx context.Context, d blob.Digest) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.m[d] > 0, nil
}

// Live implements store.Source: a sorted snapshot (open files are few).
func (o *openRefs) Live(ctx context.Context) iter.Seq2[blob.Digest, error] {
	ds := o.sorted()
	return func(yield func(blob.Digest, error) bool) {
		for _, d := range ds {
			if !yield(d, nil) {
				return
			}
		}
	}
}
