package meta_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/meta"
	"github.com/alkblobfs/alkblobfs/meta/metatest"
)

// The SQLite dialect through the engine that opens it.

func openSQLiteEngine(t *testing.T, path string) engines.Engine {
	t.Helper()
	e, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestSQLiteHost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	metatest.Host(t, func(t *testing.T) engines.Engine { return openSQLiteEngine(t, path) })
}

func TestSQLiteWindow(t *testing.T) {
	metatest.WindowEngine(t, func(t *testing.T) engines.Engine {
		return openSQLiteEngine(t, filepath.Join(t.TempDir(), "kv.db"))
	})
}

func TestSQLiteLedger(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	metatest.Ledger(t, func(t *testing.T) engines.Engine { return openSQLiteEngine(t, path) })
}

// TestSQLiteReopen: the delete window is durable across a close.
func TestSQLiteReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	metatest.Reopen(t, func(t *testing.T) engines.Engine { return openSQLiteEngine(t, path) })
}

// The collector's SQLite host is a serial one (gc.Collector.BeginPublish,
// linked).
var _ meta.SerialHost = (*meta.SQLite)(nil)

// sqliteState is the SQLite dialect opened on its own, over a database
// whose one blob table is blobs(digest, size), as the engine opens it
// (IMMEDIATE transactions, WAL, a Batcher), for the cases that need the
// state's own hooks: the boot clock a test moves, the Batcher a test
// holds.
type sqliteState struct {
	*meta.SQLite
	db    *sql.DB
	batch *meta.Batcher
	once  sync.Once
}

func (s *sqliteState) Close() error {
	s.once.Do(func() {
		s.batch.Close()
		s.SQLite.Close()
		s.db.Close()
	})
	return nil
}

func (s *sqliteState) DB() *sql.DB { return s.db }

