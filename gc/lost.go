package gc

import (
	"context"
	"fmt"
	"iter"

	"github.com/alkblobfs/alkblobfs/blob"
)

// A blob a liveness source names live (a namespace links it) that the
// pool does not hold is lost: the store lost its content behind the
// collector's back (a file removed by hand, a restore that left it out),
// since no sweep deletes a live blob. The store asks Linked on a miss, so
// that a lost blob fails loudly on every surface instead of reading as
// absent, and a scrub of the whole pool reports Lost's.

// Linked reports whether a registered source names d live (the point
// query; the protect callback and pins are not asked: they protect, they
// do not promise content).
func (c *Collector) Linked(ctx context.Context, d blob.Digest) (bool, error) {
	sources, _ := c.snapshot()
	for _, s := range sources {
		live, err := s.IsLive(ctx, d)
		if err != nil || live {
			return live, err
		}
	}
	return false, nil
}

// Lost enumerates, in ascending order, the digests a registered source
// names live that the pool's listing lacks: one merge of the sources'
// enumerations with the pool's, as a sweep's mark, in memory O(sources).
func (c *Collector) Lost(ctx context.Context) iter.Seq2[blob.Digest, error] {
	return func(yield func(blob.Digest, error) bool) {
		sources, _ := c.snapshot()
		if len(sources) == 0 {
			return
		}
		cursors := make([]*cursor, 0, len(sources))
		for _, s := range sources {
			cursors = append(cursors, newCursor(s.Live(ctx)))
		}
		defer func() {
			for _, cur := range cursors {
				cur.stop()
			}
		}()
		pool := newCursor(func(yield func(blob.Digest, error) bool) {
			for e, err := range c.pool.List(ctx) {
				if !yield(e.Digest, err) || err != nil {
					return
				}
			}
		})
		defer pool.stop()
		var last blob.Digest
		first := true
		for {
			// The smallest head of the sources above the last one seen.
			var min blob.Digest
			found := false
			for _, cur := range cursors {
				if first {
					if _, err := cur.seek(blob.Digest{}); err != nil {
						yield(blob.Digest{}, fmt.Errorf("enumerate liveness: %w", err))
						return
					}
				} else if cur.ok && cur.cur == last {
					if _, err := cur.seek(next(last)); err != nil {
						yield(blob.Digest{}, fmt.Errorf("enumerate liveness: %w", err))
						return
					}
				}
				if cur.ok && (!found || cur.cur.Compare(min) < 0) {
					min, found = cur.cur, true
				}
			}
			first = false
			if !found || ctx.Err() != nil {
				return
			}
			last = min
			held, err := pool.seek(min)
			if err != nil {
				yield(blob.Digest{}, fmt.Errorf("list pool: %w", err))
				return
			}
			if !held && !yield(min, nil) || next(min).IsZero() {
				return
			}
		}
	}
}

// next is the digest just above d (d+1 as a 256-bit number), zero after
// the largest.
func next(d blob.Digest) blob.Digest {
	for i := len(d) - 1; i >= 0; i-- {
		d[i]++
		if d[i] != 0 {
			break
		}
	}
	return d
}
