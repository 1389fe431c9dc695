package store_test

import (
	"bytes"
	"context"
	"errors"
	"iter"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/store"
)

// refs is a liveness source over a set, standing in for namespaces.
type refs struct {
	mu sync.Mutex
	m  map[blob.Digest]bool
}

func (r *refs) set(d blob.Digest, live bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if live {
		r.m[d] = true
	} else {
		delete(r.m, d)
	}
}

func (r *refs) IsLive(_ context.Context, d blob.Digest) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[d], nil
}

func (r *refs) Live(context.Context) iter.Seq2[blob.Digest, error] {
	return func(yield func(blob.Digest, error) bool) {
		r.mu.Lock()
		ds := make([]blob.Digest, 0, len(r.m))
		for d := range r.m {
			ds = append(ds, d)
		}
		r.mu.Unlock()
		slices.SortFunc(ds, blob.Digest.Compare)
		for _, d := range ds {
			if !yield(d, nil) {
				return
			}
		}
	}
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}
func (c *clock) After(d time.Duration) <-chan time.Time { panic("durable window never waits") }
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func openDurable(t *testing.T, dir string, delay time.Duration, c gc.Clock) *store.Store {
	t.Helper()
	kv, large := sqliteKV(t, dir), localLarge(t, dir)
	return openWith(t, store.Config{KV: kv, Large: large, GCDelay: delay, Clock: c})
}

