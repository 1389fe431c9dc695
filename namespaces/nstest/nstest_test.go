package nstest

import (
	"context"
	"iter"
	"slices"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// materializing is a registry whose Entries reads the whole namespace
// before yielding: correct answers, unbounded memory.
type materializing struct{ namespaces.Registry }

func (m materializing) Entries(ctx context.Context, name string, after blob.Digest) iter.Seq2[namespaces.Ref, error] {
	var all []namespaces.Ref
	var err error
	for ref, e := range m.Registry.Entries(ctx, name, after) {
		if e != nil {
			err = e
			break
		}
		all = append(all, ref)
	}
	return func(yield func(namespaces.Ref, error) bool) {
		if err != nil {
			yield(namespaces.Ref{}, err)
			return
		}
		for _, ref := range all {
			if !yield(ref, nil) {
				return
			}
		}
	}
}

// TestBoundedMemoryCheckCanFail: the suite's memory check rejects a
// registry that materializes its listing, and accepts the streaming one.
func TestBoundedMemoryCheckCanFail(t *testing.T) {
	ctx := context.Background()
	r := namespaces.NewMem(nil)
	if err := r.Create(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	for batch := range slices.Chunk(sorted(ds(0, Big)), 10_000) {
		if _, err := r.LinkMany(ctx, "big", batch); err != nil {
			t.Fatal(err)
		}
	}
	n, growth, err := listBounded(ctx, r, "big", 10_000)
	if err != nil || n != Big || growth > growthLimit(Big) {
		t.Fatalf("streaming registry: n=%d growth=%d err=%v; want %d refs under %d bytes", n, growth, err, Big, growthLimit(Big))
	}
	n, growth, err = listBounded(ctx, materializing{r}, "big", 10_000)
	if err != nil || n != Big {
		t.Fatalf("materializing registry: n=%d err=%v", n, err)
	}
	if growth <= growthLimit(Big) {
		t.Fatalf("the check passed a registry that materialized %d refs: growth %d ≤ limit %d", Big, growth, growthLimit(Big))
	}
	t.Logf("growth: streaming fine, materializing %d KiB > limit %d KiB", growth>>10, growthLimit(Big)>>10)
}
