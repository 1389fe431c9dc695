package metatest

import (
	"slices"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// WindowEngine runs Window on the window of the engine open returns, then
// checks that the window is independent of the pool: a put and a delete
// in the pool leave it as it was.
func WindowEngine(t *testing.T, open func(t *testing.T) engines.Engine) {
	e := open(t)
	t.Cleanup(func() { e.Close() })
	w := state(t, e).Window
	if w == nil {
		t.Fatalf("%s keeps no meta.Window", e.Name())
	}
	Window(t, w)
	ctx := t.Context()
	n, err := w.WindowLen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := put(t, e, []byte("window-independent"))
	if err := e.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	if m, err := w.WindowLen(ctx); m != n || err != nil {
		t.Fatalf("WindowLen after a put and a delete in the pool = %d, %v; want %d", m, err, n)
	}
}

// Window checks the meta.Window contract on an empty window:
// staging with delays, what is due (and in what order, in pages), that a
// queued row keeps its time, removal, and that a delay counts on the
// window's own clock — which no test can move, so that part watches a
// short delay pass.
func Window(t *testing.T, w meta.Window) {
	ctx := t.Context()
	ds := make([]blob.Digest, 6)
	for i := range ds {
		ds[i] = blob.Sum([]byte{byte(i), 'w'})
	}
	sortDigests(ds)
	due := func(after blob.Digest, limit int) []blob.Digest {
		t.Helper()
		got, err := w.WindowDue(ctx, after, limit)
		if err != nil {
			t.Fatalf("WindowDue: %v", err)
		}
		return got
	}
	expect := func(step string, got []blob.Digest, want ...blob.Digest) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("%s: due %v; want %v", step, got, want)
		}
	}
	queue := func(delay time.Duration, ds ...blob.Digest) {
		t.Helper()
		if err := w.WindowQueue(ctx, ds, delay); err != nil {
			t.Fatalf("WindowQueue: %v", err)
		}
	}
	length := func(want int) {
		t.Helper()
		if n, err := w.WindowLen(ctx); n != want || err != nil {
			t.Fatalf("WindowLen = %d, %v; want %d", n, err, want)
		}
	}

	length(0)
	expect("empty window", due(blob.Digest{}, 100))
	// A delay of 0 is due at once; an hour is not due in this test.
	queue(0, ds[3], ds[1], ds[4])
	queue(time.Hour, ds[0], ds[2])
	length(5)
	// A re-queued candidate keeps its existing row, earlier or later.
	queue(time.Hour, ds[1])
	queue(0, ds[2], ds[5])
	queue(0)
	length(6)
	expect("due, in digest order", due(blob.Digest{}, 100), ds[1], ds[3], ds[4], ds[5])
	expect("page 1", due(blob.Digest{}, 2), ds[1], ds[3])
	expect("page 2", due(ds[3], 2), ds[4], ds[5])
	expect("after the last due", due(ds[5], 2))
	expect("limit 0", due(blob.Digest{}, 0))

	if err := w.WindowRemove(ctx, []blob.Digest{ds[1], ds[3], blob.Sum([]byte("never queued"))}); err != nil {
		t.Fatalf("WindowRemove: %v", err)
	}
	if err := w.WindowRemove(ctx, nil); err != nil {
		t.Fatalf("WindowRemove(nil): %v", err)
	}
	length(4)
	expect("after remove", due(blob.Digest{}, 100), ds[4], ds[5])
	// A removed candidate can be queued again with a new time.
	if err := w.WindowRemove(ctx, []blob.Digest{ds[0]}); err != nil {
		t.Fatal(err)
	}
	queue(0, ds[0])
	expect("re-queued", due(blob.Digest{}, 100), ds[0], ds[4], ds[5])
	length(4)

	// A delay passes on the window's clock: not due before it, due after.
	const delay = 300 * time.Millisecond
	late := blob.Sum([]byte("late"))
	start := time.Now()
	queue(delay, late)
	for deadline := start.Add(delay + 10*time.Second); ; time.Sleep(20 * time.Millisecond) {
		got := due(blob.Digest{}, 100)
		if slices.Contains(got, late) {
			if d := time.Since(start); d < delay {
				t.Fatalf("a candidate queued with a delay of %s was due after %s", delay, d)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a candidate queued with a delay of %s is not due after %s", delay, time.Since(start))
		}
	}
	if err := w.WindowRemove(ctx, append(ds, late)); err != nil {
		t.Fatal(err)
	}
	length(0)
}
