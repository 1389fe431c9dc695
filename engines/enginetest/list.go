package enginetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

func (s *suite) testList(t *testing.T) {
	t.Run("Order", s.testListOrder)
	t.Run("After", s.testListAfter)
	t.Run("ZeroDigest", s.testListZeroDigest)
	t.Run("Canceled", s.testListCanceled)
	t.Run("Paged", s.testListPaged)
	// One store of more than a page for both: the puts are most of
	// their time on a remote engine.
	t.Run("EarlyStopThenDeleteWhileListing", s.testListEarlyStopThenDelete)
}

// list collects a listing; fine for small ones only.
func list(t *testing.T, e engines.Engine, after blob.Digest) []engines.Entry {
	t.Helper()
	var out []engines.Entry
	for en, err := range e.List(t.Context(), after) {
		if err != nil {
			t.Fatalf("List after %s: %v", after.Short(), err)
		}
		out = append(out, en)
	}
	return out
}

// checkOnly asserts the engine lists exactly ds (ascending).
func checkOnly(t *testing.T, e engines.Engine, ds ...blob.Digest) {
	t.Helper()
	got := list(t, e, blob.Digest{})
	if len(got) != len(ds) {
		t.Fatalf("List has %d entries; want %d", len(got), len(ds))
	}
	for i, en := range got {
		if en.Digest != ds[i] {
			t.Fatalf("List entry %d = %s; want %s", i, en.Digest.Short(), ds[i].Short())
		}
	}
}

func (s *suite) testListOrder(t *testing.T) {
	e := s.engine(t)
	if got := list(t, e, blob.Digest{}); len(got) != 0 {
		t.Fatalf("empty engine lists %d entries", len(got))
	}
	sizes := map[blob.Digest]int64{}
	for i := range 50 {
		v := value(i*37, uint64(i))
		sizes[put(t, e, v)] = int64(len(v))
	}
	got := list(t, e, blob.Digest{})
	if len(got) != len(sizes) {
		t.Fatalf("listed %d entries; want %d", len(got), len(sizes))
	}
	for i, en := range got {
		if i > 0 && got[i-1].Digest.Compare(en.Digest) >= 0 {
			t.Fatalf("entry %d (%s) is not above entry %d (%s)", i, en.Digest.Short(), i-1, got[i-1].Digest.Short())
		}
		want, ok := sizes[en.Digest]
		if !ok {
			t.Fatalf("listed %s, which was never put", en.Digest.Short())
		}
		if en.Size != want {
			t.Fatalf("entry %s: Size %d; want %d", en.Digest.Short(), en.Size, want)
		}
	}
}

func (s *suite) testListAfter(t *testing.T) {
	e := s.engine(t)
	ds := putMany(t, e, 40)
	for _, k := range []int{0, 1, 17, 38, 39} {
		got := list(t, e, ds[k])
		if len(got) != len(ds)-k-1 {
			t.Fatalf("after entry %d: %d entries; want %d", k, len(got), len(ds)-k-1)
		}
		for i, en := range got {
			if en.Digest != ds[k+1+i] {
				t.Fatalf("after entry %d: entry %d = %s; want %s", k, i, en.Digest.Short(), ds[k+1+i].Short())
			}
		}
	}
	// A cursor that is not a key resumes at the next key above it.
	mid := ds[20]
	mid[blob.Size-1]++ // not a key: adjacent keys differ long before the last byte
	if got := list(t, e, mid); len(got) != 19 || got[0].Digest != ds[21] {
		t.Fatalf("after a non-key between entries 20 and 21: %d entries; want 19 starting at entry 21", len(got))
	}
	var top blob.Digest
	for i := range top {
		top[i] = 0xff
	}
	if got := list(t, e, top); len(got) != 0 {
		t.Fatalf("after ff…ff: %d entries; want none", len(got))
	}
}

// testListZeroDigest: the zero cursor means "from the start", so an entry
// whose key is the zero digest is listed too.
func (s *suite) testListZeroDigest(t *testing.T) {
	e := s.engine(t)
	var zero blob.Digest
	putAs(t, e, zero, []byte("zero"))
	d := put(t, e, []byte("other"))
	checkOnly(t, e, zero, d)
}

// listPages is more entries than one page of any sensible engine (S3's
// is 200 keys here, pglo's 1 000 rows).
const listPages = 1500

// testListEarlyStop breaks out of a listing of ds, the store's entries.
func testListEarlyStop(t *testing.T, e engines.Engine, ds []blob.Digest) {
	n := 0
	// Breaking out must stop the engine: a yield after a false return
	// panics in the range-over-func machinery.
	for _, err := range e.List(t.Context(), blob.Digest{}) {
		if err != nil {
			t.Fatal(err)
		}
		if n++; n == 5 {
			break
		}
	}
	checkSQLIdle(t, e, "after breaking out of List")
	// The engine is still usable, and a resumed listing starts where the
	// loop stopped.
	if got := list(t, e, ds[4]); len(got) != len(ds)-5 {
		t.Fatalf("resumed listing: %d entries; want %d", len(got), len(ds)-5)
	}
}

// checkSQLIdle asserts a database/sql engine holds no connection: List
// must not keep a cursor or transaction open between yields.
func checkSQLIdle(t *testing.T, e engines.Engine, when string) {
	t.Helper()
	if db, ok := e.(engines.SQL); ok {
		if n := db.DB().Stats().InUse; n != 0 {
			t.Fatalf("%s: %d database connections in use; want 0", when, n)
		}
	}
}