func openSQLiteState(t *testing.T, path string, b meta.Boot) *sqliteState {
	t.Helper()
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() +
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS blobs (digest BLOB PRIMARY KEY, size INTEGER NOT NULL)`); err != nil {
		db.Close()
		t.Fatal(err)
	}
	batch := meta.NewBatcher(db)
	m, err := meta.OpenSQLite(t.Context(), meta.SQLiteConfig{Name: "sqlite:" + path, Path: path, DB: db, Batch: batch, Boot: b,
		BlobDelete: `DELETE FROM blobs WHERE digest = ? RETURNING size`})
	if err != nil {
		batch.Close()
		db.Close()
		t.Fatal(err)
	}
	s := &sqliteState{SQLite: m, db: db, batch: batch}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestSQLiteOpenNeedsBlobDelete: a Host opened without the engine's blob
// delete could delete no dead blob; the open says what is missing.
func TestSQLiteOpenNeedsBlobDelete(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	db, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m, err := meta.OpenSQLite(t.Context(), meta.SQLiteConfig{Name: "sqlite:" + path, Path: path, DB: db, Boot: meta.HostBoot})
	if err == nil {
		m.Close()
		t.Fatal("OpenSQLite without BlobDelete succeeded")
	}
	if !strings.Contains(err.Error(), "no BlobDelete") || !strings.Contains(err.Error(), path) {
		t.Fatalf("OpenSQLite without BlobDelete = %v; want an error naming the database and what is missing", err)
	}
}

// TestSQLiteLinksLiveFails: the namespaces' liveness read failing in an
// arbitration fails it, deleting nothing, with an error that names the
// engine and the operation (no registry wraps it on this path).
func TestSQLiteLinksLiveFails(t *testing.T) {
	ctx := t.Context()
	e := openSQLiteEngine(t, filepath.Join(t.TempDir(), "kv.db"))
	defer e.Close()
	l, err := meta.OpenLinks(ctx, meta.LinksConfig{Engine: e.(engines.SQL)})
	if err != nil {
		t.Fatal(err)
	}
	v := []byte("live read fails")
	d := blob.Sum(v)
	if _, err := e.(engines.KV).Put(ctx, d, v); err != nil {
		t.Fatal(err)
	}
	if _, err := e.(engines.SQL).DB().ExecContext(ctx, `ALTER TABLE ns_pending RENAME TO ns_pending_gone`); err != nil {
		t.Fatal(err)
	}
	_, err = e.(meta.Holder).Meta().Host.Arbitrate(ctx, meta.Arbitration{Digests: []blob.Digest{d}, Live: []meta.Liveness{l}})
	if err == nil || !strings.Contains(err.Error(), "namespaces of "+e.Name()+": islive") || !strings.Contains(err.Error(), "ns_pending") {
		t.Fatalf("Arbitrate with the intents' table gone = %v; want an error naming the engine, the operation and the table", err)
	}
	if ok, err := e.Has(ctx, d); !ok || err != nil {
		t.Fatalf("Has after the failed arbitration = %v, %v; want the blob kept", ok, err)
	}
}

// TestSQLiteWriteRowsPin: a put's pin row, written by WriteRows in the
// put's transaction, commits with it or not at all.
func TestSQLiteWriteRowsPin(t *testing.T) {
	ctx := t.Context()
	s := openSQLiteState(t, filepath.Join(t.TempDir(), "kv.db"), meta.HostBoot)
	d := blob.Sum([]byte("pinned by a put"))
	for _, commit := range []bool{false, true} {
		tx, err := s.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.WriteRows(ctx, tx, meta.Rows{Pin: &meta.PinRow{D: d, Owner: "put", TTL: time.Hour}}); err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		out, err := s.Arbitrate(ctx, meta.Arbitration{Digests: []blob.Digest{d}, Outside: func(_ context.Context, ds []blob.Digest) ([]int64, error) {
			return make([]int64, len(ds)), nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		if got := out[0] == meta.Protected; got != commit {
			t.Fatalf("a pin row written in a transaction that committed=%v protects its digest: %v", commit, got)
		}
	}
}

// TestSQLiteLeaseFile: a held lease's file beside the database names the
// holder's pid, for the message another process prints.
func TestSQLiteLeaseFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	s := openSQLiteState(t, path, meta.HostBoot)
	l, held, err := s.SweepLease(t.Context())
	if err != nil || !held {
		t.Fatalf("SweepLease = %v, %v", held, err)
	}
	defer l.Release()
	if err := l.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscan(mustRead(t, path+".gc-lease"), new(int)); err != nil {
		t.Fatalf("the lease file holds no pid: %v", err)
	}
}

// TestArbitrateCanceledCaller: a sweep canceled while its arbitration's
// statement runs, in a transaction the Batcher shares with another
// writer's job, neither interrupts that statement nor rolls back the
// other job's work (which the Batcher would then run a second time).
func TestArbitrateCanceledCaller(t *testing.T) {
	meta.RegisterHold(t)
	e := openSQLiteState(t, filepath.Join(t.TempDir(), "kv.db"), meta.HostBoot)
	// The arbitration's liveness table is a view whose every row calls
	// alkblobfs_test_hold: its read is the statement the test cancels
	// midway.
	x := blob.Sum([]byte("x"))
	for _, q := range []string{
		`CREATE TABLE t (k TEXT PRIMARY KEY)`,
		`CREATE VIEW held AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5000)
			SELECT CASE WHEN alkblobfs_test_hold(x) THEN zeroblob(32) END AS digest FROM c`,
	} {
		if _, err := e.DB().Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.DB().Exec(`INSERT INTO blobs (digest, size) VALUES (?, 1)`, x[:]); err != nil {
		t.Fatal(err)
	}
	held, err := meta.NewLiveTable(t.Context(), e.DB(), "sqlite", "held")
	if err != nil {
		t.Fatal(err)
	}
	insert := func(ctx context.Context, tx *sql.Tx, k string) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO t (k) VALUES (?)`, k)
		return err
	}
	// Hold the Batcher's loop so that the two jobs below share the next
	// transaction, the other writer's first.
	release := holdWriter(t, e)
	var wg sync.WaitGroup
	otherCalls := 0
	var otherErr, arbErr error
	var arbOut []int64
	wg.Go(func() {
		otherErr = e.batch.Do(t.Context(), false, func(ctx context.Context, tx *sql.Tx) error {
			otherCalls++
			return insert(ctx, tx, "other")
		})
	})
	awaitQueued(t, e, 1) // the other writer's job is queued first
	sweep, cancel := context.WithCancel(t.Context())
	defer cancel()
	wg.Go(func() {
		arbOut, arbErr = e.Arbitrate(sweep, meta.Arbitration{Digests: []blob.Digest{x}, Live: []meta.Liveness{held}})
	})
	awaitQueued(t, e, 2)
	release()
	var ch chan struct{}
	select {
	case ch = <-meta.HoldCh: // the arbitration's statement is midway
	case <-time.After(time.Minute):
		t.Fatal("the arbitration's read of its liveness table did not start in a minute")
	}
	cancel()
	time.Sleep(20 * time.Millisecond) // for the driver to see it
	close(ch)
	waitAll(t, &wg)
	if otherErr != nil || arbErr != nil || len(arbOut) != 1 || arbOut[0] != 1 {
		t.Errorf("other job: %v; arbitration: %v, %v (want x deleted, its size 1)", otherErr, arbOut, arbErr)
	}
	if otherCalls != 1 {
		t.Errorf("the other job ran %d times: its work was rolled back with the canceled arbitration's", otherCalls)
	}
	var n, blobs int
	if err := e.DB().QueryRow(`SELECT (SELECT count(*) FROM t), (SELECT count(*) FROM blobs)`).Scan(&n, &blobs); err != nil || n != 1 || blobs != 0 {
		t.Errorf("%d rows of t and %d blob rows committed (%v); want the other job's, and x deleted", n, blobs, err)
	}
}

