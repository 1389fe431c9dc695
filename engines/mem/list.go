package mem

import (
	"bytes"
	"container/heap"
	"context"
	"iter"
	"slices"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

const (
	// minPage is the smallest page List collects per scan of the map.
	minPage = 1000
	// maxScans bounds the number of full map scans of one listing: the
	// page is at least 1/maxScans of the map. A map has no order, so each
	// page costs a scan; this keeps a listing O(n·log page) per scan and
	// O(maxScans·n) in all while holding at most 1/maxScans of the keys.
	maxScans = 64
)

// List implements engines.Engine. See the package doc for its paging.
func (e *Engine) List(ctx context.Context, after blob.Digest) iter.Seq2[engines.Entry, error] {
	return func(yield func(engines.Entry, error) bool) {
		cur, inclusive := after, after.IsZero() // the zero digest lists from the start
		for {
			if err := ctx.Err(); err != nil {
				yield(engines.Entry{}, blob.Wrap("list", e.Name(), cur, err))
				return
			}
			page, full, err := e.page(cur, inclusive)
			if err != nil {
				yield(engines.Entry{}, err)
				return
			}
			for _, en := range page {
				if !yield(en, nil) {
					return
				}
			}
			if !full {
				return
			}
			cur, inclusive = page[len(page)-1].Digest, false
		}
	}
}

// page returns the smallest keys above cur (or equal to it, if inclusive),
// sorted, and whether the page is full (more may follow).
func (e *Engine) page(cur blob.Digest, inclusive bool) ([]engines.Entry, bool, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.m == nil {
		return nil, false, blob.Wrap("list", e.Name(), cur, blob.ErrClosed)
	}
	size := max(minPage, len(e.m)/maxScans)
	h := make(maxHeap, 0, min(size, len(e.m)))
	for d, v := range e.m {
		c := bytes.Compare(d[:], cur[:])
		if c < 0 || c == 0 && !inclusive {
			continue
		}
		switch {
		case len(h) < size:
			heap.Push(&h, engines.Entry{Digest: d, Size: int64(len(v))})
		case bytes.Compare(d[:], h[0].Digest[:]) < 0:
			h[0] = engines.Entry{Digest: d, Size: int64(len(v))}
			heap.Fix(&h, 0)
		}
	}
	page := []engines.Entry(h)
	slices.SortFunc(page, func(a, b engines.Entry) int { return bytes.Compare(a.Digest[:], b.Digest[:]) })
	return page, len(page) == size, nil
}

// maxHeap keeps the largest digest on top so the smallest `size` survive.
type maxHeap []engines.Entry

func (h maxHeap) Len() int { return len(h) }
func (h maxHeap) Less(i, j int) bool {
	return bytes.Compare(h[i].Digest[:], h[j].Digest[:]) > 0
}
func (h maxHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *maxHeap) Push(x any)   { *h = append(*h, x.(engines.Entry)) }
func (h *maxHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
