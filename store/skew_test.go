package store_test

import (
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/local"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/gc/gctest"
	"github.com/alkblobfs/alkblobfs/store"
)

// The skew tests run on a short TTL and window so that they can watch a
// pin row through more than one life.
const (
	skewTTL    = 3 * time.Second
	skewWindow = time.Second
	// skewSlack covers the sweeping loop's period and a loaded machine.
	skewSlack = 2 * time.Second
	skew      = 5 * time.Minute
)

// skewPool opens instances of one pool (one database, one large tier), as
// separate processes or hosts would, each with its clock (the gc.Clock,
// what is left of the host's clock in a process) off by skew.
type skewPool func(t *testing.T, skew time.Duration) *store.Store

func sqliteSkewPool(t *testing.T) skewPool {
	dir := t.TempDir()
	return func(t *testing.T, skew time.Duration) *store.Store {
		kv, err := sqlite.Open(t.Context(), filepath.Join(dir, "kv.db"))
		if err != nil {
			t.Fatal(err)
		}
		large, err := local.Open(t.Context(), filepath.Join(dir, "large"), nil)
		if err != nil {
			t.Fatal(err)
		}
		return openSkewed(t, store.Config{KV: kv, Large: large}, skew)
	}
}

func pgSkewPool(t *testing.T) skewPool {
	dsn := pgtest.DSN(t)
	return func(t *testing.T, skew time.Duration) *store.Store {
		return openSkewed(t, store.Config{KV: pgKV(t, dsn), Large: pgLarge(t, dsn), Fleet: true}, skew)
	}
}

func openSkewed(t *testing.T, cfg store.Config, skew time.Duration) *store.Store {
	cfg.GCDelay, cfg.PinTTL, cfg.Clock = skewWindow, skewTTL, gctest.Skewed(skew)
	// A holder killed under its store logs its failing renewals.
	cfg.Logger = slog.New(slog.DiscardHandler)
	s := openWith(t, cfg)
	s.GC().Register(&refs{m: map[blob.Digest]bool{}})
	return s
}

// TestSkewSQLite: two processes on one SQLite file whose clocks disagree
// by ten minutes agree on every pin row: the rows are timed by the host's
// boot clock, not by either process's.
func TestSkewSQLite(t *testing.T) { testSkew(t, sqliteSkewPool) }

// TestSkewPostgres: two hosts on one PostgreSQL database whose clocks
// disagree by ten minutes agree on every pin row: the rows are timed by the
// server's clock.
func TestSkewPostgres(t *testing.T) { testSkew(t, pgSkewPool) }

func testSkew(t *testing.T, pool func(*testing.T) skewPool) {
	t.Run("AheadSweeperSparesPins", func(t *testing.T) { testSkewAheadSweeper(t, pool(t)) })
	t.Run("BehindSweeperCollectsTheDead", func(t *testing.T) { testSkewBehindSweeper(t, pool(t)) })
}

// testSkewAheadSweeper: A's clock is 5 minutes slow, B's 5 minutes fast.
// Everything A pins — its puts' pins, a blob it holds open — survives B's
// direct deletes and B's sweeps for several TTLs, while an unpinned blob
// is collected within TTL + window; once A releases, B collects the rest
// within TTL + window.
func testSkewAheadSweeper(t *testing.T, open skewPool) {
	ctx := t.Context()
	a := open(t, -skew)
	b := open(t, +skew)
	small, pinSmall := putPinned(t, a, randBytes(100))
	large, pinLarge := putPinned(t, a, randBytes(threshold*3))
	opened, pin := putPinned(t, b, randBytes(150))
	pin.Release()
	pinOpen, err := a.Pin(ctx, opened) // an open file on A's mount
	if err != nil {
		t.Fatal(err)
	}
	free, pin := putPinned(t, b, randBytes(120))
	pin.Release()
	held := map[string]blob.Digest{"A's put": small, "A's large put": large, "the blob A holds open": opened}

	refused := func() {
		t.Helper()
		for what, d := range held {
			if err := b.Delete(ctx, d); !errors.Is(err, store.ErrGcRefuse) {
				t.Fatalf("B's delete of %s (%s) = %v; want ErrGcRefuse: B's clock, 10 min ahead of A's, decided A's pin row had expired", what, d.Short(), err)
			}
		}
	}
	refused()
	// B sweeps for longer than two TTLs while A holds its pins (A renews
	// on its own, every TTL/3).
	start := time.Now()
	freed := time.Duration(0)
	for time.Since(start) < 2*skewTTL+skewWindow {
		sweep(t, b)
		for what, d := range held {
			if !has(t, b, d) {
				t.Fatalf("B's sweep %s after the start deleted %s (%s), pinned by A", time.Since(start).Round(time.Millisecond), what, d.Short())
			}
		}
		if freed == 0 && !has(t, b, free) {
			freed = time.Since(start)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if freed == 0 || freed > skewTTL+skewWindow+skewSlack {
		t.Fatalf("the unpinned blob was collected after %s; want within TTL + window (%s)", freed, skewTTL+skewWindow)
	}
	refused()

	pinSmall.Release()
	pinLarge.Release()
	pinOpen.Release()
	collected(t, b, skewTTL+skewWindow+skewSlack, small, large, opened)
}

// testSkewBehindSweeper: A's clock is 5 minutes fast and B's 5 minutes
// slow; A dies without closing, so its rows stay until they expire. They
// protect A's blobs while they would still be renewed, and B collects the
// blobs within TTL + window of A's death: A's fast clock does not make its
// rows outlive it in B's eyes.
func testSkewBehindSweeper(t *testing.T, open skewPool) {
	ctx := t.Context()
	a := open(t, +skew)
	b := open(t, -skew)
	d, _ := putPinned(t, a, randBytes(100)) // never released: A dies holding it
	if err := a.GC().Renew(ctx); err != nil {
		t.Fatal(err)
	}
	// A dies: its kv engine goes away under it, as with kill -9; its rows
	// are neither renewed nor dropped.
	died := time.Now()
	if err := a.KV().Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, d); !errors.Is(err, store.ErrGcRefuse) {
		t.Fatalf("B's delete of the blob A pinned just before dying = %v; want ErrGcRefuse", err)
	}
	collected(t, b, skewTTL+skewWindow+skewSlack-time.Since(died), d)
}

// collected sweeps s until none of ds is left, and fails if that takes
// longer than within.
func collected(t *testing.T, s *store.Store, within time.Duration, ds ...blob.Digest) {
	t.Helper()
	start := time.Now()
	for {
		sweep(t, s)
		left := 0
		for _, d := range ds {
			if has(t, s, d) {
				left++
			}
		}
		if left == 0 {
			return
		}
		if time.Since(start) > within {
			t.Fatalf("%d of %d unpinned blobs still there after %s of sweeping; want all collected within TTL + window (%s)",
				left, len(ds), time.Since(start).Round(time.Millisecond), skewTTL+skewWindow)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
