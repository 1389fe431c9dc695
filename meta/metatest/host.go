package metatest

import (
	"context"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Host checks the meta.Host contract on the state of the engines share
// opens: pin rows, their renewal and reaping, that a TTL counts on the
// row clock, a delete's arbitration (and that one which fails commits
// nothing) and its lock, and the sweep lease. share opens the same
// storage on every call: two engines from it stand for two processes
// sharing one pool.
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
	t.Run("ArbitrateFailsWhole", func(t *testing.T) { testArbitrateFails(t, host(t)) })
	t.Run("ArbitrationLock", func(t *testing.T) { testArbitrationLock(t, host(t), host(t)) })
	t.Run("SweepLease", func(t *testing.T) { testSweepLease(t, host(t), host(t)) })
}

// The TTLs of rows that outlive a test, and of rows expired on arrival.
const (
	live    = time.Hour
	expired = -time.Second
)

// pinned returns which of ds a pin row protects: an arbitration of ds
// whose Outside deletes nothing (the kv rows are not touched either).
func pinned(t *testing.T, h host, ds []blob.Digest) map[blob.Digest]bool {
	t.Helper()
	out, err := h.Arbitrate(t.Context(), meta.Arbitration{Digests: ds, Outside: deleteNothing})
	if err != nil {
		t.Fatal(err)
	}
	return protected(ds, out)
}

// deleteNothing is an Arbitration.Outside that holds none of ds.
func deleteNothing(_ context.Context, ds []blob.Digest) ([]int64, error) {
	sizes := make([]int64, len(ds))
	for i := range sizes {
		sizes[i] = meta.NotHeld
	}
	return sizes, nil
}

// protected returns the digests of ds whose outcome in out is
// meta.Protected.
func protected(ds []blob.Digest, out []int64) map[blob.Digest]bool {
	got := make(map[blob.Digest]bool)
	for i, n := range out {
		if n == meta.Protected {
			got[ds[i]] = true
		}
	}
	return got
}

func pinRows(t *testing.T, h host, owner string, ttl time.Duration, ds ...blob.Digest) {
	t.Helper()
	if err := h.PinRows(t.Context(), owner, ds, ttl); err != nil {
		t.Fatal(err)
	}
}

