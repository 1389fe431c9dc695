package enginetest

import (
	"errors"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/meta"
)

// testPutter checks that PutRows commits a put's rows with its entry, or
// neither: a pin row (meta's gc_pins, which every engine that is a Putter
// keeps) goes in with the entry, with a dedup's no-op insert too, and a
// namespace part that fails takes the entry and the pin row with it.
func (s *suite) testPutter(t *testing.T) {
	e := s.engine(t)
	p := e.(meta.Putter)
	host := e.(meta.Holder).Meta().Host
	if host == nil {
		t.Fatalf("%s is a meta.Putter but keeps no pin rows (meta.State.Host)", e.Name())
	}
	ctx := t.Context()
	const owner = "enginetest-putter"
	pinned := func() map[blob.Digest]bool {
		t.Helper()
		got, err := host.RenewPins(ctx, owner, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	pin := func(d blob.Digest) *meta.PinRow { return &meta.PinRow{D: d, Owner: owner, TTL: time.Hour} }

	v1, v2 := value(100, 1), value(100, 2)
	d1, d2 := blob.Sum(v1), blob.Sum(v2)
	if ins, err := p.PutRows(ctx, d1, v1, meta.Rows{Pin: pin(d1)}); !ins || err != nil {
		t.Fatalf("PutRows = %v, %v; want true, nil", ins, err)
	}
	if !pinned()[d1] {
		t.Fatal("PutRows committed the blob but not its pin row")
	}
	checkContent(t, e, d1, v1)

	// A namespace part that cannot be written (no registry in this
	// database) fails the put: neither the entry nor the pin row commits.
	orphan := meta.NSRows{Link: &meta.LinkRow{NS: "a"}}.For(d2, int64(len(v2)))
	_, err := p.PutRows(ctx, d2, v2, meta.Rows{Pin: pin(d2), NS: orphan})
	if !errors.Is(err, meta.ErrNSRowsElsewhere) {
		t.Fatalf("PutRows with a failing namespace part: err = %v; want it to wrap meta.ErrNSRowsElsewhere", err)
	}
	checkAbsent(t, e, d2)
	if pinned()[d2] {
		t.Fatal("a failed PutRows committed its pin row")
	}

	// A dedup still commits its rows (a second owner's pin of stored
	// content).
	if err := host.DropOwner(ctx, owner); err != nil {
		t.Fatal(err)
	}
	if ins, err := p.PutRows(ctx, d1, v1, meta.Rows{Pin: pin(d1)}); ins || err != nil {
		t.Fatalf("dedup PutRows = %v, %v; want false, nil", ins, err)
	}
	if !pinned()[d1] {
		t.Fatal("a dedup PutRows did not commit its pin row")
	}
	checkSQLIdle(t, e, "after PutRows")
}
