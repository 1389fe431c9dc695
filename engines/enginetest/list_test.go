package enginetest

import (
	"context"
	"iter"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/mem"
)

// materializing is the mem engine with a List that reads every entry
// before it yields the first: right answers, memory that grows with the
// store.
type materializing struct{ *mem.Engine }

func (m materializing) List(ctx context.Context, after blob.Digest) iter.Seq2[engines.Entry, error] {
	var all []engines.Entry
	var err error
	for en, e := range m.Engine.List(ctx, after) {
		if e != nil {
			err = e
			break
		}
		all = append(all, en)
	}
	return func(yield func(engines.Entry, error) bool) {
		if err != nil {
			yield(engines.Entry{}, err)
			return
		}
		for _, en := range all {
			if !yield(en, nil) {
				return
			}
		}
	}
}

// TestPagedCheckCanFail: at the sizes make test uses, the suite's paging
// check passes the mem engine and fails the same engine made to
// materialize its listing.
func TestPagedCheckCanFail(t *testing.T) {
	const n, m = 5_000, 500
	few, many, budget := pagedGrowth(t, mem.New(), n, m)
	if many-few > budget {
		t.Fatalf("paging mem engine: growth difference %d over budget %d", many-few, budget)
	}
	few, many, budget = pagedGrowth(t, materializing{mem.New()}, n, m)
	if many-few <= budget {
		t.Fatalf("the check passed an engine that materialized %d entries: growth difference %d ≤ budget %d", n, many-few, budget)
	}
	t.Logf("materializing engine: growth difference %d bytes > budget %d", many-few, budget)
}