func testPinRows(t *testing.T, h host) {
	ctx := t.Context()
	a, b, c := blob.Sum([]byte("a")), blob.Sum([]byte("b")), blob.Sum([]byte("c"))
	pinRows(t, h, "A", live, a, b)
	pinRows(t, h, "B", live, b)
	all := []blob.Digest{a, b, c}
	if got := pinned(t, h, all); !got[a] || !got[b] || got[c] {
		t.Fatalf("pinned = %v; want a and b", got)
	}
	// A TTL of zero or less writes a row that has already expired.
	pinRows(t, h, "C", 0, c)
	pinRows(t, h, "D", expired, c)
	if got := pinned(t, h, []blob.Digest{c}); got[c] {
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
	if got := pinned(t, h, []blob.Digest{a}); !got[a] {
		t.Fatal("a re-pin with an earlier expiry shortened the row")
	}
	if n, err := h.PinCount(ctx); n != 3 || err != nil {
		t.Fatalf("PinCount = %d, %v; want 3 rows", n, err)
	}
	if err := h.DropPins(ctx, "A", []blob.Digest{b}); err != nil {
		t.Fatal(err)
	}
	// Every owner's rows count: B's row still protects b.
	if got := pinned(t, h, all); !got[a] || !got[b] {
		t.Fatalf("after dropping A's b: pinned = %v; want a, and b by B's row", got)
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
	if got := pinned(t, h, all); got[a] || !got[b] {
		t.Fatalf("after dropping all of A: pinned = %v; want b alone", got)
	}
	// Many digests at once, as a sweep's batches ask.
	many := make([]blob.Digest, 1200)
	for i := range many {
		many[i] = blob.Sum([]byte{byte(i), byte(i >> 8), 'm'})
	}
	pinRows(t, h, "M", live, append(many[:1100:1100], many[0])...) // a repeat too
	if got := pinned(t, h, many); len(got) != 1100 || got[many[1150]] {
		t.Fatalf("an arbitration of %d digests found %d pinned; want the 1100 pinned", len(many), len(got))
	}
	if err := h.DropOwner(ctx, "M"); err != nil {
		t.Fatal(err)
	}
}

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
	if got := pinned(t, h, []blob.Digest{kept, dead}); !got[kept] || got[dead] {
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
	if got := pinned(t, h, []blob.Digest{k1, k2}); !got[k1] || got[k2] {
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
	if got := pinned(t, b, []blob.Digest{d, other}); !got[d] || !got[other] {
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
			if !pinned(t, b, []blob.Digest{x})[x] {
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

// testArbitrate: one arbitration reads every owner's pin rows and each
// Liveness, deletes the kv rows of the rest, and answers per digest; its
// Outside form deletes through Outside instead, once, with the survivors
// alone.
func testArbitrate(t *testing.T, h host) {
	ctx := t.Context()
	kv, ok := h.e.(engines.KV)
	if !ok {
		t.Skip("not a kv engine")
	}
	d, p, l := put(t, kv, []byte("arbitrated")), put(t, kv, []byte("pinned")), put(t, kv, []byte("listed"))
	missing := blob.Sum([]byte("never stored"))
	pinRows(t, h, "another process", live, p)
	listed := liveTable(t, h, l)
	ds := []blob.Digest{d, p, l, missing, d}
	out, err := h.Arbitrate(ctx, meta.Arbitration{Digests: ds, Live: []meta.Liveness{listed}})
	want := []int64{int64(len("arbitrated")), meta.Protected, meta.Protected, meta.NotHeld, meta.NotHeld}
	if err != nil || !slices.Equal(out, want) {
		t.Fatalf("Arbitrate = %v, %v; want %v (a repeat finds the row gone)", out, err, want)
	}
	for _, c := range []struct {
		d    blob.Digest
		held bool
	}{{d, false}, {p, true}, {l, true}} {
		if ok, err := kv.Has(ctx, c.d); ok != c.held || err != nil {
			t.Fatalf("Has(%s) after the arbitration = %v, %v; want %v", c.d.Short(), ok, err, c.held)
		}
	}

	// The Outside form: the survivors go to Outside, once; no kv row goes.
	o := put(t, kv, []byte("outside"))
	var calls [][]blob.Digest
	outside := func(_ context.Context, ds []blob.Digest) ([]int64, error) {
		calls = append(calls, slices.Clone(ds))
		return []int64{7}, nil
	}
	out, err = h.Arbitrate(ctx, meta.Arbitration{Digests: []blob.Digest{p, o, l}, Live: []meta.Liveness{listed}, Outside: outside})
	if want := []int64{meta.Protected, 7, meta.Protected}; err != nil || !slices.Equal(out, want) {
		t.Fatalf("Arbitrate with Outside = %v, %v; want %v", out, err, want)
	}
	if len(calls) != 1 || !slices.Equal(calls[0], []blob.Digest{o}) {
		t.Fatalf("Outside was called with %v; want once, with the one survivor", calls)
	}
	if ok, err := kv.Has(ctx, o); !ok || err != nil {
		t.Fatalf("Has after an arbitration with Outside = %v, %v; want the kv row kept", ok, err)
	}
	// Outside's error is the arbitration's.
	errOutside := errors.New("outside failed")
	_, err = h.Arbitrate(ctx, meta.Arbitration{Digests: []blob.Digest{o}, Outside: func(context.Context, []blob.Digest) ([]int64, error) {
		return nil, errOutside
	}})
	if !errors.Is(err, errOutside) {
		t.Fatalf("Arbitrate = %v; want Outside's error", err)
	}
	// Nothing protected and nothing to delete: Outside is not called.
	calls = nil
	if _, err := h.Arbitrate(ctx, meta.Arbitration{Digests: []blob.Digest{p}, Outside: outside}); err != nil || calls != nil {
		t.Fatalf("Arbitrate of a pinned digest alone = %v; Outside called with %v, want not at all", err, calls)
	}
	// A Liveness that fails fails the arbitration, which deletes nothing.
	gone := liveTable(t, h)
	if _, err := h.e.(engines.SQL).DB().ExecContext(ctx, `DROP TABLE metatest_live`); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Arbitrate(ctx, meta.Arbitration{Digests: []blob.Digest{o}, Live: []meta.Liveness{gone}}); err == nil {
		t.Fatal("an arbitration whose liveness table is gone succeeded")
	}
	if ok, err := kv.Has(ctx, o); !ok || err != nil {
		t.Fatalf("Has after a failed arbitration = %v, %v; want the kv row kept", ok, err)
	}
}

// testArbitrateFails: an arbitration that fails after a row was deleted
// commits nothing of it, and says what failed: a delete refused on the
// second digest (a trigger that raises, after the first digest's row
// went), and an Outside that answers for more digests than it was given.
func testArbitrateFails(t *testing.T, h host) {
	ctx := t.Context()
	kv, ok := h.e.(engines.KV)
	if !ok {
		t.Skip("not a kv engine")
	}
	first, second := put(t, kv, []byte("deleted, then restored")), put(t, kv, []byte("refused"))
	refuseDelete(t, h, second)
	out, err := h.Arbitrate(ctx, meta.Arbitration{Digests: []blob.Digest{first, second}})
	if err == nil || !strings.Contains(err.Error(), "metatest refuses") || !strings.Contains(err.Error(), "delete") {
		t.Fatalf("Arbitrate with the second delete refused = %v, %v; want an error naming the delete and the trigger's message", out, err)
	}
	if out != nil {
		t.Fatalf("Arbitrate failed and answered %v; want no answer", out)
	}
	for _, d := range []blob.Digest{first, second} {
		if ok, err := kv.Has(ctx, d); !ok || err != nil {
			t.Fatalf("Has(%s) after a failed arbitration = %v, %v; want the row kept (nothing of it commits)", d.Short(), ok, err)
		}
	}

	// Outside's answer has one size per survivor, or the arbitration fails.
	out, err = h.Arbitrate(ctx, meta.Arbitration{Digests: []blob.Digest{first}, Outside: func(context.Context, []blob.Digest) ([]int64, error) {
		return []int64{1, 2}, nil
	}})
	if err == nil || !strings.Contains(err.Error(), "2 sizes for 1") || out != nil {
		t.Fatalf("Arbitrate with 2 sizes from Outside for 1 digest = %v, %v; want an error that counts them", out, err)
	}
	if ok, err := kv.Has(ctx, first); !ok || err != nil {
		t.Fatalf("Has after a failed arbitration with Outside = %v, %v; want the kv row kept", ok, err)
	}
}

// refuseDelete makes the delete of d's blob row fail in h's database, in
// a trigger that raises after the row is gone, until the test ends.
func refuseDelete(t *testing.T, h host, d blob.Digest) {
	t.Helper()
	e := h.e.(engines.SQL)
	var qs, undo []string
	switch x := hex.EncodeToString(d[:]); e.Dialect() {
	case "sqlite":
		qs = []string{`CREATE TRIGGER metatest_refuse AFTER DELETE ON blobs WHEN OLD.digest = X'` + x + `'
			BEGIN SELECT RAISE(ABORT, 'metatest refuses this delete'); END`}
		undo = []string{`DROP TRIGGER metatest_refuse`}
	case "postgres":
		qs = []string{
			`CREATE FUNCTION metatest_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN RAISE EXCEPTION 'metatest refuses this delete'; END $$`,
			`CREATE TRIGGER metatest_refuse AFTER DELETE ON blobs FOR EACH ROW
			WHEN (OLD.digest = '\x` + x + `'::bytea) EXECUTE FUNCTION metatest_refuse()`,
		}
		undo = []string{`DROP TRIGGER metatest_refuse ON blobs`, `DROP FUNCTION metatest_refuse()`}
	default:
		t.Fatalf("no trigger for dialect %q", e.Dialect())
	}
	for _, q := range qs {
		if _, err := e.DB().ExecContext(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, q := range undo {
			if _, err := e.DB().ExecContext(context.Background(), q); err != nil {
				t.Error(err)
			}
		}
	})
}

// liveTable makes metatest_live in h's database afresh, with a row for
// each of ds, and returns it as a Liveness.
func liveTable(t *testing.T, h host, ds ...blob.Digest) *meta.LiveTable {
	t.Helper()
	ctx := t.Context()
	e := h.e.(engines.SQL)
	typ := map[string]string{"sqlite": "BLOB", "postgres": "BYTEA"}[e.Dialect()]
	for _, q := range []string{`DROP TABLE IF EXISTS metatest_live`, `CREATE TABLE metatest_live (digest ` + typ + ` NOT NULL)`} {
		if _, err := e.DB().ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range ds {
		if _, err := e.DB().ExecContext(ctx, engines.Rebind(e.Dialect(), `INSERT INTO metatest_live (digest) VALUES (?)`), d[:]); err != nil {
			t.Fatal(err)
		}
	}
	lt, err := meta.NewLiveTable(ctx, e.DB(), e.Dialect(), "metatest_live")
	if err != nil {
		t.Fatal(err)
	}
	return lt
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
		// Outside runs under the lock, with the digests nothing protects:
		// it holds the lock until the test releases it.
		_, err := sweeper.Arbitrate(ctx, meta.Arbitration{Digests: []blob.Digest{d}, Outside: func(ctx context.Context, ds []blob.Digest) ([]int64, error) {
			close(inside)
			<-release
			return deleteNothing(ctx, ds)
		}})
		done <- err
	}()
	select {
	case <-inside:
	case err := <-done:
		t.Fatalf("the arbitration ended (%v) without holding the lock over an unpinned digest", err)
	case <-time.After(time.Minute):
		t.Fatal("the arbitration did not reach its delete in a minute")
	}
	pinDone := make(chan error, 1)
	go func() { pinDone <- pinner.PinRows(ctx, "pinner", []blob.Digest{d}, live) }()
	select {
	case err := <-pinDone:
		close(release)
		t.Fatalf("PinRows returned (%v) while an arbitration of the digest held its lock", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	for _, c := range []struct {
		what string
		ch   chan error
	}{{"the arbitration", done}, {"the pin that waited for it", pinDone}} {
		select {
		case err := <-c.ch:
			if err != nil {
				t.Fatalf("%s: %v", c.what, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s did not return in a minute after the lock was released", c.what)
		}
	}
	if got := pinned(t, sweeper, []blob.Digest{d}); !got[d] {
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
