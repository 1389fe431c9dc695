package cache_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
)

// TestRoomCountsOtherProcessesFills: two engines on one cache directory
// (as two processes of a host): the room check of one counts the other's
// fill in flight, so the cache stays within its limit once both publish.
func TestRoomCountsOtherProcessesFills(t *testing.T) {
	const n, limit = 2 << 20, 5 << 20 // three blobs do not fit
	url, dir := s3test.URL(t), t.TempDir()
	b := newFixture(t, url, dir, limit)
	gate := make(chan struct{})
	a := &fixture{t: t, url: url, dir: dir, wrap: func(l engines.Large) engines.Large { return gated{l, gate} }}
	a.open(limit)
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release) // before a's store closes
	z, _ := b.put(n, 43)
	x, _ := b.put(n, 44)
	y, _ := b.put(n, 45)
	ctx := context.Background()
	if err := b.c.Warm(ctx, z, nil); err != nil {
		t.Fatal(err)
	}
	warmed := make(chan error, 1)
	go func() { warmed <- a.c.Warm(ctx, x, nil) }() // held after its first segment
	deadline := time.Now().Add(20 * time.Second)
	for a.stats().Filling != 1 {
		if time.Now().After(deadline) {
			t.Fatal("a's fill of x not in flight after 20 s")
		}
		time.Sleep(time.Millisecond)
	}
	if err := b.c.Warm(ctx, y, nil); err != nil {
		t.Fatal(err)
	}
	if b.cached(z) || !b.cached(y) {
		t.Fatalf("with a's fill of x in flight, b's fill of y: z cached %v, y cached %v; want z evicted for y (z, x and y are over the limit)", b.cached(z), b.cached(y))
	}
	release()
	select {
	case err := <-warmed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a's fill did not end 30 s after its gate opened")
	}
	if s := b.settled(); s.Bytes > limit || !b.cached(x) {
		t.Fatalf("after both fills: %d bytes cached (limit %d), x cached %v", s.Bytes, limit, b.cached(x))
	}
}
