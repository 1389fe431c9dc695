package sqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
)

// plans is the EXPLAIN QUERY PLAN of each of e's size lookups, by name.
func plans(t *testing.T, e *sqlite.Engine) map[string]string {
	t.Helper()
	got := map[string]string{}
	for name, q := range e.SizeSQL() {
		args := make([]any, strings.Count(q, "?"))
		rows, err := e.DB().QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+q, args...)
		if err != nil {
			t.Fatalf("explain %s (%s): %v", name, q, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		got[name] = strings.Join(plan, "; ")
	}
	return got
}

// wantPlans fails t unless every size lookup of e reads want: the size
// index (covering: no row of the blobs table read) on layout 1, the key
// table's primary key on layout 2.
func wantPlans(t *testing.T, e *sqlite.Engine, want string) {
	t.Helper()
	for name, plan := range plans(t, e) {
		if !strings.Contains(plan, want) || strings.Contains(plan, "blob_values") {
			t.Errorf("%s: plan %q; want %q", name, plan, want)
		}
	}
}

// The plans: the size index's, and the primary key's of the blobs table
// (layout 2's key table, or layout 1's table without the index).
const (
	covered    = "USING COVERING INDEX blobs_size"
	primaryKey = "SEARCH blobs USING PRIMARY KEY"
)

// TestSizeIndexPlan: on layout 1 Has, Size, List and SizeMany read the
// covering index blobs_size(digest, size), not the blobs table whose leaf
// pages hold the values; on layout 2 they read the key table, which holds
// no values, and there is no size index.
func TestSizeIndexPlan(t *testing.T) {
	e := open(t, filepath.Join(t.TempDir(), "kv.db"))
	defer e.Close()
	wantPlans(t, e, primaryKey)
	old := filepath.Join(t.TempDir(), "kv.db")
	oldDatabase(t, old, 1)
	e = open(t, old)
	defer e.Close()
	wantPlans(t, e, covered)
}

// oldDatabase makes a database of an older build at path (layout 1, no
// size index) holding blobs of sizes 0 to n-1 bytes, and returns their
// digests.
func oldDatabase(t *testing.T, path string, n int) []blob.Digest {
	t.Helper()
	var vs [][]byte
	for i := range n {
		vs = append(vs, bytes.Repeat([]byte{byte(i)}, i))
	}
	return inlineDatabase(t, path, vs...)
}

// wantSizes fails t unless e answers the sizes oldDatabase gave ds, and
// -1 for a digest it does not hold, through SizeMany, Size and List.
func wantSizes(t *testing.T, e *sqlite.Engine, ds []blob.Digest) {
	t.Helper()
	absent := blob.Sum([]byte("absent"))
	sizes, err := e.SizeMany(t.Context(), append(ds[:len(ds):len(ds)], absent))
	if err != nil {
		t.Fatal(err)
	}
	for i := range ds {
		if sizes[i] != int64(i) {
			t.Fatalf("SizeMany[%d] = %d; want %d", i, sizes[i], i)
		}
		if n, err := e.Size(t.Context(), ds[i]); err != nil || n != int64(i) {
			t.Fatalf("Size of blob %d = %d, %v", i, n, err)
		}
	}
	if sizes[len(ds)] != -1 {
		t.Fatalf("SizeMany of an absent digest = %d; want -1", sizes[len(ds)])
	}
	listed := 0
	for _, err := range e.List(t.Context(), blob.Digest{}) {
		if err != nil {
			t.Fatal(err)
		}
		listed++
	}
	if listed != len(ds) {
		t.Fatalf("List: %d entries; want %d", listed, len(ds))
	}
}

// TestSizeIndexOldDatabase: opening a database of an older build builds
// the size index once, says so in the log, and the engine answers from it
// what the table holds.
func TestSizeIndexOldDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	ds := oldDatabase(t, path, 300)
	var log bytes.Buffer
	e, err := sqlite.OpenLog(t.Context(), path, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"building the size index", "built the size index"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log of the first open lacks %q:\n%s", want, log.String())
		}
	}
	wantPlans(t, e, covered)
	wantSizes(t, e, ds)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	log.Reset()
	e, err = sqlite.OpenLog(t.Context(), path, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if log.Len() != 0 {
		t.Errorf("the second open logged:\n%s", log.String())
	}
	wantPlans(t, e, covered)
}

