package namespaces_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/mem"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/gc/gctest"
	"github.com/alkblobfs/alkblobfs/meta"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/namespaces/nstest"
)

func TestSQLite(t *testing.T) {
	nstest.Run(t, func(t *testing.T, c namespaces.Clock) namespaces.Registry { return openSQLite(t, c) })
}

// openSQLite returns a registry in a fresh engines/sqlite database, as Open
// wires it for a store.
func openSQLite(t testing.TB, c namespaces.Clock) *namespaces.SQL {
	t.Helper()
	r, _ := openSQLiteEngine(t, filepath.Join(t.TempDir(), "kv.db"), c)
	return r
}

func openSQLiteEngine(t testing.TB, path string, c namespaces.Clock) (*namespaces.SQL, *sqlite.Engine) {
	t.Helper()
	e, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	r, err := namespaces.Open(context.Background(), e, c)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := r.(*namespaces.SQL)
	if !ok {
		t.Fatalf("Open(sqlite engine) = %T, want *namespaces.SQL", r)
	}
	return s, e
}

func TestOpenPicksImplementation(t *testing.T) {
	ctx := t.Context()
	if r, err := namespaces.Open(ctx, mem.New(), nil); err != nil {
		t.Fatal(err)
	} else if _, ok := r.(*namespaces.Mem); !ok {
		t.Fatalf("Open(mem engine) = %T, want *namespaces.Mem", r)
	}
	if r, err := namespaces.Open(ctx, nil, nil); err != nil {
		t.Fatal(err)
	} else if _, ok := r.(*namespaces.Mem); !ok {
		t.Fatalf("Open(nil) = %T, want *namespaces.Mem", r)
	}
	openSQLite(t, nil) // asserts *SQL
	if _, err := namespaces.OpenSQL(ctx, bareSQL{&sql.DB{}, "oracle"}, nil); err == nil {
		t.Fatal("OpenSQL accepted an unknown dialect")
	}
	// SQLite intents are timed by the engine's row clock: a database
	// without one is refused rather than timed by the process's clock.
	e, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := namespaces.OpenSQL(ctx, bareSQL{e.DB(), "sqlite"}, nil); err == nil {
		t.Fatal("OpenSQL accepted a SQLite database without a row clock")
	}
}

// bareSQL is an engines.SQL that is nothing else.
type bareSQL struct {
	db      *sql.DB
	dialect string
}

func (b bareSQL) DB() *sql.DB     { return b.db }
func (b bareSQL) Dialect() string { return b.dialect }

