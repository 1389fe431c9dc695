package cache_test

import (
	"context"
	"testing"

	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
)

// TestHitsBatchAccessTimes: fifty opens of one cached copy write its
// access time into the index at most once (batched, and throttled to an
// eighth of the cache's horizon), and an open of the oldest copy always
// moves it.
func TestHitsBatchAccessTimes(t *testing.T) {
	f := newFixture(t, s3test.URL(t), t.TempDir(), 64<<20)
	a, _ := f.put(1<<20, 41)
	b, _ := f.put(1<<20, 42)
	f.read(a)
	f.read(b)
	f.settled()
	before := f.c.TouchWrites()
	for range 50 {
		r, _, err := f.st.Get(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		r.Close()
	}
	f.stats() // flushes
	if n := f.c.TouchWrites() - before; n > 1 {
		t.Fatalf("50 opens of one copy wrote its access time %d times", n)
	}
	before = f.c.TouchWrites()
	r, _, err := f.st.Get(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	f.stats()
	if n := f.c.TouchWrites() - before; n != 1 {
		t.Fatalf("an open of the oldest copy wrote %d access times, want 1", n)
	}
}

// TestEvictionSeesRecentOpens: an open not yet written to the index
// (they are batched) still protects its copy from the next eviction of
// the process: the least recently opened copy goes.
func TestEvictionSeesRecentOpens(t *testing.T) {
	f := newFixture(t, s3test.URL(t), t.TempDir(), 5<<20)
	const n = 2 << 20
	a, _ := f.put(n, 43)
	b, _ := f.put(n, 44)
	c, _ := f.put(n, 45)
	f.read(a)
	f.settled()
	f.read(b)
	f.settled()
	f.read(a) // a hit: a is now the most recently opened
	f.read(c) // needs room: b goes
	f.settled()
	if !f.cached(a) || f.cached(b) || !f.cached(c) {
		t.Fatalf("cached a=%v b=%v c=%v; want a (opened last) and c", f.cached(a), f.cached(b), f.cached(c))
	}
}
