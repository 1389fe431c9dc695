package metatest

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Host checks the meta.Host contract on the state of the engines share
// opens: pin rows, their renewal and reaping, that a TTL counts on the
// row clock, the arbitration transaction and its lock, and the sweep
// lease. share opens the same storage on every call: two engines from it
// stand for two processes sharing one pool.
//
// No test can move the row clock: rows that must be expired are written
// with a TTL <= 0 (expired on arrival), rows that must live with an hour,
// and the TTL itself is watched passing with short ones.
func Host(t *testing.T, share func(t *testing.T) engines.Engine) {
	host := func(t *testing.T) host {
		t.Helper()
		e := share(t)
		t.Cleanup(func() { e.Close() })
		h := state(t, e).Host
		if h == nil {
			t.Fatalf("%s keeps no meta.Host", e.Name())
		}
		// Subtests share the storage: start each from no rows.
		db, ok := e.(engines.SQL)
		if !ok {
			t.Fatalf("%s keeps a meta.Host outside a SQL database", e.Name())
		}
		if _, err := db.DB().ExecContext(t.Context(), `DELETE FROM gc_pins`); err != nil {
			t.Fatal(err)
		}
		return host{Host: h, e: e}
	}
	t.Run("Rows", func(t *testing.T) { testPinRows(t, host(t)) })
	t.Run("RenewNeverRevives", func(t *testing.T) { testRenew(t, host(t)) })
	t.Run("Reap", func(t *testing.T) { testReap(t, host(t)) })
	t.Run("TTLCounts", func(t *testing.T) { testTTLCounts(t, host(t), host(t)) })
	t.Run("Arbitrate", func(t *testing.T) { testArbitrate(t, host(t)) })
	t.Run("ArbitrationLock", func(t *testing.T) { testArbitrationLock(t, host(t), host(t)) })
	t.Run("SweepLease", func(t *testing.T) { testSweepLease(t, host(t), host(t)) })
}

// The TTLs of rows that outlive a test, and of rows expired on arrival.
const (
	live    = time.Hour
	expired = -time.Second
)

