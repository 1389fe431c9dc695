package store_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/mem"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/meta"
	"github.com/alkblobfs/alkblobfs/store"
)

// TestFleetConstruction: fleet mode is declared, and every configuration
// a fleet cannot share is refused at Open with ErrFleetConfig and a
// message naming the problem.
func TestFleetConstruction(t *testing.T) {
	dsn, other := pgtest.DSN(t), pgtest.DSN(t)
	ctx := t.Context()
	onePool := dsn + "&pool_max_conns=1"
	if !strings.Contains(dsn, "?") {
		onePool = dsn + "?pool_max_conns=1"
	}
	for _, tc := range []struct {
		name   string
		cfg    func() store.Config
		wantOK bool
		want   string
	}{
		{"postgres+pglo same database", func() store.Config { return store.Config{KV: pgKV(t, dsn), Large: pgLarge(t, dsn)} }, true, ""},
		{"postgres alone", func() store.Config { return store.Config{KV: pgKV(t, dsn)} }, true, ""},
		{"postgres+local on shared media", func() store.Config {
			return store.Config{KV: pgKV(t, dsn), Large: localLarge(t, t.TempDir()), SharedMedia: true}
		}, true, ""},
		{"sqlite kv", func() store.Config {
			return store.Config{KV: sqliteKV(t, t.TempDir()), Large: localLarge(t, t.TempDir()), SharedMedia: true}
		}, false, "needs a PostgreSQL kv engine"},
		{"mem kv", func() store.Config { return store.Config{KV: mem.New(), Large: pgLarge(t, dsn)} }, false, "needs a PostgreSQL kv engine"},
		{"no kv", func() store.Config { return store.Config{Large: pgLarge(t, dsn)} }, false, "needs a PostgreSQL kv engine"},
		{"mem large", func() store.Config { return store.Config{KV: pgKV(t, dsn), Large: mem.New()} }, false, "memory"},
		{"pglo in another database", func() store.Config { return store.Config{KV: pgKV(t, dsn), Large: pgLarge(t, other)} }, false, "not in the kv engine's database"},
		{"local without shared media", func() store.Config { return store.Config{KV: pgKV(t, dsn), Large: localLarge(t, t.TempDir())} }, false, "--shared-media"},
		{"pool of one", func() store.Config { return store.Config{KV: pgKV(t, onePool)} }, false, "at least 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg()
			cfg.Fleet = true
			s, err := store.Open(ctx, cfg)
			if tc.wantOK {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				s.Close()
				return
			}
			if cfg.KV != nil {
				defer cfg.KV.Close()
			}
			if cfg.Large != nil {
				defer cfg.Large.Close()
			}
			if !errors.Is(err, store.ErrFleetConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open = %v; want ErrFleetConfig mentioning %q", err, tc.want)
			}
		})
	}
	t.Run("overflowing window", func(t *testing.T) {
		kv := mem.New()
		_, err := store.Open(ctx, store.Config{KV: kv, GCDelay: 2102400 * time.Hour})
		if err == nil || !strings.Contains(err.Error(), "gc window") {
			t.Fatalf("Open with a window past the end of int64 time = %v; want an error", err)
		}
	})
}

// fleet opens n store instances (distinct owners) on one fresh database,
// all in fleet mode with one shared clock.
func fleet(t *testing.T, n int, c gc.Clock) ([]*store.Store, string) {
	dsn := pgtest.DSN(t)
	var ss []*store.Store
	for range n {
		s := openWith(t, store.Config{KV: pgKV(t, dsn), Large: pgLarge(t, dsn), Fleet: true, Clock: c})
		s.GC().Register(&refs{m: map[blob.Digest]bool{}})
		ss = append(ss, s)
	}
	if ss[0].GC().Owner() == ss[1].GC().Owner() {
		t.Fatal("two instances share an owner id")
	}
	return ss, dsn
}