func (s *suite) testListCanceled(t *testing.T) {
	e := s.engine(t)
	putMany(t, e, 10)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var last error
	n := 0
	for _, err := range e.List(ctx, blob.Digest{}) {
		if last != nil {
			t.Fatalf("List yielded after its error %v", last)
		}
		last = err
		n++
	}
	if !errors.Is(last, context.Canceled) {
		t.Fatalf("List with a canceled context ended with %v after %d pairs; want an error wrapping context.Canceled", last, n)
	}
}

// testListPaged checks that List pages: that what a listing holds does
// not grow with the number of entries it lists. It lists a store of 500
// entries, puts 4 500 more and lists the 5 000, and compares the live
// heap each listing holds halfway through. A materializing engine holds at
// least 4 500 more Entry values (40 bytes each) in the second; a paging one
// holds a page in both. The check allows half of those 4 500. Under
// ALKBLOBFS_LONG=1 (make test-long) the figures are 1 000 and 10 000:
// the puts cost the remote engines minutes of a loaded machine.
//
// The difference, not the heap one listing holds: the live heap is the
// process's, and beside the listing's entries it holds what the engine's
// client keeps per page (an S3 client's page of 200 decoded objects is
// ~200 KB, above a budget of 10 000 Entry values) and per connection, as
// much of it in both listings. Each figure is taken after a collection:
// garbage, the listing's or other goroutines', is not counted, only what is
// reachable.
func (s *suite) testListPaged(t *testing.T) {
	n, m := 5_000, 500
	if os.Getenv("ALKBLOBFS_LONG") == "1" {
		n, m = 10_000, 1_000
	}
	few, many, budget := pagedGrowth(t, s.engine(t), n, m)
	growth := many - few
	t.Logf("live heap growth halfway through listing %d entries: %d bytes; through %d: %d bytes; difference %d (budget %d)",
		m, few, n, many, growth, budget)
	if growth > budget {
		t.Fatalf("halfway through listing %d entries the live heap grew by %d bytes more than through %d; materializing the difference takes ~%d, budget is %d: List must page",
			n, growth, m, 2*budget, budget)
	}
}

// pagedGrowth puts m entries into e and lists them, puts n-m more and
// lists the n, and returns the live heap's growth halfway through each
// listing and the budget of their difference: half of what n-m more Entry
// values take.
func pagedGrowth(t *testing.T, e engines.Engine, n, m int) (few, many, budget int64) {
	t.Helper()
	budget = int64(n-m) * int64(unsafe.Sizeof(engines.Entry{})) / 2

	// held lists the store, which must hold want, and returns the live
	// heap's growth halfway through.
	held := func(want []blob.Digest) int64 {
		t.Helper()
		var before, mid runtime.MemStats
		runtime.GC()
		runtime.GC() // the first may leave finalizers' garbage to the next
		runtime.ReadMemStats(&before)
		i := 0
		for en, err := range e.List(t.Context(), blob.Digest{}) {
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			if i >= len(want) || en.Digest != want[i] {
				t.Fatalf("entry %d = %s; want the %d-th smallest digest", i, en.Digest.Short(), i)
			}
			if i == len(want)/2 {
				runtime.GC()
				runtime.GC()
				runtime.ReadMemStats(&mid)
			}
			if i%997 == 0 {
				checkSQLIdle(t, e, fmt.Sprintf("while yielding entry %d", i))
			}
			i++
		}
		if i != len(want) {
			t.Fatalf("listed %d entries; want %d", i, len(want))
		}
		return int64(mid.HeapAlloc) - int64(before.HeapAlloc)
	}
	ds := putRange(t, e, 0, m)
	few = held(ds)
	ds = append(ds, putRange(t, e, m, n)...)
	sortDigests(ds)
	many = held(ds)
	return few, many, budget
}

// testListEarlyStopThenDelete breaks out of a listing (testListEarlyStop),
// then lists again and deletes each entry from inside the loop. An engine
// that holds a lock across yields deadlocks there; the deadline turns that
// into a failure.
func (s *suite) testListEarlyStopThenDelete(t *testing.T) {
	// Not s.engine: a deadlocked engine's Close may block forever, so it is
	// closed only once the loop is known to have finished.
	e := s.open(t)
	finished := false
	t.Cleanup(func() {
		if !finished {
			t.Log("not closing the engine: its List loop may still hold a lock")
			return
		}
		if err := e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	ds := putMany(t, e, listPages)
	testListEarlyStop(t, e, ds)
	done := make(chan error, 1)
	var progress atomic.Int64 // entries listed and deleted
	go func() {
		i := 0
		for en, err := range e.List(t.Context(), blob.Digest{}) {
			if err != nil {
				done <- err
				return
			}
			if i >= len(ds) || en.Digest != ds[i] {
				done <- fmt.Errorf("entry %d = %s; want %s", i, en.Digest.Short(), ds[min(i, len(ds)-1)].Short())
				return
			}
			if err := e.Delete(t.Context(), en.Digest); err != nil {
				done <- fmt.Errorf("Delete inside the loop: %w", err)
				return
			}
			i++
			progress.Store(int64(i))
		}
		if i != len(ds) {
			done <- fmt.Errorf("listed %d entries while deleting; want %d", i, len(ds))
			return
		}
		done <- nil
	}()
	// A deadlock is a loop that stops moving: on a loaded machine 1500
	// deletes of a remote engine may take minutes, each still a step.
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for last, start := int64(-1), time.Now(); ; {
		select {
		case err := <-done:
			finished = true
			if err != nil {
				t.Fatal(err)
			}
			checkOnly(t, e)
			return
		case <-tick.C:
		}
		now := progress.Load()
		if now == last || time.Since(start) > 10*time.Minute {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("List with a Delete inside the loop stopped at entry %d of %d for a minute (or ran 10): deadlock. Goroutines:\n%s", now, len(ds), buf)
		}
		last = now
	}
}
