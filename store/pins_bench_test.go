package store_test

import (
	"crypto/rand"
	"encoding/binary"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/store"
)

// The cost of pins kept as gc_pins rows (scripts/measure.sh runs
// these):
//
//	go test -run '^$' -bench 'Pin|Renew' -count 3 ./store
//	scripts/pg.sh go test -run '^$' -bench 'Postgres' -count 3 ./store
//
// The stores get a PinTTL of an hour, so the background renewal tick
// (every TTL/3) never runs during a benchmark: only the ticks the
// benchmark calls are timed.

// benchPinTTL keeps the background renewal loop out of the measurements.
const benchPinTTL = time.Hour

// openPinBench opens a store with a long pin TTL, closed when b ends.
func openPinBench(b *testing.B, cfg store.Config) *store.Store {
	b.Helper()
	cfg.PinTTL = benchPinTTL
	cfg.ScratchDir = b.TempDir()
	s, err := store.Open(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

func sqlitePinStore(b *testing.B) *store.Store {
	dir := b.TempDir()
	return openPinBench(b, store.Config{KV: sqliteKV(b, dir), Large: localLarge(b, dir)})
}

// postgresPinStore opens postgres+pglo on a fresh database, skipping when
// no server is configured (run under scripts/pg.sh).
func postgresPinStore(b *testing.B) *store.Store {
	if os.Getenv(pgtest.EnvDSN) == "" {
		b.Skipf("%s is empty: run under scripts/pg.sh", pgtest.EnvDSN)
	}
	dsn := pgtest.DSN(b)
	return openPinBench(b, store.Config{KV: pgKV(b, dsn), Large: pgLarge(b, dsn)})
}

// pinDigests returns n distinct random digests (absent from the store:
// pinning an absent digest is allowed, and the row write is the same).
func pinDigests(n int) []blob.Digest {
	ds := make([]blob.Digest, n)
	for i := range ds {
		rand.Read(ds[i][:])
	}
	return ds
}

// benchRenew10k: 10 000 digests held (PinMany, one row each), then one
// renewal tick per op — nothing released, so the tick is the UPDATE of
// the owner's 10 000 rows plus the in-process bookkeeping around it.
func benchRenew10k(b *testing.B, s *store.Store) {
	const n = 10_000
	c := s.GC()
	ctx := b.Context()
	pins, err := c.PinMany(ctx, pinDigests(n))
	if err != nil {
		b.Fatal(err)
	}
	defer gc.ReleaseAll(pins)
	if d, _ := c.PinCount(); d != n {
		b.Fatalf("pinned %d digests, want %d", d, n)
	}
	for b.Loop() {
		if err := c.Renew(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/pin")
}

func BenchmarkRenew10kSQLite(b *testing.B)   { benchRenew10k(b, sqlitePinStore(b)) }
func BenchmarkRenew10kPostgres(b *testing.B) { benchRenew10k(b, postgresPinStore(b)) }

// benchPinFirst: the first Pin of a digest this process does not hold —
// one gc_pins row committed in its own transaction — then its Release
// (in process only; the row stays until a renewal tick, which never runs
// here, so the table grows by one row per op).
func benchPinFirst(b *testing.B, s *store.Store) {
	c := s.GC()
	ctx := b.Context()
	var seed [8]byte
	rand.Read(seed[:])
	buf := make([]byte, 16)
	copy(buf, seed[:])
	var i uint64
	for b.Loop() {
		i++
		binary.BigEndian.PutUint64(buf[8:], i)
		p, err := c.Pin(ctx, blob.Sum(buf))
		if err != nil {
			b.Fatal(err)
		}
		p.Release()
	}
}

func BenchmarkPinFirst(b *testing.B)         { benchPinFirst(b, sqlitePinStore(b)) }
func BenchmarkPinFirstPostgres(b *testing.B) { benchPinFirst(b, postgresPinStore(b)) }

// BenchmarkPinFirstParallel: first pins from 4 goroutines per CPU at once,
// as from a mount with several readers opening distinct blobs; each row
// write is its own transaction, so they queue on the database's write
// lock. Compare its ns/op (wall time per pin) with BenchmarkPinFirst's.
func BenchmarkPinFirstParallel(b *testing.B) {
	c := sqlitePinStore(b).GC()
	ctx := b.Context()
	var seed [8]byte
	rand.Read(seed[:])
	var next atomic.Uint64
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 16)
		copy(buf, seed[:])
		for pb.Next() {
			binary.BigEndian.PutUint64(buf[8:], next.Add(1))
			p, err := c.Pin(ctx, blob.Sum(buf))
			if err != nil {
				b.Error(err)
				return
			}
			p.Release()
		}
	})
}

// BenchmarkPinHeld: Pin and Release of a digest already held by another
// pin (so its row is committed): in-process counting only, no database.
func BenchmarkPinHeld(b *testing.B) {
	s := sqlitePinStore(b)
	c := s.GC()
	ctx := b.Context()
	d := pinDigests(1)[0]
	hold, err := c.Pin(ctx, d)
	if err != nil {
		b.Fatal(err)
	}
	defer hold.Release()
	for b.Loop() {
		p, err := c.Pin(ctx, d)
		if err != nil {
			b.Fatal(err)
		}
		p.Release()
	}
}