func putPinned(t *testing.T, s *store.Store, b []byte) (blob.Digest, *gc.Pin) {
	t.Helper()
	d, pin, err := s.Put(t.Context(), bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	return d, pin
}

func has(t *testing.T, s *store.Store, d blob.Digest) bool {
	t.Helper()
	ok, err := s.Has(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestFleetTwoInstances: instance A pins, instance B sweeps and deletes.
// A's rows protect its blobs from B's direct deletes and sweeps; B's sweep
// is refused while another holds the lease; once A lets go, B collects.
func TestFleetTwoInstances(t *testing.T) {
	ss, _ := fleet(t, 2, nil)
	a, b := ss[0], ss[1]
	ctx := t.Context()
	small, pinS := putPinned(t, a, randBytes(100))
	large, pinL := putPinned(t, a, randBytes(threshold*3))
	twin, pinT := putPinned(t, b, randBytes(200)) // B's own, unpinned below
	pinT.Release()

	for _, d := range []blob.Digest{small, large} {
		if err := b.Delete(ctx, d); !errors.Is(err, store.ErrGcRefuse) {
			t.Fatalf("B's delete of A's pinned %s = %v; want ErrGcRefuse", d.Short(), err)
		}
	}
	// Lease contention: while another process holds the pool's lease, B's
	// sweep aborts and deletes nothing.
	lease, held, err := a.KV().(meta.Holder).Meta().Host.SweepLease(ctx)
	if err != nil || !held {
		t.Fatalf("SweepLease: %v %v", held, err)
	}
	r := sweep(t, b)
	if r.Aborted != gc.AbortSweeperLock || r.Queued != 0 || r.Deleted != 0 {
		t.Fatalf("sweep under another's lease: %+v", r)
	}
	// B's last report is that abort, not an earlier sweep's: a control
	// file read after `echo run` tells what this run did.
	if last, ok := b.LastReport(); !ok || last.Aborted != gc.AbortSweeperLock || !last.Started.Equal(r.Started) {
		t.Fatalf("B's last report after a sweep another's lease aborted = %+v, %v; want that abort", last, ok)
	}
	lease.Release()

	r1, r2 := sweep(t, b), sweep(t, b)
	if r1.Queued != 3 || r2.Deleted != 1 || r2.Cancelled != 2 {
		t.Fatalf("B's sweeps with A's pins held: %+v then %+v; want 3 staged, twin deleted, 2 cancelled", r1, r2)
	}
	if !has(t, b, small) || !has(t, b, large) || has(t, b, twin) {
		t.Fatal("wrong blobs deleted")
	}
	pinS.Release()
	pinL.Release()
	if err := a.GC().Renew(ctx); err != nil { // drops the released rows
		t.Fatal(err)
	}
	// The cancelled candidates were staged again by the same sweep's
	// mark, so the first sweep now deletes them.
	if r1, r2 = sweep(t, b), sweep(t, b); r1.Deleted+r2.Deleted != 2 || has(t, b, small) || has(t, b, large) {
		t.Fatalf("after A released: %+v then %+v; want both deleted", r1, r2)
	}
}

// TestFleetPutDuringDelay: a put landing on another instance while a blob
// waits in the window survives through its row; the execution-time
// arbitration cancels the candidate.
func TestFleetPutDuringDelay(t *testing.T) {
	c := &clock{now: time.Unix(1_900_000_000, 0)}
	ss, _ := fleet(t, 2, c)
	a, b := ss[0], ss[1]
	content := randBytes(300)
	d, pin := putPinned(t, b, content)
	pin.Release()
	if r := sweep(t, b); r.Queued != 1 {
		t.Fatalf("stage: %+v", r)
	}
	d2, pinA := putPinned(t, a, content) // dedup re-put on A, during the delay
	if d2 != d {
		t.Fatal("digest changed")
	}
	if r := sweep(t, b); r.Cancelled != 1 || r.Deleted != 0 || !has(t, b, d) {
		t.Fatalf("execution with A's row present: %+v", r)
	}
	pinA.Release()
	if err := a.GC().Renew(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r1, r2 := sweep(t, b), sweep(t, b); r1.Deleted+r2.Deleted != 1 || has(t, b, d) {
		t.Fatalf("after A released: %+v then %+v", r1, r2)
	}
}

// TestFleetPinExpiry: a pin row protects other instances only until its
// expiry, which is the server's clock plus the TTL; renewal moves it
// forward, an expired row is never renewed back to life (the holder pins
// afresh and counts the lapse), and sweeps reap expired rows.
func TestFleetPinExpiry(t *testing.T) {
	ss, dsn := fleet(t, 2, nil)
	a, b := ss[0], ss[1]
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// left is how long A's row of d has to live on the server's clock.
	left := func(d blob.Digest) time.Duration {
		t.Helper()
		var ns int64
		if err := pool.QueryRow(ctx, `SELECT expiry - `+engines.PGNow+` FROM gc_pins WHERE digest = $1 AND owner = $2`, d[:], a.GC().Owner()).Scan(&ns); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ns)
	}
	d, pin := putPinned(t, a, randBytes(50))
	defer pin.Release()
	ttl := a.GC().PinTTL()
	if got := left(d); got > ttl || got < ttl-5*time.Second {
		t.Fatalf("row expires in %s; want the TTL, %s, from the server's now", got, ttl)
	}
	time.Sleep(50 * time.Millisecond)
	before := left(d)
	if err := a.GC().Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if got := left(d); got <= before || got > ttl {
		t.Fatalf("renewed row expires in %s (%s before the renewal); want a fresh TTL, %s", got, before, ttl)
	}
	// A stalls past its TTL (here: its row is made to have expired): the
	// row no longer protects d from B.
	if _, err := pool.Exec(ctx, `UPDATE gc_pins SET expiry = `+engines.PGNow+` - 1 WHERE owner = $1`, a.GC().Owner()); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, d); err != nil {
		t.Fatalf("B's delete once A's row expired: %v", err)
	}
	if r := sweep(t, b); r.Reaped != 1 {
		t.Fatalf("B's sweep reaped %d rows; want A's expired one", r.Reaped)
	}
	// A's next tick finds the lapse and pins afresh: a new row, not the
	// old one renewed, and the blob deleted meanwhile stays deleted.
	if err := a.GC().Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if a.GC().Lapsed() != 1 || has(t, a, d) {
		t.Fatalf("lapsed = %d, has = %v; want 1 lapse and the blob gone", a.GC().Lapsed(), has(t, a, d))
	}
	if got := left(d); got > ttl || got < ttl-5*time.Second {
		t.Fatalf("re-pinned row expires in %s; want the TTL, %s", got, ttl)
	}
}

// TestFleetReap: a sweep removes exactly the expired rows.
func TestFleetReap(t *testing.T) {
	ss, dsn := fleet(t, 2, nil)
	a, b := ss[0], ss[1]
	_, p1 := putPinned(t, a, randBytes(10))
	_, p2 := putPinned(t, a, randBytes(11))
	defer p1.Release()
	defer p2.Release()
	// A's rows expire (as they would after a stall of a TTL).
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(t.Context(), `UPDATE gc_pins SET expiry = `+engines.PGNow+` - 1 WHERE owner = $1`, a.GC().Owner()); err != nil {
		t.Fatal(err)
	}
	d3, p3 := putPinned(t, b, randBytes(12)) // unexpired
	defer p3.Release()
	if r := sweep(t, b); r.Reaped != 2 {
		t.Fatalf("sweep reaped %d rows; want A's 2 expired ones", r.Reaped)
	}
	if err := a.Delete(t.Context(), d3); !errors.Is(err, store.ErrGcRefuse) {
		t.Fatalf("B's unexpired row did not survive the reap: delete = %v", err)
	}
}

// noLinker is a store.Linker that is never asked: the kv engine commits
// the namespace part with the entry.
type noLinker struct{ t *testing.T }

func (l noLinker) CommitRows(context.Context, meta.NSRows) error {
	l.t.Error("the namespace part was written apart from the entry")
	return errors.New("written apart")
}

// TestPostgresFailedJointPut: a put whose transaction fails midway (its
// link, into a namespace that does not exist, fails in the batch's
// transaction, which has taken the arbitration locks of the batch's
// other puts' digests) leaves no entry, no pin row and no session idle in
// a transaction.
func TestPostgresFailedJointPut(t *testing.T) {
	dsn := pgtest.DSN(t)
	kv := pgKV(t, dsn)
	s := openWith(t, store.Config{KV: kv, Large: pgLarge(t, dsn)})
	ctx := t.Context()
	links, err := meta.OpenLinks(ctx, meta.LinksConfig{Engine: kv})
	if err != nil {
		t.Fatal(err)
	}
	absent := links.Rows(meta.NSRows{Link: &meta.LinkRow{NS: "absent"}})
	content := randBytes(100)
	for range 20 { // more than enough to reuse every pooled session
		_, _, err := s.Put(ctx, bytes.NewReader(content), int64(len(content)), store.WithLink(noLinker{t}, absent))
		if !errors.Is(err, meta.ErrNSNotFound) {
			t.Fatalf("put = %v; want the link's ErrNSNotFound", err)
		}
	}
	d := blob.Sum(content)
	if has(t, s, d) {
		t.Fatal("a failed joint put left its entry")
	}
	if n, err := kv.Meta().Host.PinCount(ctx); n != 0 || err != nil {
		t.Fatalf("pin rows after failed puts: %d, %v", n, err)
	}
	if pins, _ := s.GC().PinCount(); pins != 0 {
		t.Fatalf("in-process pins after failed puts: %d", pins)
	}
	var idle int
	if err := kv.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&idle); err != nil {
		t.Fatal(err)
	}
	if idle != 0 {
		t.Fatalf("%d sessions idle in a transaction after failed puts", idle)
	}
	// The pool is clean: the next put works.
	if _, pin, err := s.Put(ctx, bytes.NewReader(content), int64(len(content))); err != nil {
		t.Fatal(err)
	} else {
		pin.Release()
	}
}
