package enginetest

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// GCHost checks the engines.GCHost contract: pin rows, their renewal and
// reaping, the arbitration transaction and its lock, and the sweep lease.
// share opens the same storage on every call: two engines from it stand
// for two processes sharing one pool.
func GCHost(t *testing.T, share func(t *testing.T) engines.Engine) {
	host := func(t *testing.T) engines.GCHost {
		t.Helper()
		e := share(t)
		t.Cleanup(func() { e.Close() })
		h, ok := e.(engines.GCHost)
		if !ok {
			t.Fatalf("%s is not an engines.GCHost", e.Name())
		}
		// Subtests share the storage: start each from no rows.
		if _, err := h.ReapPins(t.Context(), time.Unix(0, math.MaxInt64)); err != nil {
			t.Fatal(err)
		}
		return h
	}
	t.Run("Rows", func(t *testing.T) { testPinRows(t, host(t)) })
	t.Run("RenewNeverRevives", func(t *testing.T) { testRenew(t, host(t)) })
	t.Run("Reap", func(t *testing.T) { testReap(t, host(t)) })
	t.Run("Arbitrate", func(t *testing.T) { testArbitrate(t, host(t)) })
	t.Run("ArbitrationLock", func(t *testing.T) { testArbitrationLock(t, host(t), host(t)) })
	t.Run("SweepLease", func(t *testing.T) { testSweepLease(t, host(t), host(t)) })
}

var gcBase = time.Unix(1_900_000_000, 0)

func gcAt(sec int) time.Time { return gcBase.Add(time.Duration(sec) * time.Second) }

