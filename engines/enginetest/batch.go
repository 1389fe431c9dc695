package enginetest

import (
	"errors"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// testDeleteMany: sizes for held digests, -1 for absent ones (including a
// duplicate already deleted earlier in the same call), and the held ones
// gone afterwards while others stay.
func (s *suite) testDeleteMany(t *testing.T) {
	e := s.engine(t)
	bd := e.(engines.BatchDeleter)
	a, b, keep := put(t, e, value(10, 1)), put(t, e, value(2000, 2)), put(t, e, value(5, 3))
	absent := blob.Sum([]byte("absent"))
	sizes, err := bd.DeleteMany(t.Context(), []blob.Digest{a, absent, b, a})
	if err != nil {
		t.Fatal(err)
	}
	want := []int64{10, -1, 2000, -1}
	for i := range want {
		if sizes[i] != want[i] {
			t.Fatalf("DeleteMany sizes = %v, want %v", sizes, want)
		}
	}
	for _, d := range []blob.Digest{a, b} {
		if _, err := e.Size(t.Context(), d); !errors.Is(err, blob.ErrMissing) {
			t.Fatalf("deleted digest still has a size: %v", err)
		}
	}
	if n, err := e.Size(t.Context(), keep); err != nil || n != 5 {
		t.Fatalf("untouched digest: %d, %v", n, err)
	}
	if sizes, err := bd.DeleteMany(t.Context(), nil); err != nil || len(sizes) != 0 {
		t.Fatalf("empty DeleteMany: %v, %v", sizes, err)
	}
}

// testSizeMany: sizes in request order, duplicates answered each time, -1
// for absent digests, across more than one internal batch.
func (s *suite) testSizeMany(t *testing.T) {
	e := s.engine(t)
	bs := e.(engines.BatchSizer)
	ds := putMany(t, e, 1200)
	absent := blob.Sum([]byte("absent"))
	query := append([]blob.Digest{absent}, ds...)
	query = append(query, ds[0])
	sizes, err := bs.SizeMany(t.Context(), query)
	if err != nil {
		t.Fatal(err)
	}
	if len(sizes) != len(query) || sizes[0] != -1 {
		t.Fatalf("SizeMany: %d sizes, first %d; want %d, -1", len(sizes), sizes[0], len(query))
	}
	for i, d := range query[1:] {
		want, err := e.Size(t.Context(), d)
		if err != nil {
			t.Fatal(err)
		}
		if sizes[i+1] != want {
			t.Fatalf("SizeMany[%d] = %d, Size = %d", i+1, sizes[i+1], want)
		}
	}
	if sizes, err := bs.SizeMany(t.Context(), nil); err != nil || len(sizes) != 0 {
		t.Fatalf("empty SizeMany: %v, %v", sizes, err)
	}
}