// TestSizeIndexRacingOpens: processes of a host opening one old database
// at once (separate pools, as separate processes are to SQLite's locks)
// all open, one builds the index and the others find it.
func TestSizeIndexRacingOpens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	ds := oldDatabase(t, path, 200)
	for _, e := range openAtOnce(t, path, 4) {
		wantPlans(t, e, covered)
		wantSizes(t, e, ds)
	}
}

// TestSizeIndexReadOnly: an old database on read-only media, which cannot
// get the index, opens and answers from the table; a database of layout 2
// opens there too, and answers from its key table.
func TestSizeIndexReadOnly(t *testing.T) {
	for _, l := range []int{1, 2} {
		t.Run(fmt.Sprint("layout ", l), func(t *testing.T) {
			dir := t.TempDir()
			var ds []blob.Digest
			if l == 1 {
				ds = oldDatabase(t, filepath.Join(dir, "kv.db"), 100)
			} else {
				ds = newDatabase(t, filepath.Join(dir, "kv.db"), 100)
			}
			e := openReadOnly(t, dir)
			defer e.Close()
			if e.Layout() != l {
				t.Fatalf("layout %d", e.Layout())
			}
			wantPlans(t, e, primaryKey)
			wantSizes(t, e, ds)
			v := bytes.Repeat([]byte{byte(50)}, 50)
			wantBlob(t, e, v)
		})
	}
}

// newDatabase is oldDatabase of this build's: layout 2.
func newDatabase(t *testing.T, path string, n int) []blob.Digest {
	t.Helper()
	e := open(t, path)
	defer e.Close()
	var ds []blob.Digest
	for i := range n {
		v := bytes.Repeat([]byte{byte(i)}, i)
		if _, err := e.Put(t.Context(), blob.Sum(v), v); err != nil {
			t.Fatal(err)
		}
		ds = append(ds, blob.Sum(v))
	}
	return ds
}

// openReadOnly opens dir/kv.db through a read-only bind mount of dir.
func openReadOnly(t *testing.T, dir string) *sqlite.Engine {
	t.Helper()
	ro := t.TempDir()
	if err := syscall.Mount(dir, ro, "", syscall.MS_BIND, ""); err != nil {
		if errors.Is(err, syscall.EPERM) {
			t.Skip("a read-only bind mount needs root:", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(ro, syscall.MNT_DETACH) })
	if err := syscall.Mount("", ro, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	e, err := sqlite.Open(context.Background(), filepath.Join(ro, "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	if !e.ReadOnly() {
		e.Close()
		t.Fatal("opened read-write on a read-only mount")
	}
	return e
}

// TestSizeIndexBusy: an old database whose write lock another process
// holds past the busy timeout (10 s, hence ALKBLOBFS_LONG) opens without
// the index, says so, and answers from the table.
func TestSizeIndexBusy(t *testing.T) {
	if os.Getenv("ALKBLOBFS_LONG") == "" {
		t.Skip("waits out the 10 s busy timeout; set ALKBLOBFS_LONG=1")
	}
	path := filepath.Join(t.TempDir(), "kv.db")
	ds := oldDatabase(t, path, 100)
	other, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(t.Context(), `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	type opened struct {
		e   *sqlite.Engine
		err error
	}
	done := make(chan opened, 1)
	go func() {
		e, err := sqlite.OpenLog(t.Context(), path, slog.New(slog.NewTextHandler(&log, nil)))
		done <- opened{e, err}
	}()
	var o opened
	select {
	case o = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("Open still waiting 60 s after the lock was taken")
	}
	if _, err := conn.ExecContext(t.Context(), `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	if o.err != nil {
		t.Fatalf("Open beside a held write lock: %v", o.err)
	}
	defer o.e.Close()
	if !strings.Contains(log.String(), "opened without the size index") {
		t.Errorf("log lacks the fallback:\n%s", log.String())
	}
	wantPlans(t, o.e, primaryKey)
	wantSizes(t, o.e, ds)
}
