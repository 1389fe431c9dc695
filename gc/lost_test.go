package gc_test

import (
	"slices"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/gc/gctest"
)

// TestLost: Lost is every digest some source names live that the pool
// does not hold, once each and in order, whatever the sources overlap;
// Linked is its point query.
func TestLost(t *testing.T) {
	ctx := t.Context()
	ds := make([]blob.Digest, 8)
	for i := range ds {
		ds[i] = blob.Sum([]byte{byte(i)})
	}
	p := gctest.NewPool(gc.Options{}, ds[0], ds[2], ds[4])
	if got := lost(t, p.C); len(got) != 0 {
		t.Fatalf("no sources: %d lost", len(got))
	}
	p.C.Register(gctest.NewSource(ds[0], ds[1], ds[3], ds[5]))
	p.C.Register(gctest.NewSource(ds[1], ds[2], ds[5], ds[6]))
	got := lost(t, p.C)
	want := []blob.Digest{ds[1], ds[3], ds[5], ds[6]}
	slices.SortFunc(want, func(a, b blob.Digest) int { return a.Compare(b) })
	if !slices.Equal(got, want) {
		t.Fatalf("lost %x, want %x", got, want)
	}
	for i, d := range ds {
		linked, err := p.C.Linked(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		if want := slices.Contains([]int{0, 1, 2, 3, 5, 6}, i); linked != want {
			t.Errorf("Linked(ds[%d]) = %v, want %v", i, linked, want)
		}
	}
}

func lost(t *testing.T, c *gc.Collector) []blob.Digest {
	t.Helper()
	var out []blob.Digest
	for d, err := range c.Lost(t.Context()) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}
