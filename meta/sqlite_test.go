package meta_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/gc"
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

// The collector unlinks the large tier's blobs in ArbitrateAlone; the
// collector's SQLite host is a serial one (gc.Collector.BeginPublish, linked).
var (
	_ gc.AloneHost    = (*meta.SQLite)(nil)
	_ meta.SerialHost = (*meta.SQLite)(nil)
)

// sqliteState is the SQLite dialect opened on its own, over a database
// with no blob tables, as the engine opens it (IMMEDIATE transactions,
// WAL, a Batcher), for the cases that need the state's own hooks: the
// boot clock a test moves, the Batcher a test holds.
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
	batch := meta.NewBatcher(db)
	m, err := meta.OpenSQLite(t.Context(), meta.SQLiteConfig{Name: "sqlite:" + path, Path: path, DB: db, Batch: batch, Boot: b})
	if err != nil {
		batch.Close()
		db.Close()
		t.Fatal(err)
	}
	s := &sqliteState{SQLite: m, db: db, batch: batch}
	t.Cleanup(func() { s.Close() })
	return s
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
	if _, err := e.DB().Exec(`CREATE TABLE t (k TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	insert := func(ctx context.Context, tx *sql.Tx, k string) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO t (k) VALUES (?)`, k)
		return err
	}
	// Hold the Batcher's loop so that the two jobs below share the next
	// transaction, the other writer's first.
	started, stop := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		e.batch.Do(t.Context(), false, func(context.Context, *sql.Tx) error {
			close(started)
			<-stop
			return nil
		})
	})
	<-started
	otherCalls := 0
	var otherErr, arbErr error
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
		arbErr = e.Arbitrate(sweep, []blob.Digest{blob.Sum([]byte("x"))}, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5000)
				INSERT INTO t (k) SELECT 'arb-' || x FROM c WHERE alkblobfs_test_hold(x)`)
			return err
		})
	})
	awaitQueued(t, e, 2)
	close(stop)
	ch := <-meta.HoldCh // the arbitration's statement is midway
	cancel()
	time.Sleep(20 * time.Millisecond) // for the driver to see it
	close(ch)
	wg.Wait()
	if otherErr != nil || arbErr != nil {
		t.Errorf("other job: %v; arbitration: %v", otherErr, arbErr)
	}
	if otherCalls != 1 {
		t.Errorf("the other job ran %d times: its work was rolled back with the canceled arbitration's", otherCalls)
	}
	var n int
	if err := e.DB().QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil || n != 5001 {
		t.Errorf("%d rows committed (%v); want 5001", n, err)
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