// TestSQLitePersists: namespaces and references survive closing and
// reopening the database, and opening twice is harmless.
func TestSQLitePersists(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "kv.db")
	clock := nstest.NewClock(time.Unix(1_700_000_000, 123456789))
	r, e := openSQLiteEngine(t, path, clock)
	if err := r.Create(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
	d := blob.Sum([]byte("persisted"))
	if _, err := r.Link(ctx, "keep", d); err != nil {
		t.Fatal(err)
	}
	if _, err := namespaces.OpenSQL(ctx, e, clock); err != nil {
		t.Fatalf("second OpenSQL on the same database: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	r, _ = openSQLiteEngine(t, path, nil)
	ref, ok, err := r.Has(ctx, "keep", d)
	if err != nil || !ok || !ref.LinkedAt.Equal(clock.Now()) {
		t.Fatalf("after reopen: Has = %v, %v, %v; want linked at %v", ref, ok, err, clock.Now())
	}
}

// TestSQLiteNSRowsCommitWithEntry: a put's namespace part commits with its entry
// or not at all (testNSRowsCommitWithEntry).
func TestSQLiteNSRowsCommitWithEntry(t *testing.T) {
	r, e := openSQLiteEngine(t, filepath.Join(t.TempDir(), "kv.db"), nil)
	testNSRowsCommitWithEntry(t, r, e)
}

// testNSRowsCommitWithEntry is the joint put's contract on any SQL
// registry and the engine whose database it shares (meta.Putter): a
// put's namespace part, bound to the registry (Join), commits with the
// entry or not at all, and a part of none of meta.NSRows's shapes is
// refused whole.
func testNSRowsCommitWithEntry(t *testing.T, r *namespaces.SQL, e interface {
	engines.KV
	meta.Putter
}) {
	ctx := t.Context()
	if err := r.Create(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	v := []byte("rolled back")
	d := blob.Sum(v)
	put := func(part meta.NSRows) error {
		_, err := e.PutRows(ctx, d, v, meta.Rows{NS: r.Join(part).For(d, int64(len(v)))})
		return err
	}

	// A close that replaces the writer's earlier intent and is refused
	// over the quota after dropping it (its charge freed first): neither
	// the entry nor the drop remain, and the earlier intent keeps its
	// digest and its charge.
	intent := func(id int64) *meta.IntentRow {
		return &meta.IntentRow{ID: id, NS: "a", Holder: "h", TTL: time.Minute}
	}
	earlier := []byte("earlier")
	de := blob.Sum(earlier)
	id := meta.NewIntentID()
	if _, err := e.PutRows(ctx, de, earlier, meta.Rows{NS: r.Join(meta.NSRows{Intent: intent(id)}).For(de, int64(len(earlier)))}); err != nil {
		t.Fatal(err)
	}
	if err := r.SetQuota(ctx, "a", namespaces.Quota{Bytes: int64(len(v)) - 1}); err != nil {
		t.Fatal(err)
	}
	err := put(meta.NSRows{Intent: intent(meta.NewIntentID()), Replaces: id})
	if !errors.Is(err, blob.ErrQuota) {
		t.Fatalf("put of an intent replacing another, over the quota = %v, want ErrQuota", err)
	}
	if live, err := r.IsLive(ctx, de); err != nil || !live {
		t.Fatalf("the earlier intent's digest: live = %v, %v after the rolled-back put; want live", live, err)
	}
	if u, err := r.Usage(ctx, "a"); err != nil || u.Blobs != 1 || u.Bytes != int64(len(earlier)) {
		t.Fatalf("usage after the rolled-back put = %+v, %v; want the earlier intent's 1 blob, %d bytes", u, err, len(earlier))
	}
	if ok, _ := e.Has(ctx, d); ok {
		t.Fatal("entry survived the rolled-back put")
	}
	if err := r.Cancel(ctx, namespaces.Intent(id)); err != nil {
		t.Fatal(err)
	}
	if err := r.SetQuota(ctx, "a", namespaces.Quota{}); err != nil {
		t.Fatal(err)
	}

	// A part that is none of NSRows's shapes is refused whole, not
	// written in part.
	for _, tc := range []struct {
		what string
		part meta.NSRows
	}{
		{"a link with an intent", meta.NSRows{Link: &meta.LinkRow{NS: "a"}, Intent: intent(meta.NewIntentID())}},
		{"a link replacing an intent", meta.NSRows{Link: &meta.LinkRow{NS: "a"}, Replaces: id}},
		{"a settle without its intent", meta.NSRows{Settle: true}},
		{"a replaced intent alone", meta.NSRows{Replaces: id}},
	} {
		if err := put(tc.part); !errors.Is(err, meta.ErrNSRowsMixed) {
			t.Fatalf("put of %s = %v, want ErrNSRowsMixed", tc.what, err)
		}
		if _, ok, _ := r.Has(ctx, "a", d); ok {
			t.Fatalf("put of %s linked its digest", tc.what)
		}
		if ok, _ := e.Has(ctx, d); ok {
			t.Fatalf("put of %s committed its entry", tc.what)
		}
	}

	// A link into an absent namespace fails the put as a whole.
	if err := put(meta.NSRows{Link: &meta.LinkRow{NS: "nope"}}); !errors.Is(err, namespaces.ErrNotFound) {
		t.Fatalf("put linking into an absent namespace = %v, want ErrNotFound", err)
	}
	if ok, _ := e.Has(ctx, d); ok {
		t.Fatal("entry committed although its link failed")
	}

	// Success: both commit.
	if err := put(meta.NSRows{Link: &meta.LinkRow{NS: "a"}}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := r.Has(ctx, "a", d); !ok {
		t.Fatal("link missing after a committed put")
	}
	if ok, _ := e.Has(ctx, d); !ok {
		t.Fatal("entry missing after a committed put")
	}
}

// TestSQLiteCorruptRow: a malformed digest in the table is an error, not a
// wrong digest.
func TestSQLiteCorruptRow(t *testing.T) {
	ctx := t.Context()
	r, e := openSQLiteEngine(t, filepath.Join(t.TempDir(), "kv.db"), nil)
	if err := r.Create(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.DB().ExecContext(ctx, `INSERT INTO ns_refs (ns, digest, linked_at) VALUES ('a', x'0102', 0)`); err != nil {
		t.Fatal(err)
	}
	var errs []error
	for _, err := range r.Entries(ctx, "a", blob.Digest{}) {
		errs = append(errs, err)
	}
	if len(errs) != 1 || errs[0] == nil {
		t.Fatalf("Entries over a corrupt row yielded %v, want one error", errs)
	}
	var live []error
	for _, err := range r.Live(ctx) {
		live = append(live, err)
	}
	if len(live) != 1 || live[0] == nil {
		t.Fatalf("Live over a corrupt row yielded %v, want one error", live)
	}
}

// TestPermColumnsAdded: a store made before namespaces had permissions
// gets the columns when opened, by several processes at once, and its
// namespaces have no Perm until one is set.
func TestPermColumnsAdded(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "kv.db")
		e, err := sqlite.Open(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		testPermColumnsAdded(t, e.DB(), `CREATE TABLE ns (name TEXT PRIMARY KEY, created_at INTEGER NOT NULL) WITHOUT ROWID`,
			func() engines.SQL {
				e, err := sqlite.Open(t.Context(), path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { e.Close() })
				return e
			})
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := pgtest.DSN(t)
		open := func() engines.SQL {
			e, err := postgres.Open(t.Context(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			return e
		}
		testPermColumnsAdded(t, open().DB(), `CREATE TABLE ns (name TEXT COLLATE "C" PRIMARY KEY, created_at BIGINT NOT NULL)`, open)
	})
}

func testPermColumnsAdded(t *testing.T, old *sql.DB, oldDDL string, open func() engines.SQL) {
	ctx := t.Context()
	if _, err := old.ExecContext(ctx, oldDDL); err != nil {
		t.Fatal(err)
	}
	if _, err := old.ExecContext(ctx, `INSERT INTO ns (name, created_at) VALUES ('old', 1)`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	regs := make([]*namespaces.SQL, 3)
	errs := make([]error, 3)
	for i := range regs {
		e := open()
		wg.Go(func() { regs[i], errs[i] = namespaces.OpenSQL(ctx, e, nil) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent opens of an old store: %v", err)
	}
	r := regs[0]
	if p, ok, err := r.Perm(ctx, "old"); err != nil || ok {
		t.Fatalf("Perm of an old namespace = %+v, %v, %v; want none", p, ok, err)
	}
	want := namespaces.Perm{Uid: 7, Gid: 8, Mode: 0o750}
	if err := r.SetPerm(ctx, "old", want); err != nil {
		t.Fatal(err)
	}
	if p, ok, err := regs[2].Perm(ctx, "old"); err != nil || !ok || p != want {
		t.Fatalf("Perm from another opener = %+v, %v, %v; want %+v", p, ok, err, want)
	}
}

// TestOpenBesideAWriter: opening a registry does not wait for SQLite's
// write lock when its tables are there: a read-only command or a mount
// starts while a sweep holds a long write transaction.
func TestOpenBesideAWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	openSQLiteEngine(t, path, nil) // creates the schema
	e, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tx, err := e.DB().BeginTx(t.Context(), nil) // IMMEDIATE: the write lock
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(t.Context(), `INSERT INTO ns (name, created_at) VALUES ('held', 1)`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	other, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := namespaces.OpenSQL(t.Context(), other, nil); err != nil {
		t.Fatalf("open beside a writer: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("open beside a writer took %s", d)
	}
}

// TestSQLiteUsage: two registries on one SQLite file race as two
// processes of one host would.
func TestSQLiteUsage(t *testing.T) {
	nstest.RunUsage(t, func(t *testing.T, n int) []namespaces.Registry {
		path := filepath.Join(t.TempDir(), "kv.db")
		regs := make([]namespaces.Registry, n)
		for i := range regs {
			regs[i], _ = openSQLiteEngine(t, path, nil)
		}
		return regs
	}, damage)
}

// TestUsageColumnsAdded: a store made before usage was kept opens, by
// several processes at once, with its namespaces' blobs counted; its
// references' sizes come from the pool with Service.FillSizes, which
// then recounts the bytes, and finds nothing to do the next time.
func TestUsageColumnsAdded(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "kv.db")
		open := func() engines.SQL {
			e, err := sqlite.Open(t.Context(), path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			return e
		}
		testUsageColumnsAdded(t, open().DB(), []string{
			`CREATE TABLE ns (name TEXT PRIMARY KEY, created_at INTEGER NOT NULL, uid INTEGER, gid INTEGER, mode INTEGER) WITHOUT ROWID`,
			`CREATE TABLE ns_refs (ns TEXT NOT NULL REFERENCES ns (name), digest BLOB NOT NULL, linked_at INTEGER NOT NULL, PRIMARY KEY (ns, digest)) WITHOUT ROWID`,
			`CREATE INDEX ns_refs_digest ON ns_refs (digest)`,
			`CREATE TABLE ns_pending (id INTEGER PRIMARY KEY, ns TEXT NOT NULL REFERENCES ns (name), digest BLOB NOT NULL, holder TEXT NOT NULL, expiry INTEGER NOT NULL)`,
			`CREATE INDEX ns_pending_digest ON ns_pending (digest)`,
		}, open)
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := pgtest.DSN(t)
		open := func() engines.SQL {
			e, err := postgres.Open(t.Context(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			return e
		}
		testUsageColumnsAdded(t, open().DB(), []string{
			`CREATE TABLE ns (name TEXT COLLATE "C" PRIMARY KEY, created_at BIGINT NOT NULL, uid BIGINT, gid BIGINT, mode BIGINT)`,
			`CREATE TABLE ns_refs (ns TEXT COLLATE "C" NOT NULL REFERENCES ns (name), digest BYTEA NOT NULL, linked_at BIGINT NOT NULL, PRIMARY KEY (ns, digest))`,
			`CREATE INDEX ns_refs_digest ON ns_refs (digest)`,
			`CREATE TABLE ns_pending (id BIGINT PRIMARY KEY, ns TEXT COLLATE "C" NOT NULL REFERENCES ns (name), digest BYTEA NOT NULL, holder TEXT NOT NULL, expiry BIGINT NOT NULL)`,
			`CREATE INDEX ns_pending_digest ON ns_pending (digest)`,
			`CREATE INDEX ns_pending_holder ON ns_pending (holder)`,
		}, open)
	})
}

func testUsageColumnsAdded(t *testing.T, old *sql.DB, oldDDL []string, open func() engines.SQL) {
	ctx := t.Context()
	d1, d2, d3 := blob.Sum([]byte("one")), blob.Sum([]byte("two")), blob.Sum([]byte("three"))
	for _, q := range oldDDL {
		if _, err := old.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, q := range []struct {
		q    string
		args []any
	}{
		{`INSERT INTO ns (name, created_at) VALUES ('old', 1), ('other', 1)`, nil},
		{`INSERT INTO ns_refs (ns, digest, linked_at) VALUES ('old', $1, 1), ('old', $2, 1), ('other', $1, 1)`, []any{d1[:], d2[:]}},
		{`INSERT INTO ns_pending (id, ns, digest, holder, expiry) VALUES (7, 'old', $1, 'h', 9000000000000000000)`, []any{d3[:]}},
	} {
		if _, err := old.ExecContext(ctx, q.q, q.args...); err != nil {
			t.Fatalf("%s: %v", q.q, err)
		}
	}
	var wg sync.WaitGroup
	regs := make([]*namespaces.SQL, 3)
	errs := make([]error, 3)
	for i := range regs {
		e := open()
		wg.Go(func() { regs[i], errs[i] = namespaces.OpenSQL(ctx, e, nil) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent opens of an old store: %v", err)
	}
	usage := func(name string, blobs, bytes int64, what string) {
		t.Helper()
		u, err := regs[1].Usage(ctx, name)
		if err != nil || u.Blobs != blobs || u.Bytes != bytes {
			t.Fatalf("%s: Usage(%q) = %+v, %v; want %d blobs, %d bytes", what, name, u, err, blobs, bytes)
		}
	}
	usage("old", 3, 0, "opened")
	usage("other", 1, 0, "opened")
	pool := gctest.NewPool(gc.Options{}, d1, d2) // d3 is lost: sized 0
	size := func(d blob.Digest) int64 { n, _ := pool.Size(ctx, d); return n }
	svc := namespaces.NewService(regs[0], pool)
	if n, err := svc.FillSizes(ctx); err != nil || n != 3 {
		t.Fatalf("FillSizes = %d, %v; want 3 digests sized", n, err)
	}
	usage("old", 3, size(d1)+size(d2), "sized")
	usage("other", 1, size(d1), "sized")
	if n, err := svc.FillSizes(ctx); err != nil || n != 0 {
		t.Fatalf("FillSizes again = %d, %v; want nothing to do", n, err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(regs[2].Unlink(ctx, "old", d2))
	usage("old", 2, size(d1), "after an unlink of a sized reference")
}
