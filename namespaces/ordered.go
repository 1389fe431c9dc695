package namespaces

import (
	"slices"
	"sort"

	"github.com/alkblobfs/alkblobfs/blob"
)

// ordered is an in-memory sorted map digest → int64, kept as a list of
// sorted blocks (a one-level B-tree). Insert and delete cost O(log n +
// blockMax); seeking to a key for a keyset page costs O(log n). A sorted
// slice would make each insert O(n) (a million links would move terabytes),
// a map cannot resume a listing at a key, and a lazily re-sorted snapshot
// costs O(n log n) per page whenever listing and linking interleave.
//
// Values: a namespace stores linked_at (unix ns); the live set stores how
// many namespaces reference the digest.
type ordered struct {
	blocks [][]item // each non-empty and sorted; block i < block i+1
	n      int
}

type item struct {
	d blob.Digest
	v int64
}

// blockMax bounds a block: inserts shift at most this many items.
const blockMax = 512

func cmpItem(it item, d blob.Digest) int { return it.d.Compare(d) }

// find returns the block holding d, or the block d would go into, and the
// position in it.
func (o *ordered) find(d blob.Digest) (bi, i int, found bool) {
	bi = sort.Search(len(o.blocks), func(k int) bool {
		b := o.blocks[k]
		return b[len(b)-1].d.Compare(d) >= 0
	})
	if bi == len(o.blocks) {
		return bi, 0, false
	}
	i, found = slices.BinarySearchFunc(o.blocks[bi], d, cmpItem)
	return bi, i, found
}

func (o *ordered) len() int { return o.n }

func (o *ordered) get(d blob.Digest) (int64, bool) {
	bi, i, ok := o.find(d)
	if !ok {
		return 0, false
	}
	return o.blocks[bi][i].v, true
}

// insert adds d with value v unless d is present, and reports whether it
// added it. A present d keeps its value.
func (o *ordered) insert(d blob.Digest, v int64) bool {
	bi, i, ok := o.find(d)
	if ok {
		return false
	}
	o.insertAt(bi, i, item{d, v})
	return true
}

// add adds delta to d's value, inserting d at delta when absent and
// deleting it when the value drops to zero or below.
func (o *ordered) add(d blob.Digest, delta int64) {
	bi, i, ok := o.find(d)
	switch {
	case !ok && delta > 0:
		o.insertAt(bi, i, item{d, delta})
	case ok && o.blocks[bi][i].v+delta > 0:
		o.blocks[bi][i].v += delta
	case ok:
		o.deleteAt(bi, i)
	}
}

func (o *ordered) insertAt(bi, i int, it item) {
	switch {
	case len(o.blocks) == 0:
		o.blocks = [][]item{make([]item, 0, 8)}
		bi, i = 0, 0
	case bi == len(o.blocks): // past the end: append to the last block
		bi = len(o.blocks) - 1
		i = len(o.blocks[bi])
	}
	o.blocks[bi] = slices.Insert(o.blocks[bi], i, it)
	if b := o.blocks[bi]; len(b) > blockMax {
		half := len(b) / 2
		right := make([]item, len(b)-half, blockMax)
		copy(right, b[half:])
		clear(b[half:])
		o.blocks[bi] = b[:half]
		o.blocks = slices.Insert(o.blocks, bi+1, right)
	}
	o.n++
}

// delete removes d and reports whether it was there.
func (o *ordered) delete(d blob.Digest) bool {
	bi, i, ok := o.find(d)
	if ok {
		o.deleteAt(bi, i)
	}
	return ok
}

func (o *ordered) deleteAt(bi, i int) {
	o.blocks[bi] = slices.Delete(o.blocks[bi], i, i+1)
	o.n--
	b := o.blocks[bi]
	switch {
	case len(b) == 0:
		o.blocks = slices.Delete(o.blocks, bi, bi+1)
	case len(b) < blockMax/4 && bi+1 < len(o.blocks) && len(b)+len(o.blocks[bi+1]) <= blockMax/2:
		// Merge sparse neighbours so that mass deletes do not leave a long
		// list of tiny blocks.
		o.blocks[bi] = append(b, o.blocks[bi+1]...)
		o.blocks = slices.Delete(o.blocks, bi+1, bi+2)
	}
}

// page appends to out up to limit items with key > after (>= after when
// incl), in ascending order.
func (o *ordered) page(after blob.Digest, incl bool, limit int, out []item) []item {
	bi, i, found := o.find(after)
	if found && !incl {
		i++
	}
	for ; bi < len(o.blocks) && len(out) < limit; bi, i = bi+1, 0 {
		b := o.blocks[bi]
		n := min(len(b)-i, limit-len(out))
		if n > 0 {
			out = append(out, b[i:i+n]...)
		}
	}
	return out
}