// holdWriter holds e's writer (metatest.HoldWriter); the test fails if it
// cannot.
func holdWriter(t *testing.T, e *sqliteState) (release func()) {
	t.Helper()
	release, err := metatest.HoldWriter(t.Context(), e.batch)
	if err != nil {
		t.Fatal(err)
	}
	return release
}

// waitAll waits for wg, for at most a minute.
func waitAll(t *testing.T, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the Batcher's jobs had not all returned a minute after they were let go")
	}
}

// awaitQueued waits until n jobs wait in e's Batcher, for at most a
// minute.
func awaitQueued(t *testing.T, e *sqliteState, n int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); e.batch.Queued() != n; {
		if time.Now().After(deadline) {
			t.Fatalf("the Batcher holds %d queued jobs after a minute, want %d", e.batch.Queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSQLiteArbitrationRerun: an arbitration that the Batcher runs again
// after its shared transaction rolled back answers what the run that
// committed did. Its first run shares a transaction after another
// writer's job that removed a link, and deletes the linked blob's row on
// its strength; a later job then ends that transaction (SQLite does on a
// full disk: everything in it rolls back), and the arbitration runs
// again alone, where the link is back, the other job's own run alone
// having failed too (the disk is still full). The collector unlinks
// large-tier files on what the answer says was deleted: an answer from
// the rolled-back run lost a linked blob.
func TestSQLiteArbitrationRerun(t *testing.T) {
	e := openSQLiteState(t, filepath.Join(t.TempDir(), "kv.db"), meta.HostBoot)
	if _, err := e.DB().Exec(`CREATE TABLE refs (digest BLOB NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var ds []blob.Digest
	for i := range 4 {
		d := blob.Sum([]byte{byte(i)})
		ds = append(ds, d)
		if _, err := e.DB().Exec(`INSERT INTO blobs (digest, size) VALUES (?, ?)`, d[:], 10+i); err != nil {
			t.Fatal(err)
		}
	}
	linked, lost := ds[1], ds[2]
	for _, d := range []blob.Digest{linked, lost} {
		if _, err := e.DB().Exec(`INSERT INTO refs (digest) VALUES (?)`, d[:]); err != nil {
			t.Fatal(err)
		}
	}
	refs, err := meta.NewLiveTable(t.Context(), e.DB(), "sqlite", "refs")
	if err != nil {
		t.Fatal(err)
	}
	// Hold the Batcher's loop so that the three jobs below share the next
	// transaction, in queue order.
	release := holdWriter(t, e)
	var wg sync.WaitGroup
	var unlinkRuns, endRuns int // the ending job keeps its error: it runs once
	errFull := errors.New("test: the disk is still full")
	wg.Go(func() {
		e.batch.Do(t.Context(), false, func(ctx context.Context, tx *sql.Tx) error {
			if unlinkRuns++; unlinkRuns > 1 {
				return errFull
			}
			_, err := tx.ExecContext(ctx, `DELETE FROM refs WHERE digest = ?`, lost[:])
			return err
		})
	})
	awaitQueued(t, e, 1)
	var out []int64
	var arbErr error
	wg.Go(func() {
		out, arbErr = e.Arbitrate(t.Context(), meta.Arbitration{Digests: ds, Live: []meta.Liveness{refs}})
	})
	awaitQueued(t, e, 2)
	wg.Go(func() {
		e.batch.Do(t.Context(), false, func(ctx context.Context, tx *sql.Tx) error {
			endRuns++
			// What SQLite does on a full disk: the whole transaction ends,
			// whatever the savepoints.
			_, err := tx.ExecContext(ctx, `ROLLBACK`)
			return err
		})
	})
	awaitQueued(t, e, 3)
	release()
	waitAll(t, &wg)
	if unlinkRuns != 2 || endRuns != 1 {
		t.Fatalf("the unlink ran %d times, the ending job %d: the test wants the shared transaction rolled back and the other jobs run again", unlinkRuns, endRuns)
	}
	want := []int64{10, meta.Protected, meta.Protected, 13}
	if arbErr != nil || !slices.Equal(out, want) {
		t.Errorf("Arbitrate = %v, %v; want %v, what the committed run did", out, arbErr, want)
	}
	for i, d := range ds {
		var n int
		if err := e.DB().QueryRow(`SELECT count(*) FROM blobs WHERE digest = ?`, d[:]).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if kept := i == 1 || i == 2; (n == 1) != kept {
			t.Errorf("blob %d: %d rows; want it kept=%v", i, n, kept)
		}
	}
}
