package enginetest

import (
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// testWindow checks the durable delete window with explicit times.
func (s *suite) testWindow(t *testing.T) {
	e := s.engine(t)
	w := e.(engines.WindowHost)
	ctx := t.Context()
	base := time.Unix(1_700_000_000, 123_456_789)
	at := func(sec int) time.Time { return base.Add(time.Duration(sec) * time.Second) }

	ds := make([]blob.Digest, 6)
	for i := range ds {
		ds[i] = blob.Sum([]byte{byte(i), 'w'})
	}
	sortDigests(ds)
	due := func(now time.Time, after blob.Digest, limit int) []engines.Candidate {
		t.Helper()
		cs, err := w.WindowDue(ctx, now, after, limit)
		if err != nil {
			t.Fatalf("WindowDue: %v", err)
		}
		return cs
	}
	expect := func(step string, got []engines.Candidate, want ...engines.Candidate) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d candidates %v; want %d", step, len(got), got, len(want))
		}
		for i := range got {
			if got[i].Digest != want[i].Digest || !got[i].VisibleAfter.Equal(want[i].VisibleAfter) {
				t.Fatalf("%s: candidate %d = %s at %v; want %s at %v", step, i,
					got[i].Digest.Short(), got[i].VisibleAfter, want[i].Digest.Short(), want[i].VisibleAfter)
			}
		}
	}
	length := func(want int) {
		t.Helper()
		if n, err := w.WindowLen(ctx); n != want || err != nil {
			t.Fatalf("WindowLen = %d, %v; want %d", n, err, want)
		}
	}

	length(0)
	expect("empty window", due(at(1000), blob.Digest{}, 100))
	// Due times out of digest order, so ordering by time would show.
	c := []engines.Candidate{
		{Digest: ds[0], VisibleAfter: at(3)},
		{Digest: ds[1], VisibleAfter: at(0)},
		{Digest: ds[2], VisibleAfter: at(10)},
		{Digest: ds[3], VisibleAfter: at(2)},
		{Digest: ds[4], VisibleAfter: at(1)},
	}
	if err := w.WindowStage(ctx, c); err != nil {
		t.Fatalf("WindowStage: %v", err)
	}
	length(5)
	// A re-staged candidate keeps its existing row, earlier or later.
	if err := w.WindowStage(ctx, []engines.Candidate{
		{Digest: ds[1], VisibleAfter: at(100)},
		{Digest: ds[2], VisibleAfter: at(0)},
		{Digest: ds[5], VisibleAfter: at(4)},
	}); err != nil {
		t.Fatalf("WindowStage again: %v", err)
	}
	if err := w.WindowStage(ctx, nil); err != nil {
		t.Fatalf("WindowStage(nil): %v", err)
	}
	length(6)
	c = append(c, engines.Candidate{Digest: ds[5], VisibleAfter: at(4)})

	expect("before the first", due(base.Add(-time.Nanosecond), blob.Digest{}, 100))
	expect("at the first, to the nanosecond", due(base, blob.Digest{}, 100), c[1])
	expect("at +3s", due(at(3), blob.Digest{}, 100), c[0], c[1], c[3], c[4])
	expect("page 1", due(at(3), blob.Digest{}, 3), c[0], c[1], c[3])
	expect("page 2", due(at(3), ds[3], 3), c[4])
	expect("after the last due", due(at(3), ds[4], 3))
	expect("limit 0", due(at(3), blob.Digest{}, 0))
	expect("all", due(at(1000), blob.Digest{}, 100), c...)

	// The window is independent of the pool.
	v := []byte("window-independent")
	d := put(t, e, v)
	if err := e.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	length(6)

	if err := w.WindowRemove(ctx, []blob.Digest{ds[1], ds[3], blob.Sum([]byte("never staged"))}); err != nil {
		t.Fatalf("WindowRemove: %v", err)
	}
	if err := w.WindowRemove(ctx, nil); err != nil {
		t.Fatalf("WindowRemove(nil): %v", err)
	}
	length(4)
	expect("after remove", due(at(1000), blob.Digest{}, 100), c[0], c[2], c[4], c[5])
	// A removed candidate can be staged again with a new time.
	if err := w.WindowStage(ctx, []engines.Candidate{{Digest: ds[1], VisibleAfter: at(50)}}); err != nil {
		t.Fatal(err)
	}
	expect("re-staged", due(at(50), ds[0], 1), engines.Candidate{Digest: ds[1], VisibleAfter: at(50)})
	length(5)
}
