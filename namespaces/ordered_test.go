package namespaces

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
)

// TestOrderedModel drives the block list and a map with the same random
// inserts, adds and deletes, checking invariants and a full listing along
// the way.
func TestOrderedModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var o ordered
	m := map[blob.Digest]int64{}
	key := func() blob.Digest {
		var d blob.Digest
		d[0], d[1] = byte(rng.IntN(40)), byte(rng.IntN(256)) // ~10k keys: collisions happen
		return d
	}
	for step := range 60_000 {
		d := key()
		switch rng.IntN(5) {
		case 0, 1:
			_, had := m[d]
			if got := o.insert(d, int64(step)); got == had {
				t.Fatalf("step %d: insert = %v, key present = %v", step, got, had)
			}
			if !had {
				m[d] = int64(step)
			}
		case 2:
			delta := int64(rng.IntN(3) - 1)
			o.add(d, delta)
			if v := m[d] + delta; v > 0 {
				m[d] = v
			} else {
				delete(m, d)
			}
		case 3, 4:
			_, had := m[d]
			if got := o.delete(d); got != had {
				t.Fatalf("step %d: delete = %v, key present = %v", step, got, had)
			}
			delete(m, d)
		}
		if step%5000 == 0 || step == 59_999 {
			checkOrdered(t, &o, m)
		}
	}
	for d := range maps.Keys(m) { // drain: blocks must vanish
		o.delete(d)
	}
	if o.len() != 0 || len(o.blocks) != 0 {
		t.Fatalf("drained: len %d, %d blocks", o.len(), len(o.blocks))
	}
}

func checkOrdered(t *testing.T, o *ordered, m map[blob.Digest]int64) {
	t.Helper()
	if o.len() != len(m) {
		t.Fatalf("len = %d, model %d", o.len(), len(m))
	}
	for i, b := range o.blocks {
		if len(b) == 0 || len(b) > blockMax {
			t.Fatalf("block %d has %d items", i, len(b))
		}
	}
	want := slices.SortedFunc(maps.Keys(m), blob.Digest.Compare)
	var got []blob.Digest
	var last blob.Digest
	for first := true; ; first = false {
		page := o.page(last, first, 97, nil)
		for _, it := range page {
			if it.v != m[it.d] {
				t.Fatalf("%x: value %d, model %d", it.d[:2], it.v, m[it.d])
			}
			got = append(got, it.d)
		}
		if len(page) < 97 {
			break
		}
		last = page[len(page)-1].d
	}
	if !slices.Equal(got, want) {
		t.Fatalf("paged listing: %d keys, model %d (or out of order)", len(got), len(want))
	}
	for _, d := range want[:min(len(want), 50)] {
		if v, ok := o.get(d); !ok || v != m[d] {
			t.Fatalf("get(%x) = %d, %v; model %d", d[:2], v, ok, m[d])
		}
	}
}