func pinned(t *testing.T, h engines.GCHost, ds []blob.Digest, now time.Time, except string) map[blob.Digest]bool {
	t.Helper()
	var got map[blob.Digest]bool
	err := h.Arbitrate(t.Context(), ds, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		got, err = h.PinnedAmong(ctx, tx, ds, now, except)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func testPinRows(t *testing.T, h engines.GCHost) {
	ctx := t.Context()
	a, b, c := blob.Sum([]byte("a")), blob.Sum([]byte("b")), blob.Sum([]byte("c"))
	if err := h.PinRows(ctx, nil, "A", []blob.Digest{a, b}, gcAt(60)); err != nil {
		t.Fatal(err)
	}
	if err := h.PinRows(ctx, nil, "B", []blob.Digest{b}, gcAt(60)); err != nil {
		t.Fatal(err)
	}
	all := []blob.Digest{a, b, c}
	if got := pinned(t, h, all, gcAt(0), "nobody"); !got[a] || !got[b] || got[c] {
		t.Fatalf("pinned = %v; want a and b", got)
	}
	// Rows of the excepted owner do not count; another owner's do.
	if got := pinned(t, h, all, gcAt(0), "A"); got[a] || !got[b] {
		t.Fatalf("pinned except A = %v; want b alone (B's row)", got)
	}
	if got := pinned(t, h, all, gcAt(60), "nobody"); len(got) != 0 {
		t.Fatalf("pinned at expiry = %v; want none (expiry is exclusive)", got)
	}
	// The upsert keeps the later expiry; a re-pin by the same owner is
	// one row.
	if err := h.PinRows(ctx, nil, "A", []blob.Digest{a}, gcAt(30)); err != nil {
		t.Fatal(err)
	}
	if got := pinned(t, h, []blob.Digest{a}, gcAt(45), "nobody"); !got[a] {
		t.Fatal("a re-pin with an earlier expiry shortened the row")
	}
	if n, err := h.PinCount(ctx, gcAt(0)); n != 3 || err != nil {
		t.Fatalf("PinCount = %d, %v; want 3 rows", n, err)
	}
	if err := h.DropPins(ctx, "A", []blob.Digest{b}); err != nil {
		t.Fatal(err)
	}
	if got := pinned(t, h, all, gcAt(0), "B"); !got[a] || got[b] {
		t.Fatalf("after dropping A's b: pinned except B = %v; want a", got)
	}
	if err := h.DropPins(ctx, "A", nil); err != nil {
		t.Fatal(err)
	}
	if n, err := h.PinCount(ctx, gcAt(0)); n != 2 || err != nil {
		t.Fatalf("PinCount after DropPins of no digests = %d, %v; want 2 (nothing dropped)", n, err)
	}
	if err := h.DropOwner(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	if n, err := h.PinCount(ctx, gcAt(0)); n != 1 || err != nil {
		t.Fatalf("PinCount after dropping all of A = %d, %v; want B's row", n, err)
	}
	// Many digests at once, as a sweep's batches ask.
	many := make([]blob.Digest, 1200)
	for i := range many {
		many[i] = blob.Sum([]byte{byte(i), byte(i >> 8), 'm'})
	}
	if err := h.PinRows(ctx, nil, "M", append(many[:1100:1100], many[0]), gcAt(60)); err != nil { // a repeat too
		t.Fatal(err)
	}
	if got := pinned(t, h, many, gcAt(0), "nobody"); len(got) != 1100 || got[many[1150]] {
		t.Fatalf("PinnedAmong over %d digests found %d; want the 1100 pinned", len(many), len(got))
	}
	if err := h.DropOwner(ctx, "M"); err != nil {
		t.Fatal(err)
	}
	// Inside a caller's transaction, the row commits with it or not at all.
	err := h.Arbitrate(ctx, []blob.Digest{c}, func(ctx context.Context, tx *sql.Tx) error {
		if err := h.PinRows(ctx, tx, "C", []blob.Digest{c}, gcAt(60)); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("Arbitrate = %v; want fn's error", err)
	}
	if got := pinned(t, h, []blob.Digest{c}, gcAt(0), "nobody"); got[c] {
		t.Fatal("a pin row written in a rolled-back transaction survived")
	}
}

var errRollback = errors.New("roll back")

func testRenew(t *testing.T, h engines.GCHost) {
	ctx := t.Context()
	live, dead := blob.Sum([]byte("live")), blob.Sum([]byte("dead"))
	if err := h.PinRows(ctx, nil, "A", []blob.Digest{live}, gcAt(60)); err != nil {
		t.Fatal(err)
	}
	if err := h.PinRows(ctx, nil, "A", []blob.Digest{dead}, gcAt(10)); err != nil {
		t.Fatal(err)
	}
	if err := h.PinRows(ctx, nil, "B", []blob.Digest{dead}, gcAt(10)); err != nil {
		t.Fatal(err)
	}
	// At 20 the dead row has expired: renewal moves only the live one.
	moved, err := h.RenewPins(ctx, "A", gcAt(20), gcAt(120))
	if len(moved) != 1 || !moved[live] || err != nil {
		t.Fatalf("RenewPins = %v, %v; want the live row alone", moved, err)
	}
	if got := pinned(t, h, []blob.Digest{live, dead}, gcAt(100), "nobody"); !got[live] || got[dead] {
		t.Fatalf("pinned at 100 = %v; want the renewed row only (an expired row is never revived)", got)
	}
	// Another owner's rows are untouched.
	if got := pinned(t, h, []blob.Digest{dead}, gcAt(5), "A"); !got[dead] {
		t.Fatal("renewing A changed B's row")
	}
}

func testReap(t *testing.T, h engines.GCHost) {
	ctx := t.Context()
	k1, k2 := blob.Sum([]byte("k1")), blob.Sum([]byte("k2"))
	for _, r := range []struct {
		owner string
		d     blob.Digest
		exp   int
	}{{"A", k1, 10}, {"B", k1, 100}, {"A", k2, 10}, {"B", k2, 20}} {
		if err := h.PinRows(ctx, nil, r.owner, []blob.Digest{r.d}, gcAt(r.exp)); err != nil {
			t.Fatal(err)
		}
	}
	n, err := h.ReapPins(ctx, gcAt(20))
	if n != 3 || err != nil {
		t.Fatalf("ReapPins = %d, %v; want exactly the 3 rows expired at 20", n, err)
	}
	if got := pinned(t, h, []blob.Digest{k1, k2}, gcAt(50), "nobody"); !got[k1] || got[k2] {
		t.Fatalf("after reaping: %v; want k1's live row to remain", got)
	}
	if n, err := h.PinCount(ctx, gcAt(0)); n != 1 || err != nil {
		t.Fatalf("PinCount = %d, %v; want 1", n, err)
	}
}

func testArbitrate(t *testing.T, h engines.GCHost) {
	ctx := t.Context()
	kv, ok := h.(engines.KV)
	if !ok {
		t.Skip("not a kv engine")
	}
	d := put(t, kv, []byte("arbitrated"))
	missing := blob.Sum([]byte("never stored"))
	// A failing fn rolls the delete back.
	err := h.Arbitrate(ctx, []blob.Digest{d}, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := h.DeleteManyTx(ctx, tx, []blob.Digest{d}); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("Arbitrate = %v; want fn's error", err)
	}
	if ok, err := kv.Has(ctx, d); !ok || err != nil {
		t.Fatalf("Has after a rolled-back delete = %v, %v; want the blob", ok, err)
	}
	var sizes []int64
	err = h.Arbitrate(ctx, []blob.Digest{d, missing}, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		sizes, err = h.DeleteManyTx(ctx, tx, []blob.Digest{d, missing})
		return err
	})
	if err != nil || len(sizes) != 2 || sizes[0] != int64(len("arbitrated")) || sizes[1] != -1 {
		t.Fatalf("DeleteManyTx = %v, %v; want [%d -1]", sizes, err, len("arbitrated"))
	}
	if ok, err := kv.Has(ctx, d); ok || err != nil {
		t.Fatalf("Has after a committed delete = %v, %v", ok, err)
	}
}

// testArbitrationLock: a pin row of a digest cannot commit while another
// engine (process) arbitrates that digest; it commits after, and the next
// arbitration sees it.
func testArbitrationLock(t *testing.T, sweeper, pinner engines.GCHost) {
	ctx := t.Context()
	d := blob.Sum([]byte("contended"))
	inside := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- sweeper.Arbitrate(ctx, []blob.Digest{d}, func(ctx context.Context, tx *sql.Tx) error {
			got, err := sweeper.PinnedAmong(ctx, tx, []blob.Digest{d}, time.Now(), "sweeper")
			if err == nil && got[d] {
				err = errors.New("pinned before the pinner ran")
			}
			close(inside)
			<-release
			return err
		})
	}()
	<-inside
	pinDone := make(chan error, 1)
	go func() { pinDone <- pinner.PinRows(ctx, nil, "pinner", []blob.Digest{d}, time.Now().Add(time.Hour)) }()
	select {
	case err := <-pinDone:
		close(release)
		t.Fatalf("PinRows returned (%v) while an arbitration of the digest held its lock", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-pinDone; err != nil {
		t.Fatal(err)
	}
	if got := pinned(t, sweeper, []blob.Digest{d}, time.Now(), "sweeper"); !got[d] {
		t.Fatal("the pin row that waited for the lock is not seen by the next arbitration")
	}
}

func testSweepLease(t *testing.T, a, b engines.GCHost) {
	ctx := t.Context()
	la, held, err := a.SweepLease(ctx)
	if err != nil || !held {
		t.Fatalf("SweepLease = %v, %v; want it held", held, err)
	}
	if err := la.Check(ctx); err != nil {
		t.Fatalf("Check of a held lease: %v", err)
	}
	if lb, held, err := b.SweepLease(ctx); held || err != nil || lb != nil {
		t.Fatalf("second SweepLease = %v, %v; want refused while the first is held", held, err)
	}
	la.Release()
	la.Release() // idempotent
	lb, held, err := b.SweepLease(ctx)
	if err != nil || !held {
		t.Fatalf("SweepLease after release = %v, %v; want it held", held, err)
	}
	lb.Release()
}