// openWith opens a store over cfg's engines with the test threshold; it
// is closed when t ends.
func openWith(t *testing.T, cfg store.Config) *store.Store {
	t.Helper()
	cfg.Threshold = threshold
	s, err := store.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// durable opens a store whose GC window is durable. Every call after the
// first reopens the same pool (the same files or database), so the
// durable-window tests below run on each SQL window host: SQLite here,
// PostgreSQL in postgres_test.go.
type durable struct {
	open func(t *testing.T, delay time.Duration, c gc.Clock) *store.Store
	// kvSurvives: the kv tier keeps its blobs across a reopen (not so for
	// a mem kv engine, where the large engine hosts the window).
	kvSurvives bool
}

func sqliteDurable(t *testing.T) durable {
	dir := t.TempDir()
	return durable{open: func(t *testing.T, delay time.Duration, c gc.Clock) *store.Store {
		return openDurable(t, dir, delay, c)
	}, kvSurvives: true}
}

func putN(t *testing.T, s *store.Store, n int) []store.Digest {
	t.Helper()
	ds := make([]store.Digest, n)
	for i := range ds {
		size := 100
		if i%2 == 1 {
			size = threshold * 2 // half in each tier
		}
		d, pin, err := s.Put(t.Context(), bytes.NewReader(randBytes(size)), int64(size))
		if err != nil {
			t.Fatal(err)
		}
		pin.Release()
		ds[i] = d
	}
	return ds
}

func sweep(t *testing.T, s *store.Store) gc.Report {
	t.Helper()
	r, err := s.Sweep(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// On SQLite the window is durable: sweep 1 stages N, sweep 2 executes
// exactly N (deleted + cancelled == N).
func TestSQLiteTwoSweepExactCounts(t *testing.T) { testTwoSweepExactCounts(t, sqliteDurable(t)) }

func testTwoSweepExactCounts(t *testing.T, o durable) {
	s := o.open(t, 0, nil)
	if !s.GC().Durable() {
		t.Fatal("store does not host a durable window")
	}
	ds := putN(t, s, 40)
	src := &refs{m: map[blob.Digest]bool{}}
	for _, d := range ds[:10] {
		src.set(d, true)
	}
	s.GC().Register(src)
	r1 := sweep(t, s)
	if r1.Queued != 30 || r1.Deleted != 0 || r1.Scanned != 40 {
		t.Fatalf("sweep 1: %+v", r1)
	}
	pin, err := s.Pin(context.Background(), ds[20])
	if err != nil {
		t.Fatal(err)
	}
	r2 := sweep(t, s)
	if r2.Deleted+r2.Cancelled != 30 || r2.Cancelled != 1 || r2.BytesFreed == 0 {
		t.Fatalf("sweep 2: %+v", r2)
	}
	pin.Release()
	if c := count(t, s); c != 11 {
		t.Fatalf("%d entries left, want 11", c)
	}
}

func TestSQLiteRaceAcrossDelay(t *testing.T) { testRaceAcrossDelay(t, sqliteDurable(t)) }

func testRaceAcrossDelay(t *testing.T, o durable) {
	// The window's clock is the window host's, which no test can move: a
	// short delay, waited out.
	const delay = time.Second
	s := o.open(t, delay, nil)
	s.GC().Register(&refs{m: map[blob.Digest]bool{}})
	twin := randBytes(threshold * 2)
	a, pa, _ := s.Put(t.Context(), bytes.NewReader(twin), -1)
	pa.Release()
	b := putN(t, s, 1)[0]
	queued := time.Now() // no later than the rows' time on the window's clock
	if r := sweep(t, s); r.Queued != 2 {
		t.Fatalf("sweep 1: %+v", r)
	}
	due := time.Now().Add(delay) // no earlier than the rows' due time
	// Not due before the delay has passed: checked when the second sweep
	// ended within it (on a loaded machine it may not).
	if r := sweep(t, s); time.Since(queued) < delay && (r.Deleted != 0 || r.Cancelled != 0) {
		t.Fatalf("sweep within the delay: %+v", r)
	} else if time.Since(queued) >= delay {
		t.Logf("the second sweep ended %s after the first began, past the %s delay: not checking that it deleted nothing", time.Since(queued).Round(time.Millisecond), delay)
	}
	// A put of the same content lands during the window (dedup): pinned.
	a2, pin, err := s.Put(t.Context(), bytes.NewReader(twin), -1)
	if err != nil || a2 != a {
		t.Fatal(err)
	}
	time.Sleep(time.Until(due)) // the window, waited out
	r := sweep(t, s)
	if r.Deleted != 1 || r.Cancelled != 1 {
		t.Fatalf("sweep 2: %+v", r)
	}
	if ok, _ := s.Has(t.Context(), a); !ok {
		t.Fatal("the put that landed during the window was deleted")
	}
	if ok, _ := s.Has(t.Context(), b); ok {
		t.Fatal("the unpinned twin survived")
	}
	pin.Release()
	sweep(t, s)
	time.Sleep(delay)
	if r := sweep(t, s); r.Deleted != 1 {
		t.Fatalf("sweep 4: %+v", r)
	}
	if ok, _ := s.Has(t.Context(), a); ok {
		t.Fatal("unpinned, unreferenced blob survived")
	}
}

func TestWindowSurvivesReopen(t *testing.T) { testWindowSurvivesReopen(t, sqliteDurable(t)) }

func testWindowSurvivesReopen(t *testing.T, o durable) {
	s := o.open(t, 0, nil)
	putN(t, s, 6)
	s.GC().Register(&refs{m: map[blob.Digest]bool{}})
	if r := sweep(t, s); r.Queued != 6 {
		t.Fatalf("sweep 1: %+v", r)
	}
	s.Close()
	s = o.open(t, 0, nil)
	if n, err := s.GC().WindowLen(t.Context()); err != nil || n != 6 {
		t.Fatalf("window after reopen: %d rows, %v", n, err)
	}
	s.GC().Register(&refs{m: map[blob.Digest]bool{}})
	// A kv tier that forgot its blobs leaves their rows to be cancelled
	// as vanished: putN puts half of them there.
	wantDeleted := 6
	if !o.kvSurvives {
		wantDeleted = 3
	}
	if r := sweep(t, s); r.Deleted != wantDeleted || r.Deleted+r.Cancelled != 6 || r.Pending != 0 {
		t.Fatalf("sweep after reopen: %+v; want %d deleted, %d cancelled", r, wantDeleted, 6-wantDeleted)
	}
	if c := count(t, s); c != 0 {
		t.Fatalf("%d entries left", c)
	}
}

func TestStoreAborts(t *testing.T) {
	s := openDurable(t, t.TempDir(), 0, nil)
	putN(t, s, 4)
	if r := sweep(t, s); r.Aborted != gc.AbortNoLivenessSources || r.Queued != 0 {
		t.Fatalf("no sources: %+v", r)
	}
	s.GC().Register(&refs{m: map[blob.Digest]bool{}})
	s.GC().SetProtect(func(context.Context) (func(blob.Digest) bool, error) { return nil, errors.New("down") })
	if r := sweep(t, s); r.Aborted != gc.AbortProtectFailed {
		t.Fatalf("protect failed: %+v", r)
	}
	if c := count(t, s); c != 4 {
		t.Fatalf("an aborted sweep deleted: %d left", c)
	}
}

// Concurrent puts (with and without keeping pins), direct deletes and
// sweeps on the real engines: nothing pinned or referenced is ever lost.
func TestStoreConcurrentPutsAndSweeps(t *testing.T) {
	s := openDurable(t, t.TempDir(), 0, nil)
	src := &refs{m: map[blob.Digest]bool{}}
	s.GC().Register(src)
	contents := make([][]byte, 16)
	for i := range contents {
		n := 200
		if i%2 == 0 {
			n = threshold * 2
		}
		contents[i] = randBytes(n)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var kept sync.Map // digest → content, referenced while kept
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				data := contents[(w*7+i)%len(contents)]
				d, pin, err := s.Put(context.Background(), bytes.NewReader(data), -1)
				if err != nil {
					t.Error(err)
					return
				}
				// While pinned, the blob must be readable in full.
				r, ok, err := s.Get(context.Background(), d)
				if err != nil || !ok {
					t.Errorf("pinned blob %s unreadable: ok=%v err=%v", d.Short(), ok, err)
				} else {
					var buf bytes.Buffer
					if _, err := r.WriteTo(&buf); err != nil || !bytes.Equal(buf.Bytes(), data) {
						t.Errorf("pinned blob %s read back wrong: %v", d.Short(), err)
					}
					r.Close()
				}
				if i%10 == 0 {
					src.set(d, true) // linked while pinned, as namespaces do
					kept.Store(d, data)
				}
				pin.Release()
			}
		}()
	}
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		for {
			select {
			case <-stop:
				return
			default:
				if _, err := s.Sweep(context.Background()); err != nil {
					t.Error(err)
				}
			}
		}
	}()
	wg.Wait()
	close(stop)
	// The sweeper is done before the test ends and its cleanup closes the
	// store: a sweep running then failed with "sql: statement is closed".
	<-swept
	kept.Range(func(k, v any) bool {
		if !bytes.Equal(readAll(t, s, k.(store.Digest)), v.([]byte)) {
			t.Errorf("referenced blob changed")
		}
		return true
	})
}
