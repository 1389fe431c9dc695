package fusefs

import (
	"context"
	"iter"
	"slices"
	"sync"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/gc"
)

// openRefs is the mount's liveness source (DESIGN §6): every digest with an
// open handle on this mount is live. Pins already protect open files in
// this process; the source states the same fact to the collector in the
// form that can leave the process (fleet mode turns sources into SQL).
type openRefs struct {
	mu sync.Mutex
	m  map[blob.Digest]int
}

var _ gc.Source = (*openRefs)(nil)

func newOpenRefs() *openRefs { return &openRefs{m: make(map[blob.Digest]int)} }

func (o *openRefs) add(d blob.Digest) {
	o.mu.Lock()
	o.m[d]++
	o.mu.Unlock()
}

func (o *openRefs) drop(d blob.Digest) {
	o.mu.Lock()
	if o.m[d] <= 1 {
		delete(o.m, d)
	} else {
		o.m[d]--
	}
	o.mu.Unlock()
}

func (o *openRefs) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.m)
}

// IsLive implements gc.Source.
func (o *openRefs) IsLive(ctx context.Context, d blob.Digest) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.m[d] > 0, nil
}

// Live implements gc.Source: a sorted snapshot (open files are few).
func (o *openRefs) Live(ctx context.Context) iter.Seq2[blob.Digest, error] {
	o.mu.Lock()
	ds := make([]blob.Digest, 0, len(o.m))
	for d := range o.m {
		ds = append(ds, d)
	}
	o.mu.Unlock()
	slices.SortFunc(ds, blob.Digest.Compare)
	return func(yield func(blob.Digest, error) bool) {
		for _, d := range ds {
			if !yield(d, nil) {
				return
			}
		}
	}
}
