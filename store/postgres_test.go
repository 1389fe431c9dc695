package store_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/local"
	"github.com/alkblobfs/alkblobfs/engines/mem"
	"github.com/alkblobfs/alkblobfs/engines/pglo"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/meta"
	"github.com/alkblobfs/alkblobfs/store"
)

func pgKV(t testing.TB, dsn string) *postgres.Engine {
	t.Helper()
	e, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func pgLarge(t testing.TB, dsn string) *pglo.Engine {
	t.Helper()
	e, err := pglo.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// pgDurable opens stores over one fresh database: kv=postgres + large=pglo
// (the postgres engine hosts the window), or kv=mem + large=pglo (pglo
// hosts it: one window host per store).
func pgDurable(t *testing.T, memKV bool) durable {
	dsn := pgtest.DSN(t)
	return durable{open: func(t *testing.T, delay time.Duration, c gc.Clock) *store.Store {
		var kv engines.KV = mem.New()
		if !memKV {
			kv = pgKV(t, dsn)
		}
		return openWith(t, store.Config{KV: kv, Large: pgLarge(t, dsn), GCDelay: delay, Clock: c})
	}, kvSurvives: !memKV}
}

// forPG runs a durable-window test body on both PostgreSQL shapes.
func forPG(t *testing.T, body func(*testing.T, durable)) {
	for _, tc := range []struct {
		name  string
		memKV bool
	}{{"postgres+pglo", false}, {"mem+pglo", true}} {
		t.Run(tc.name, func(t *testing.T) { body(t, pgDurable(t, tc.memKV)) })
	}
}

func TestPostgresTwoSweepExactCounts(t *testing.T)  { forPG(t, testTwoSweepExactCounts) }
func TestPostgresRaceAcrossDelay(t *testing.T)      { forPG(t, testRaceAcrossDelay) }
func TestPostgresWindowSurvivesReopen(t *testing.T) { forPG(t, testWindowSurvivesReopen) }

// TestPostgresOneWindowHost: with kv=postgres and pglo in another database,
// candidates are staged in the kv engine's gc_window only.
func TestPostgresOneWindowHost(t *testing.T) {
	kv, large := pgKV(t, pgtest.DSN(t)), pgLarge(t, pgtest.DSN(t))
	s := openWith(t, store.Config{KV: kv, Large: large})
	putN(t, s, 4)
	s.GC().Register(&refs{m: map[blob.Digest]bool{}})
	if r := sweep(t, s); r.Queued != 4 {
		t.Fatalf("sweep: %+v", r)
	}
	for _, w := range []struct {
		name string
		w    meta.Window
		want int
	}{{"postgres", kv.Meta().Window, 4}, {"pglo", large.Meta().Window, 0}} {
		if n, err := w.w.WindowLen(t.Context()); n != w.want || err != nil {
			t.Errorf("%s gc_window: %d rows, %v; want %d", w.name, n, err, w.want)
		}
	}
}

// TestPostgresRoundTrip puts, reads, range-reads, dedups and deletes blobs
// of every size class through the store on kv=postgres + large=pglo, with
// sizes around the pglo chunk (512 KiB) and the chunk sums (64 KiB).
func TestPostgresRoundTrip(t *testing.T) {
	dsn := pgtest.DSN(t)
	s := openWith(t, store.Config{KV: pgKV(t, dsn), Large: pgLarge(t, dsn)})
	s.GC().Register(&refs{m: map[blob.Digest]bool{}}) // deletes need a source
	ctx := t.Context()
	for _, n := range []int{0, 1, threshold, threshold + 1, 512<<10 - 1, 512 << 10, 512<<10 + 1, 3<<20 + 17} {
		for _, known := range []bool{true, false} {
			data := randBytes(n)
			size := int64(n)
			if !known {
				size = -1
			}
			d, pin, err := s.Put(ctx, bytes.NewReader(data), size)
			if err != nil {
				t.Fatalf("put %d bytes: %v", n, err)
			}
			info, ok, err := s.Stat(ctx, d)
			wantTier := store.TierKV
			if n > threshold {
				wantTier = store.TierLarge
			}
			if err != nil || !ok || info.Size != int64(n) || info.Tier != wantTier {
				t.Fatalf("stat %d bytes: %+v %v %v; want tier %s", n, info, ok, err, wantTier)
			}
			if got := readAll(t, s, d); !bytes.Equal(got, data) {
				t.Fatalf("read back %d bytes differs", n)
			}
			if n > 100 {
				off, k := int64(n/3), int64(min(n/2, 200<<10))
				got, sum, err := s.ReadRange(ctx, d, off, k)
				if err != nil || !bytes.Equal(got, data[off:off+k]) || sum != sha256.Sum256(data[off:off+k]) {
					t.Fatalf("read range of %d bytes at %d: %v", k, off, err)
				}
			}
			d2, pin2, err := s.Put(ctx, bytes.NewReader(data), -1)
			if err != nil || d2 != d {
				t.Fatalf("dedup put: %v", err)
			}
			pin.Release()
			pin2.Release()
			if err := s.Delete(ctx, d); err != nil {
				t.Fatalf("delete %d bytes: %v", n, err)
			}
			if ok, err := s.Has(ctx, d); ok || err != nil {
				t.Fatalf("has after delete: %v, %v", ok, err)
			}
		}
	}
	assertClean(t, s)
	if c := count(t, s); c != 0 {
		t.Fatalf("%d entries left", c)
	}
}

// TestPostgresFailedPutsLeaveNothing: a source failing mid-blob leaves no
// entry and no large object.
func TestPostgresFailedPutsLeaveNothing(t *testing.T) {
	dsn := pgtest.DSN(t)
	s := openWith(t, store.Config{KV: pgKV(t, dsn), Large: pgLarge(t, dsn)})
	boom := errors.New("disk on fire")
	for _, n := range []int{threshold / 2, 3 << 20} {
		for _, size := range []int64{int64(n) + 10, -1} {
			r := io.MultiReader(bytes.NewReader(randBytes(n)), &failAfter{err: boom})
			if _, _, err := s.Put(t.Context(), r, size); err == nil {
				t.Fatalf("put of %d bytes from a failing source succeeded", n)
			}
		}
	}
	if c := count(t, s); c != 0 {
		t.Fatalf("%d entries after failed puts", c)
	}
	assertClean(t, s)
}

type failAfter struct{ err error }

func (f *failAfter) Read([]byte) (int, error) { return 0, f.err }

// TestPostgresCorruptObjectDetected: a byte changed inside a large object
// is caught by chunk sums on range reads and by the streaming hash.
func TestPostgresCorruptObjectDetected(t *testing.T) {
	dsn := pgtest.DSN(t)
	kv := pgKV(t, dsn)
	s := openWith(t, store.Config{KV: kv, Large: pgLarge(t, dsn)})
	data := randBytes(2 << 20)
	d, pin, err := s.Put(t.Context(), bytes.NewReader(data), -1)
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	const at = 1_500_000
	if _, err := kv.Pool().Exec(t.Context(), `SELECT lo_put(oid, $2, $3) FROM pglo_blobs WHERE digest = $1`,
		d[:], int64(at), []byte{data[at] ^ 0x40}); err != nil {
		t.Fatal(err)
	}
	r, _, err := s.Get(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r2, _, err := s.Get(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	buf := make([]byte, 4096)
	if _, err := r.ReadAt(buf, 0); err != nil {
		t.Fatalf("range read of an intact chunk: %v", err)
	}
	if _, err := r.ReadAt(buf, at-100); !errors.Is(err, store.ErrVerification) {
		t.Fatalf("range read over the changed byte: %v, want ErrVerification", err)
	}
	if _, err := io.ReadAll(r2); !errors.Is(err, store.ErrVerification) {
		t.Fatalf("streaming read: %v, want ErrVerification", err)
	}
	// The range read hashed the object whole and recorded the verdict:
	// the next Get refuses it up front.
	if _, _, err := s.Get(t.Context(), d); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("Get after a read found the object corrupt: %v, want ErrCorrupt", err)
	}
}

// Benchmarks, for side-by-side figures in one run:
//
//	scripts/pg.sh go test -run '^$' -bench 'PG' -benchtime 3x ./store
//
// put and get MB/s of a 100 MiB blob via pglo and via local, and puts/s of
// 10 000 small (1 KiB) blobs on postgres and on SQLite.

func BenchmarkPGLargePutGet(b *testing.B) {
	data := randBytes(100 << 20)
	for _, tc := range []struct {
		name  string
		large func(b *testing.B) engines.Large
	}{
		{"local", func(b *testing.B) engines.Large {
			e, err := local.Open(b.Context(), b.TempDir(), nil)
			if err != nil {
				b.Fatal(err)
			}
			return e
		}},
		{"pglo", func(b *testing.B) engines.Large { return pgLarge(b, pgtest.DSN(b)) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := store.Open(b.Context(), store.Config{Large: tc.large(b)})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var put, get time.Duration
			b.SetBytes(int64(len(data)))
			for i := 0; b.Loop(); i++ {
				data[0], data[1] = byte(i), byte(i>>8) // no dedup
				t0 := time.Now()
				d, pin, err := s.Put(b.Context(), bytes.NewReader(data), int64(len(data)))
				if err != nil {
					b.Fatal(err)
				}
				pin.Release()
				t1 := time.Now()
				r, _, err := s.Get(b.Context(), d)
				if err != nil {
					b.Fatal(err)
				}
				if n, err := r.WriteTo(io.Discard); err != nil || n != int64(len(data)) {
					b.Fatalf("get: %d bytes, %v", n, err)
				}
				r.Close()
				put += t1.Sub(t0)
				get += time.Since(t1)
			}
			mb := float64(b.N) * float64(len(data)) / (1 << 20)
			b.ReportMetric(mb/put.Seconds(), "put-MiB/s")
			b.ReportMetric(mb/get.Seconds(), "get-MiB/s")
		})
	}
}

func BenchmarkPGSmallPuts(b *testing.B) {
	const n, size = 10_000, 1024
	for _, tc := range []struct {
		name string
		kv   func(b *testing.B) engines.KV
	}{
		{"sqlite", func(b *testing.B) engines.KV {
			e, err := sqlite.Open(b.Context(), filepath.Join(b.TempDir(), "kv.db"))
			if err != nil {
				b.Fatal(err)
			}
			return e
		}},
		{"postgres", func(b *testing.B) engines.KV { return pgKV(b, pgtest.DSN(b)) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := store.Open(b.Context(), store.Config{KV: tc.kv(b)})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			v := randBytes(size)
			var total time.Duration
			for i := 0; b.Loop(); i++ {
				t0 := time.Now()
				for j := range n {
					v[0], v[1], v[2], v[3] = byte(i), byte(j), byte(j>>8), byte(j>>16)
					_, pin, err := s.Put(b.Context(), bytes.NewReader(v), size)
					if err != nil {
						b.Fatal(err)
					}
					pin.Release()
				}
				total += time.Since(t0)
			}
			b.ReportMetric(float64(b.N*n)/total.Seconds(), "puts/s")
		})
	}
}
