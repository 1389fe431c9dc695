package sqlite_test

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/enginetest"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/meta"
	"github.com/alkblobfs/alkblobfs/meta/metatest"
)

// inlineDDL is the schema of every build before layouts were recorded,
// as it was: what layout 1 databases hold.
const inlineDDL = `
CREATE TABLE IF NOT EXISTS blobs (
	digest BLOB PRIMARY KEY,
	size   INTEGER NOT NULL,
	value  BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS gc_window (
	digest        BLOB PRIMARY KEY,
	visible_after INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS gc_pins (
	digest BLOB NOT NULL,
	owner  TEXT NOT NULL,
	expiry INTEGER NOT NULL,
	PRIMARY KEY (digest, owner)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS gc_pins_owner ON gc_pins (owner);
`

// rawDB opens the database at path past the engine, as a tool or an
// older build would, closed when t ends.
func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func exec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(t.Context(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func count(t *testing.T, db *sql.DB, q string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// inlineDatabase makes a layout 1 database at path with the DDL of the
// builds before layouts, holding the blobs of vs, inserted by that DDL's
// statement, and returns their digests.
func inlineDatabase(t *testing.T, path string, vs ...[]byte) []blob.Digest {
	t.Helper()
	db := rawDB(t, path)
	exec(t, db, inlineDDL)
	var ds []blob.Digest
	for _, v := range vs {
		d := blob.Sum(v)
		exec(t, db, `INSERT INTO blobs (digest, size, value) VALUES (?, ?, coalesce(?, x'')) ON CONFLICT (digest) DO NOTHING`, d[:], len(v), v)
		ds = append(ds, d)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return ds
}

// catalogue is what a database's header and catalogue hold, to compare.
func catalogue(t *testing.T, path string) string {
	t.Helper()
	db := rawDB(t, path)
	var b strings.Builder
	fmt.Fprintf(&b, "user_version %d\n", count(t, db, `PRAGMA user_version`))
	rows, err := db.QueryContext(t.Context(), `SELECT type, name, coalesce(sql, '') FROM sqlite_master ORDER BY type, name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var typ, name, ddl string
		if err := rows.Scan(&typ, &name, &ddl); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %s: %s\n", typ, name, ddl)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// wantLayout fails t unless the database at path, as a tool sees it,
// is of layout l: its recorded version and its tables.
func wantLayout(t *testing.T, path string, l int) {
	t.Helper()
	db := rawDB(t, path)
	recorded := count(t, db, `PRAGMA user_version`)
	values := count(t, db, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'blob_values'`)
	valueCol := count(t, db, `SELECT count(*) FROM pragma_table_info('blobs') WHERE name = 'value'`)
	vidCol := count(t, db, `SELECT count(*) FROM pragma_table_info('blobs') WHERE name = 'vid'`)
	want := map[int][4]int{1: {0, 0, 1, 0}, 2: {2, 1, 0, 1}}[l]
	if got := [4]int{recorded, values, valueCol, vidCol}; got != want {
		t.Fatalf("%s: user_version, blob_values, blobs.value, blobs.vid = %v; want %v (layout %d)", filepath.Base(path), got, want, l)
	}
}

// TestEngineInlineLayout: the conformance suite on databases of layout 1,
// made with the DDL of the builds before layouts.
func TestEngineInlineLayout(t *testing.T) {
	inline := func(t *testing.T) engines.Engine {
		path := filepath.Join(t.TempDir(), "kv.db")
		inlineDatabase(t, path)
		e := open(t, path)
		if e.Layout() != 1 {
			t.Fatalf("a layout 1 database opened as layout %d", e.Layout())
		}
		return e
	}
	enginetest.Run(t, inline)
	path := filepath.Join(t.TempDir(), "kv.db")
	inlineDatabase(t, path)
	t.Run("Reopen", func(t *testing.T) {
		enginetest.Reopen(t, func(t *testing.T) engines.Engine { return open(t, path) })
		metatest.Reopen(t, func(t *testing.T) engines.Engine { return open(t, path) })
	})
	// The shared state beside layout 1's blobs (the arbitration's
	// deletes are the layout's).
	t.Run("Host", func(t *testing.T) {
		metatest.Host(t, func(t *testing.T) engines.Engine { return open(t, path) })
	})
	t.Run("Window", func(t *testing.T) { metatest.WindowEngine(t, inline) })
	wantLayout(t, path, 1)
}

// TestLayoutOfNewAndOld: a new database gets layout 2, recorded, and
// keeps it; a database of an older build keeps layout 1, unrecorded,
// its blobs readable and new puts going into its table.
func TestLayoutOfNewAndOld(t *testing.T) {
	ctx := t.Context()
	v := []byte("a blob of a new database")
	fresh := filepath.Join(t.TempDir(), "kv.db")
	e := open(t, fresh)
	if _, err := e.Put(ctx, blob.Sum(v), v); err != nil {
		t.Fatal(err)
	}
	if e.Layout() != sqlite.LayoutLatest || sqlite.LayoutLatest != 2 {
		t.Fatalf("a new database has layout %d (latest %d); want 2", e.Layout(), sqlite.LayoutLatest)
	}
	e.Close()
	wantLayout(t, fresh, 2)
	if n := count(t, rawDB(t, fresh), `SELECT count(*) FROM sqlite_master WHERE name = 'blobs_size'`); n != 0 {
		t.Errorf("a layout 2 database has the size index, which it does not need")
	}
	e = open(t, fresh)
	if e.Layout() != 2 {
		t.Fatalf("reopened, layout %d", e.Layout())
	}
	wantBlob(t, e, v)
	e.Close()

	old := filepath.Join(t.TempDir(), "kv.db")
	ds := inlineDatabase(t, old, []byte("one"), []byte("two"))
	e = open(t, old)
	if e.Layout() != 1 {
		t.Fatalf("an old database opened as layout %d", e.Layout())
	}
	wantBlob(t, e, []byte("one"))
	wantBlob(t, e, []byte("two"))
	w := []byte("put by this build")
	if ok, err := e.Put(ctx, blob.Sum(w), w); err != nil || !ok {
		t.Fatalf("Put = %v, %v", ok, err)
	}
	e.Close()
	wantLayout(t, old, 1)
	db := rawDB(t, old)
	var got []byte
	dw := blob.Sum(w)
	if err := db.QueryRowContext(ctx, `SELECT value FROM blobs WHERE digest = ?`, dw[:]).Scan(&got); err != nil || !bytes.Equal(got, w) {
		t.Fatalf("the new put in the old table: %q, %v", got, err)
	}
	if n := count(t, db, `SELECT count(*) FROM blobs`); n != len(ds)+1 {
		t.Fatalf("old table holds %d rows; want %d", n, len(ds)+1)
	}
}

// wantBlob fails t unless e holds v whole.
func wantBlob(t *testing.T, e *sqlite.Engine, v []byte) {
	t.Helper()
	wantContent(t, e, blob.Sum(v), v)
}

// wantContent fails t unless e holds v whole under d.
func wantContent(t *testing.T, e *sqlite.Engine, d blob.Digest, v []byte) {
	t.Helper()
	c, err := e.Open(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := make([]byte, len(v)+1)
	n, _ := c.ReadAt(got, 0)
	if !bytes.Equal(got[:n], v) {
		t.Fatalf("read %q; want %q", got[:n], v)
	}
}

// TestLayoutNewerRefused: a database recording a layout newer than this
// build knows is refused at open, saying so, and nothing is written to
// it: not the GC's tables, not a layout.
func TestLayoutNewerRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		ddl  string
	}{
		{"empty", ``},
		{"with tables", `CREATE TABLE blobs (digest BLOB PRIMARY KEY, k3 INTEGER) WITHOUT ROWID; CREATE TABLE blob_values (vid INTEGER PRIMARY KEY, value BLOB)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kv.db")
			db := rawDB(t, path)
			exec(t, db, tc.ddl+`; PRAGMA user_version = 3`)
			db.Close()
			before := catalogue(t, path)
			e, err := sqlite.Open(t.Context(), path)
			if err == nil {
				e.Close()
				t.Fatal("opened a database of layout 3")
			}
			if !errors.Is(err, sqlite.ErrNewerLayout) {
				t.Fatalf("error %v; want ErrNewerLayout", err)
			}
			for _, want := range []string{path, "storage layout 3", "layouts 1 to 2", "newer"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
			if after := catalogue(t, path); after != before {
				t.Fatalf("the refused open changed the database:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// TestLayoutRacingCreators: processes opening one new database at once
// (separate pools, as separate processes are to SQLite's locks) all open
// it, with one layout. (TestLayoutCreatorLosesRace is the same race with
// its order forced.)
func TestLayoutRacingCreators(t *testing.T) {
	for round := range 5 {
		path := filepath.Join(t.TempDir(), "kv.db")
		es := openAtOnce(t, path, 6)
		for i := range es {
			if es[i].Layout() != 2 {
				t.Errorf("round %d, open %d: layout %d", round, i, es[i].Layout())
			}
		}
		v := fmt.Appendf(nil, "seen by all in round %d", round)
		if _, err := es[0].Put(t.Context(), blob.Sum(v), v); err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			wantBlob(t, e, v)
		}
	}
}

// openAtOnce opens the database at path n times at once, in separate
// pools (as separate processes are to SQLite's locks), fails t if any
// open fails, and closes the engines when t ends.
func openAtOnce(t *testing.T, path string, n int) []*sqlite.Engine {
	t.Helper()
	es := make([]*sqlite.Engine, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { es[i], errs[i] = sqlite.Open(t.Context(), path) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] == nil {
			t.Cleanup(func() { es[i].Close() })
		}
	}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("open %d of %d at once: %v", i, n, errs[i])
		}
	}
	return es
}

// TestLayoutCreatorLosesRace: when another process makes the blobs table
// (here an older build's, layout 1) between an open's first look, which
// found none, and its write lock, the open looks again under the lock and
// takes the layout it finds instead of making its own over it.
func TestLayoutCreatorLosesRace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	v := []byte("put by the older build")
	sqlite.SetBeforeCreate(t, func(p string) {
		if p == path {
			inlineDatabase(t, p, v)
		}
	})
	e := open(t, path)
	defer e.Close()
	if e.Layout() != 1 {
		t.Fatalf("layout %d; want the older build's 1", e.Layout())
	}
	wantBlob(t, e, v)
	e.Close()
	wantLayout(t, path, 1)
}

// orphans counts the keys without a value row and the value rows without
// a key of a layout 2 database.
func orphans(t *testing.T, db *sql.DB) (keys, values int) {
	t.Helper()
	return count(t, db, `SELECT count(*) FROM blobs WHERE vid NOT IN (SELECT vid FROM blob_values)`),
		count(t, db, `SELECT count(*) FROM blob_values WHERE vid NOT IN (SELECT vid FROM blobs)`)
}

// TestPutFailureLeavesNoOrphan: a put whose value insert fails (injected
// by a trigger), alone or among concurrent puts that commit in the same
// transaction, leaves neither its key nor its value; a dedup writes no
// value row; a failed key insert writes no value.
func TestPutFailureLeavesNoOrphan(t *testing.T) {
	ctx := t.Context()
	e := open(t, filepath.Join(t.TempDir(), "kv.db"))
	defer e.Close()
	db := e.DB()
	exec(t, db, `CREATE TRIGGER test_fail_value BEFORE INSERT ON blob_values WHEN substr(new.value, 1, 4) = CAST('FAIL' AS BLOB) BEGIN SELECT RAISE(ABORT, 'injected value failure'); END`)
	exec(t, db, `CREATE TRIGGER test_fail_key BEFORE INSERT ON blobs WHEN new.size = 7777 BEGIN SELECT RAISE(ABORT, 'injected key failure'); END`)

	bad := []byte("FAIL alone")
	if _, err := e.Put(ctx, blob.Sum(bad), bad); err == nil || !strings.Contains(err.Error(), "injected value failure") {
		t.Fatalf("Put of a failing value: %v", err)
	}
	if ok, err := e.Has(ctx, blob.Sum(bad)); err != nil || ok {
		t.Fatalf("Has after the failed put = %v, %v", ok, err)
	}
	if _, err := e.PutRows(ctx, blob.Sum(bad), bad, meta.Rows{}); err == nil {
		t.Fatal("PutRows of a failing value succeeded")
	}
	long := bytes.Repeat([]byte("k"), 7777)
	if _, err := e.Put(ctx, blob.Sum(long), long); err == nil || !strings.Contains(err.Error(), "injected key failure") {
		t.Fatalf("Put of a failing key: %v", err)
	}
	if k, v := orphans(t, db); k != 0 || v != 0 || count(t, db, `SELECT count(*) FROM blob_values`) != 0 {
		t.Fatalf("after failed puts alone: %d keys without a value, %d values without a key, %d value rows", k, v, count(t, db, `SELECT count(*) FROM blob_values`))
	}

	// Concurrent: the Batcher commits them together, each failing one in a
	// savepoint of its own.
	const n = 40
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			v := fmt.Appendf(nil, "ok %d", i)
			if i%2 == 1 {
				v = fmt.Appendf(nil, "FAIL %d", i)
			}
			_, errs[i] = e.Put(ctx, blob.Sum(v), v)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if (err != nil) != (i%2 == 1) {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if k, v := orphans(t, db); k != 0 || v != 0 {
		t.Fatalf("after concurrent puts: %d keys without a value, %d values without a key", k, v)
	}
	if got := count(t, db, `SELECT count(*) FROM blobs`); got != n/2 {
		t.Fatalf("%d keys; want %d", got, n/2)
	}
	for i := 0; i < n; i += 2 {
		wantBlob(t, e, fmt.Appendf(nil, "ok %d", i))
	}

	// Dedup, by Put and by PutRows.
	v := []byte("ok 0")
	if ok, err := e.Put(ctx, blob.Sum(v), v); err != nil || ok {
		t.Fatalf("dedup Put = %v, %v", ok, err)
	}
	if ok, err := e.PutRows(ctx, blob.Sum(v), v, meta.Rows{}); err != nil || ok {
		t.Fatalf("dedup PutRows = %v, %v", ok, err)
	}
	if got := count(t, db, `SELECT count(*) FROM blob_values`); got != n/2 {
		t.Fatalf("after dedups, %d value rows; want %d", got, n/2)
	}
}

// TestDeleteTakesValue: every way a key goes — Delete, DeleteMany (whose
// statement the GC's arbitration runs too), a DELETE by SQL — takes its
// value row.
func TestDeleteTakesValue(t *testing.T) {
	ctx := t.Context()
	e := open(t, filepath.Join(t.TempDir(), "kv.db"))
	defer e.Close()
	var ds []blob.Digest
	for i := range 6 {
		v := fmt.Appendf(nil, "blob %d", i)
		if _, err := e.Put(ctx, blob.Sum(v), v); err != nil {
			t.Fatal(err)
		}
		ds = append(ds, blob.Sum(v))
	}
	db := e.DB()
	if err := e.Delete(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}
	if got := count(t, db, `SELECT count(*) FROM blob_values`); got != 5 {
		t.Fatalf("after Delete, %d value rows; want 5", got)
	}
	if sizes, err := e.DeleteMany(ctx, ds[1:3]); err != nil || sizes[0] != 6 || sizes[1] != 6 {
		t.Fatalf("DeleteMany = %v, %v", sizes, err)
	}
	exec(t, db, `DELETE FROM blobs WHERE digest = ?`, ds[3][:])
	if got := count(t, db, `SELECT count(*) FROM blob_values`); got != 2 {
		t.Fatalf("after every delete, %d value rows; want 2", got)
	}
	if k, v := orphans(t, db); k != 0 || v != 0 {
		t.Fatalf("%d keys without a value, %d values without a key", k, v)
	}
	// A put after deletes reuses no live vid.
	w := []byte("after the deletes")
	if _, err := e.Put(ctx, blob.Sum(w), w); err != nil {
		t.Fatal(err)
	}
	for _, x := range [][]byte{[]byte("blob 4"), []byte("blob 5"), w} {
		wantBlob(t, e, x)
	}
}

// TestOlderBuildOnNewLayout: a build before layouts, opening a layout 2
// database, fails at open instead of seeing an empty store: its
// CREATE TABLE IF NOT EXISTS blobs does nothing, and its Get does not
// prepare. The size index that a build with one makes before failing is
// dropped by the next open here.
func TestOlderBuildOnNewLayout(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "kv.db")
	v := []byte("a blob of a new database")
	e := open(t, path)
	if _, err := e.Put(ctx, blob.Sum(v), v); err != nil {
		t.Fatal(err)
	}
	e.Close()

	db := rawDB(t, path)
	exec(t, db, inlineDDL)
	exec(t, db, `CREATE INDEX IF NOT EXISTS blobs_size ON blobs (digest, size)`)
	if _, err := db.PrepareContext(ctx, `SELECT size, value FROM blobs WHERE digest = ?`); err == nil || !strings.Contains(err.Error(), "no such column: value") {
		t.Fatalf("the older build's Get on layout 2 prepared: %v", err)
	}
	db.Close()

	var log bytes.Buffer
	e, err := sqlite.OpenLog(ctx, path, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if !strings.Contains(log.String(), "dropped the size index") {
		t.Errorf("log lacks the drop:\n%s", log.String())
	}
	if n := count(t, e.DB(), `SELECT count(*) FROM sqlite_master WHERE name = 'blobs_size'`); n != 0 {
		t.Fatal("the older build's size index is still there")
	}
	wantBlob(t, e, v)
}

// TestFlipValueBit: the tests' disk rot changes one bit of the stored
// value on either layout, and the engine reads it so.
func TestFlipValueBit(t *testing.T) {
	for _, l := range []int{1, 2} {
		t.Run(fmt.Sprint("layout ", l), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kv.db")
			v := []byte("rot me")
			if l == 1 {
				inlineDatabase(t, path, v)
			}
			e := open(t, path)
			defer e.Close()
			if e.Layout() != l {
				t.Fatalf("layout %d", e.Layout())
			}
			if _, err := e.Put(t.Context(), blob.Sum(v), v); err != nil {
				t.Fatal(err)
			}
			if err := sqlite.FlipValueBit(t.Context(), rawDB(t, path), blob.Sum(v)); err != nil {
				t.Fatal(err)
			}
			wantContent(t, e, blob.Sum(v), []byte("sot me"))
			if err := sqlite.FlipValueBit(t.Context(), rawDB(t, path), blob.Sum([]byte("absent"))); !errors.Is(err, blob.ErrMissing) {
				t.Fatalf("flip of an absent blob: %v; want ErrMissing", err)
			}
		})
	}
}

// TestMissingValueRow: a key whose value row is gone (damage, or a tool's
// DELETE of it) reads as a damaged row, not as an empty blob, even for
// the empty blob, whose size says nothing.
func TestMissingValueRow(t *testing.T) {
	e := open(t, filepath.Join(t.TempDir(), "kv.db"))
	defer e.Close()
	for _, v := range [][]byte{{}, []byte("gone")} {
		d := blob.Sum(v)
		if _, err := e.Put(t.Context(), d, v); err != nil {
			t.Fatal(err)
		}
		exec(t, e.DB(), `DELETE FROM blob_values WHERE vid = (SELECT vid FROM blobs WHERE digest = ?)`, d[:])
		if c, err := e.Open(t.Context(), d); err == nil || !strings.Contains(err.Error(), "value row (blob_values) is missing") {
			if c != nil {
				c.Close()
			}
			t.Fatalf("Open of a %d-byte blob without its value row: %v", len(v), err)
		}
	}
}