func pinned(t *testing.T, h host, ds []blob.Digest, except string) map[blob.Digest]bool {
	t.Helper()
	var got map[blob.Digest]bool
	err := h.Arbitrate(t.Context(), ds, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		got, err = h.PinnedAmong(ctx, tx, ds, except)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func pinRows(t *testing.T, h host, owner string, ttl time.Duration, ds ...blob.Digest) {
	t.Helper()
	if err := h.PinRows(t.Context(), nil, owner, ds, ttl); err != nil {
		t.Fatal(err)
	}
}

func testPinRows(t *testing.T, h host) {
	ctx := t.Context()
	a, b, c := blob.Sum([]byte("a")), blob.Sum([]byte("b")), blob.Sum([]byte("c"))
	pinRows(t, h, "A", live, a, b)
	pinRows(t, h, "B", live, b)
	all := []blob.Digest{a, b, c}
	if got := pinned(t, h, all, "nobody"); !got[a] || !got[b] || got[c] {
		t.Fatalf("pinned = %v; want a and b", got)
	}
	// Rows of the excepted owner do not count; another owner's do.
	if got := pinned(t, h, all, "A"); got[a] || !got[b] {
		t.Fatalf("pinned except A = %v; want b alone (B's row)", got)
	}
	// A TTL of zero or less writes a row that has already expired.
	pinRows(t, h, "C", 0, c)
	pinRows(t, h, "D", expired, c)
	if got := pinned(t, h, []blob.Digest{c}, "nobody"); got[c] {
		t.Fatal("a row with a TTL of 0 protects its digest (expiry is exclusive)")
	}
	if err := h.DropOwner(ctx, "C"); err != nil {
		t.Fatal(err)
	}
	if err := h.DropOwner(ctx, "D"); err != nil {
		t.Fatal(err)
	}
	// The upsert keeps the later expiry; a re-pin by the same owner is
	// one row.
	pinRows(t, h, "A", expired, a)
	if got := pinned(t, h, []blob.Digest{a}, "nobody"); !got[a] {
		t.Fatal("a re-pin with an earlier expiry shortened the row")
	}
	if n, err := h.PinCount(ctx); n != 3 || err != nil {
		t.Fatalf("PinCount = %d, %v; want 3 rows", n, err)
	}
	if err := h.DropPins(ctx, "A", []blob.Digest{b}); err != nil {
		t.Fatal(err)
	}
	if got := pinned(t, h, all, "B"); !got[a] || got[b] {
		t.Fatalf("after dropping A's b: pinned except B = %v; want a", got)
	}
	if err := h.DropPins(ctx, "A", nil); err != nil {
		t.Fatal(err)
	}
	if n, err := h.PinCount(ctx); n != 2 || err != nil {
		t.Fatalf("PinCount after DropPins of no digests = %d, %v; want 2 (nothing dropped)", n, err)
	}
	if err := h.DropOwner(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	if n, err := h.PinCount(ctx); n != 1 || err != nil {
		t.Fatalf("PinCount after dropping all of A = %d, %v; want B's row", n, err)
	}
	// Many digests at once, as a sweep's batches ask.
	many := make([]blob.Digest, 1200)
	for i := range many {
		many[i] = blob.Sum([]byte{byte(i), byte(i >> 8), 'm'})
	}
	pinRows(t, h, "M", live, append(many[:1100:1100], many[0])...) // a repeat too
	if got := pinned(t, h, many, "nobody"); len(got) != 1100 || got[many[1150]] {
		t.Fatalf("PinnedAmong over %d digests found %d; want the 1100 pinned", len(many), len(got))
	}
	if err := h.DropOwner(ctx, "M"); err != nil {
		t.Fatal(err)
	}
	// Inside a caller's transaction, the row commits with it or not at all.
	err := h.Arbitrate(ctx, []blob.Digest{c}, func(ctx context.Context, tx *sql.Tx) error {
		if err := h.PinRows(ctx, tx, "C", []blob.Digest{c}, live); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("Arbitrate = %v; want fn's error", err)
	}
	if got := pinned(t, h, []blob.Digest{c}, "nobody"); got[c] {
		t.Fatal("a pin row written in a rolled-back transaction survived")
	}
}

var errRollback = errors.New("roll back")

func testRenew(t *testing.T, h host) {
	ctx := t.Context()
	kept, dead := blob.Sum([]byte("live")), blob.Sum([]byte("dead"))
	pinRows(t, h, "A", live, kept)
	pinRows(t, h, "A", expired, dead)
	pinRows(t, h, "B", expired, dead)
	// The dead rows have expired: renewal moves only the live one.
	moved, err := h.RenewPins(ctx, "A", live)
	if len(moved) != 1 || !moved[kept] || err != nil {
		t.Fatalf("RenewPins = %v, %v; want the live row alone", moved, err)
	}
	if got := pinned(t, h, []blob.Digest{kept, dead}, "nobody"); !got[kept] || got[dead] {
		t.Fatalf("pinned after renewal = %v; want the renewed row only (an expired row is never revived)", got)
	}
	// Renewing no rows moves none.
	if moved, err := h.RenewPins(ctx, "nobody", live); len(moved) != 0 || err != nil {
		t.Fatalf("RenewPins of an owner without rows = %v, %v", moved, err)
	}
}

func testReap(t *testing.T, h host) {
	ctx := t.Context()
	k1, k2 := blob.Sum([]byte("k1")), blob.Sum([]byte("k2"))
	pinRows(t, h, "A", expired, k1)
	pinRows(t, h, "B", live, k1)
	pinRows(t, h, "A", expired, k2)
	pinRows(t, h, "B", 0, k2)
	n, err := h.ReapPins(ctx)
	if n != 3 || err != nil {
		t.Fatalf("ReapPins = %d, %v; want exactly the 3 expired rows", n, err)
	}
	if got := pinned(t, h, []blob.Digest{k1, k2}, "nobody"); !got[k1] || got[k2] {
		t.Fatalf("after reaping: %v; want k1's live row to remain", got)
	}
	if n, err := h.PinCount(ctx); n != 1 || err != nil {
		t.Fatalf("PinCount = %d, %v; want 1", n, err)
	}
	if n, err := h.ReapPins(ctx); n != 0 || err != nil {
		t.Fatalf("second ReapPins = %d, %v; want nothing left to reap", n, err)
	}
}

// testTTLCounts: a row protects its digest for its TTL on the engine's
// clock, and renewal counts a fresh TTL from when it runs; another
// process (b) sees the same. Renewing one owner leaves another's rows
// alone.
func testTTLCounts(t *testing.T, a, b host) {
	ctx := t.Context()
	// Long against a loaded machine's scheduling delays: the renewal must
	// run before the row lapses (400 ms lapsed first, beside a CPU hog).
	const ttl = 2 * time.Second
	d, other := blob.Sum([]byte("ttl")), blob.Sum([]byte("other's"))
	start := time.Now()
	pinRows(t, a, "A", ttl, d)
	pinRows(t, a, "B", ttl, other)
	if got := pinned(t, b, []blob.Digest{d, other}, "nobody"); !got[d] || !got[other] {
		t.Fatalf("pinned right after pinning with a TTL of %s = %v; want both", ttl, got)
	}
	time.Sleep(ttl / 4)
	renewed := time.Now()
	if moved, err := a.RenewPins(ctx, "A", ttl); !moved[d] || err != nil {
		t.Fatalf("RenewPins %s into the TTL of %s = %v, %v; want the row moved", time.Since(start), ttl, moved, err)
	}
	// B's row was not renewed: it lapses a TTL after it was written, A's a
	// TTL after its renewal.
	lapsed := func(x blob.Digest, from time.Time, what string) {
		t.Helper()
		for deadline := from.Add(ttl + 10*time.Second); ; time.Sleep(20 * time.Millisecond) {
			if !pinned(t, b, []blob.Digest{x}, "nobody")[x] {
				if d := time.Since(from); d < ttl {
					t.Fatalf("%s lapsed %s after it was written; want no sooner than its TTL, %s", what, d, ttl)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still protects its digest %s after it was written, with a TTL of %s", what, time.Since(from), ttl)
			}
		}
	}
	lapsed(other, start, "a row renewal of another owner did not touch")
	lapsed(d, renewed, "a renewed row")
	if moved, err := a.RenewPins(ctx, "A", ttl); len(moved) != 0 || err != nil {
		t.Fatalf("RenewPins after the row lapsed = %v, %v; want nothing revived", moved, err)
	}
}

func testArbitrate(t *testing.T, h host) {
	ctx := t.Context()
	kv, ok := h.e.(engines.KV)
	if !ok {
		t.Skip("not a kv engine")
	}
	del, ok := h.e.(engines.TxDeleter)
	if !ok {
		t.Fatalf("%s keeps a meta.Host but cannot delete in its transaction (engines.TxDeleter)", h.e.Name())
	}
	d := put(t, kv, []byte("arbitrated"))
	missing := blob.Sum([]byte("never stored"))
	// A failing fn rolls the delete back.
	err := h.Arbitrate(ctx, []blob.Digest{d}, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := del.DeleteManyTx(ctx, tx, []blob.Digest{d}); err != nil {
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
		sizes, err = del.DeleteManyTx(ctx, tx, []blob.Digest{d, missing})
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
func testArbitrationLock(t *testing.T, sweeper, pinner host) {
	ctx := t.Context()
	d := blob.Sum([]byte("contended"))
	inside := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- sweeper.Arbitrate(ctx, []blob.Digest{d}, func(ctx context.Context, tx *sql.Tx) error {
			got, err := sweeper.PinnedAmong(ctx, tx, []blob.Digest{d}, "sweeper")
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
	go func() { pinDone <- pinner.PinRows(ctx, nil, "pinner", []blob.Digest{d}, live) }()
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
	if got := pinned(t, sweeper, []blob.Digest{d}, "sweeper"); !got[d] {
		t.Fatal("the pin row that waited for the lock is not seen by the next arbitration")
	}
}

func testSweepLease(t *testing.T, a, b host) {
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

// host is a Host and the engine whose state it is.
type host struct {
	meta.Host
	e engines.Engine
}
