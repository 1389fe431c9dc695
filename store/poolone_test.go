package store_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/store"
)

// TestSweepPoolOfOne: outside fleet mode a PostgreSQL kv engine may have a
// pool of one connection. A sweep then still ends, and pins and puts made
// beside it are served: the sweep lease holds a session of its own, not
// the pool's only connection (ReapPins used to wait for it forever).
func TestSweepPoolOfOne(t *testing.T) {
	dsn := pgtest.DSN(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	kv := pgKV(t, dsn+sep+"pool_max_conns=1")
	s, err := store.Open(t.Context(), store.Config{KV: kv, GCDelay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.GC().Register(&refs{m: map[blob.Digest]bool{}}) // nothing links anything
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	kept, pin, err := s.Put(ctx, bytes.NewReader([]byte("pinned")), 6)
	if err != nil {
		t.Fatal(err)
	}
	defer pin.Release()
	gone, p2, err := s.Put(ctx, bytes.NewReader([]byte("garbage")), 7)
	if err != nil {
		t.Fatal(err)
	}
	p2.Release()
	// Sweeps end, one after another, and take the garbage once its delay
	// has passed; the pinned blob stays.
	for i := 1; ; i++ {
		if _, err := s.Sweep(ctx); err != nil {
			t.Fatalf("sweep %d with a pool of one connection: %v (within 30s: %v)", i, err, ctx.Err())
		}
		ok, err := s.Has(ctx, gone)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if i == 50 {
			t.Fatalf("the unpinned blob is still there after %d sweeps", i)
		}
	}
	if ok, err := s.Has(ctx, kept); err != nil || !ok {
		t.Fatalf("the pinned blob after the sweeps: %v %v", ok, err)
	}
}
