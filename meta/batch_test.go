package meta

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"modernc.org/sqlite"
)

// openBatchDB is an SQLite database as the sqlite engine opens one, with a
// table t(k TEXT PRIMARY KEY).
func openBatchDB(t *testing.T) *sql.DB {
	t.Helper()
	dsn := "file:" + filepath.Join(t.TempDir(), "b.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE t (k TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return db
}

func insert(k string) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO t (k) VALUES (?)`, k)
		return err
	}
}

func rows(t *testing.T, db *sql.DB) map[string]bool {
	t.Helper()
	rs, err := db.Query(`SELECT k FROM t`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	m := map[string]bool{}
	for rs.Next() {
		var k string
		if err := rs.Scan(&k); err != nil {
			t.Fatal(err)
		}
		m[k] = true
	}
	return m
}

// doLazy queues jobs lazily at once and returns each one's error.
func doLazy(t *testing.T, b *Batcher, jobs map[string]func(ctx context.Context, tx *sql.Tx) error) map[string]error {
	errs := map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for k, fn := range jobs {
		wg.Go(func() {
			err := b.Do(t.Context(), true, fn)
			mu.Lock()
			errs[k] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	return errs
}

// TestBatcherIsolatesJobs: in one shared transaction, a job that fails
// after writing leaves nothing, gets its own error, and the others commit.
func TestBatcherIsolatesJobs(t *testing.T) {
	db := openBatchDB(t)
	b := NewBatcher(db)
	defer b.Close()
	b.SetLinger(time.Second) // every lazy job below lands in one batch
	bad := errors.New("job failed")
	jobs := map[string]func(ctx context.Context, tx *sql.Tx) error{
		"a": insert("a"),
		"b": func(ctx context.Context, tx *sql.Tx) error {
			if err := insert("b")(ctx, tx); err != nil {
				return err
			}
			return bad
		},
		"c": insert("c"),
		"d": insert("z"), // a constraint failure: its own error only
	}
	if _, err := db.Exec(`INSERT INTO t (k) VALUES ('z')`); err != nil {
		t.Fatal(err)
	}
	errs := doLazy(t, b, jobs)
	if n := b.batches.Load(); n != 1 {
		t.Fatalf("%d transactions for 4 jobs queued together; want 1", n)
	}
	if errs["a"] != nil || errs["c"] != nil || !errors.Is(errs["b"], bad) || errs["d"] == nil {
		t.Errorf("errors %v; want a, c nil, b its own, d a constraint failure", errs)
	}
	if got := rows(t, db); len(got) != 3 || !got["a"] || !got["c"] {
		t.Errorf("committed %v; want a, c and the earlier z", got)
	}
}

// TestBatcherGroupsConcurrent: many eager callers at once take far fewer
// transactions than calls, and every row commits.
func TestBatcherGroupsConcurrent(t *testing.T) {
	db := openBatchDB(t)
	b := NewBatcher(db)
	defer b.Close()
	const n = 400
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			if err := b.Do(t.Context(), false, insert(fmt.Sprint(i))); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := rows(t, db); len(got) != n {
		t.Fatalf("%d rows, want %d", len(got), n)
	}
	if tx := b.batches.Load(); tx >= n {
		t.Errorf("%d transactions for %d concurrent calls: nothing was grouped", tx, n)
	}
	t.Logf("%d calls, %d transactions", n, b.batches.Load())
}

// TestBatcherClose: Close commits what is queued without waiting out a
// linger, and refuses jobs after it.
func TestBatcherClose(t *testing.T) {
	db := openBatchDB(t)
	b := NewBatcher(db)
	b.SetLinger(time.Hour)
	done := make(chan error, 1)
	go func() { done <- b.Do(t.Context(), true, insert("queued")) }()
	queued(t, b, 1)
	b.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !rows(t, db)["queued"] {
		t.Error("a job queued before Close did not commit")
	}
	if err := b.Do(t.Context(), false, insert("late")); !errors.Is(err, ErrBatcherClosed) {
		t.Errorf("Do after Close: %v, want ErrBatcherClosed", err)
	}
	b.Close() // twice is fine
}

// TestBatcherCanceledCaller: a caller's canceled context does not reach
// the statements of a shared transaction.
func TestBatcherCanceledCaller(t *testing.T) {
	db := openBatchDB(t)
	b := NewBatcher(db)
	defer b.Close()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := b.Do(ctx, false, insert("x")); err != nil {
		t.Fatalf("a canceled caller's job: %v", err)
	}
	if !rows(t, db)["x"] {
		t.Error("not committed")
	}
}

// TestBatcherTransactionLost: when SQLite rolls the whole shared
// transaction back (a full disk), the job that hit it gets its own error
// and the others still commit, each in a transaction of its own.
func TestBatcherTransactionLost(t *testing.T) {
	db := openBatchDB(t)
	db.SetMaxOpenConns(1) // the page limit is per connection
	if _, err := db.Exec(`PRAGMA max_page_count = 40`); err != nil {
		t.Fatal(err)
	}
	b := NewBatcher(db)
	defer b.Close()
	b.SetLinger(time.Second)
	big := make([]byte, 1<<20)
	jobs := map[string]func(ctx context.Context, tx *sql.Tx) error{
		"a": insert("a"),
		"big": func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO t (k) VALUES (?)`, string(big))
			return err
		},
		"c": insert("c"),
	}
	errs := doLazy(t, b, jobs)
	if errs["a"] != nil || errs["c"] != nil || errs["big"] == nil || !strings.Contains(errs["big"].Error(), "full") {
		t.Errorf("errors %v; want a, c nil and big's own 'full'", errs)
	}
	if got := rows(t, db); len(got) != 2 || !got["a"] || !got["c"] {
		t.Errorf("committed %v; want a and c", got)
	}
}

// TestBatcherPanic: a job that panics panics in its caller, and the other
// jobs of its batch commit.
func TestBatcherPanic(t *testing.T) {
	db := openBatchDB(t)
	b := NewBatcher(db)
	defer b.Close()
	b.SetLinger(time.Second)
	var wg sync.WaitGroup
	var okErr error
	var recovered any
	wg.Go(func() { okErr = b.Do(t.Context(), true, insert("ok")) })
	wg.Go(func() {
		defer func() { recovered = recover() }()
		b.Do(t.Context(), true, func(ctx context.Context, tx *sql.Tx) error {
			if err := insert("boom")(ctx, tx); err != nil {
				return err
			}
			panic("bug")
		})
	})
	wg.Wait()
	if okErr != nil {
		t.Fatal(okErr)
	}
	if s, _ := recovered.(string); !strings.HasPrefix(s, "bug") {
		t.Errorf("recovered %v; want the job's panic", recovered)
	}
	if got := rows(t, db); len(got) != 1 || !got["ok"] {
		t.Errorf("committed %v; want ok only", got)
	}
}

// hold occupies b's loop with a job of its own until release is called,
// so that the jobs queued meanwhile make up the next batch, in the order
// they were queued (see queued).
func hold(t *testing.T, b *Batcher) (release func()) {
	t.Helper()
	started, stop, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		b.Do(t.Context(), false, func(context.Context, *sql.Tx) error {
			close(started)
			<-stop
			return nil
		})
	}()
	<-started
	return func() { close(stop); <-done }
}

// queued waits until n jobs wait in b's queue.
func queued(t *testing.T, b *Batcher, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		k := b.Queued()
		if k >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d jobs queued, want %d", k, n)
		}
	}
}

// TestBatcherAlone: a DoAlone job shares no transaction — the jobs queued
// before it commit first, those after it later — and runs once.
func TestBatcherAlone(t *testing.T) {
	db := openBatchDB(t)
	b := NewBatcher(db)
	defer b.Close()
	b.SetLinger(time.Second)
	release := hold(t, b)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	wg.Go(func() { errs[0] = b.Do(t.Context(), true, insert("before")) })
	queued(t, b, 1)
	calls := 0
	var saw map[string]bool
	wg.Go(func() {
		errs[1] = b.DoAlone(t.Context(), func(ctx context.Context, tx *sql.Tx) error {
			calls++
			saw = map[string]bool{}
			rs, err := tx.QueryContext(ctx, `SELECT k FROM t`)
			if err != nil {
				return err
			}
			defer rs.Close()
			for rs.Next() {
				var k string
				if err := rs.Scan(&k); err != nil {
					return err
				}
				saw[k] = true
			}
			return insert("alone")(ctx, tx)
		})
	})
	queued(t, b, 2)
	wg.Go(func() { errs[2] = b.Do(t.Context(), true, insert("after")) })
	queued(t, b, 3)
	before := b.batches.Load()
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("job %d: %v", i, err)
		}
	}
	if n := b.batches.Load() - before; n != 3 {
		t.Errorf("%d transactions for a job alone between two others; want 3", n)
	}
	if calls != 1 || !saw["before"] || saw["after"] {
		t.Errorf("the job alone ran %d times and saw %v; want once, after 'before' and before 'after'", calls, saw)
	}
	if got := rows(t, db); len(got) != 3 {
		t.Errorf("committed %v", got)
	}
}

var (
	holdOnce sync.Once
	holdCh   = make(chan chan struct{}, 1)
)

// registerHold registers the SQL function alkblobfs_test_hold(x), true for
// every x: at x = 1 it hands the test a channel on holdCh and waits until
// the test closes it, so that a test can act while a statement is midway.
func registerHold(t *testing.T) {
	holdOnce.Do(func() {
		err := sqlite.RegisterScalarFunction("alkblobfs_test_hold", 1, func(_ *sqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
			if x, _ := args[0].(int64); x == 1 {
				ch := make(chan struct{})
				holdCh <- ch
				<-ch
			}
			return int64(1), nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// midway is an INSERT that stops at its first row in alkblobfs_test_hold
// and then has thousands of steps to go: a canceled context that reaches
// it interrupts it, and SQLite then rolls back the whole transaction.
const midway = `WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5000)
	INSERT INTO t (k) SELECT 'midway-' || x FROM c WHERE alkblobfs_test_hold(x)`

// TestBatcherCanceledMidStatement: a caller canceled while its job's
// statement runs cannot interrupt it, so the job before it in the shared
// transaction commits once, not rolled back and run again. The control
// shows what capturing the caller's context (against Do's rule) did.
func TestBatcherCanceledMidStatement(t *testing.T) {
	registerHold(t)
	for _, tc := range []struct {
		name    string
		capture bool // the job uses the caller's context, not its own
	}{{"batcher context", false}, {"captured caller context (control)", true}} {
		t.Run(tc.name, func(t *testing.T) {
			db := openBatchDB(t)
			b := NewBatcher(db)
			defer b.Close()
			release := hold(t, b)
			var wg sync.WaitGroup
			otherCalls := 0
			var otherErr, midErr error
			wg.Go(func() {
				otherErr = b.Do(t.Context(), false, func(ctx context.Context, tx *sql.Tx) error {
					otherCalls++
					return insert("other")(ctx, tx)
				})
			})
			queued(t, b, 1)
			caller, cancel := context.WithCancel(t.Context())
			defer cancel()
			wg.Go(func() {
				midErr = b.Do(caller, false, func(ctx context.Context, tx *sql.Tx) error {
					if tc.capture {
						ctx = caller
					}
					_, err := tx.ExecContext(ctx, midway)
					return err
				})
			})
			queued(t, b, 2)
			before := b.batches.Load()
			release()
			ch := <-holdCh // the statement is midway
			cancel()
			time.Sleep(20 * time.Millisecond) // for the driver to see it
			close(ch)
			wg.Wait()
			got := rows(t, db)
			if tc.capture {
				// The interrupt rolled back the whole transaction: the
				// other job ran again, alone.
				if midErr == nil || otherCalls != 2 {
					t.Fatalf("control: midway %v, other ran %d times; want an interrupt and a re-run", midErr, otherCalls)
				}
				return
			}
			if otherErr != nil || midErr != nil {
				t.Fatalf("other: %v, midway: %v", otherErr, midErr)
			}
			if otherCalls != 1 || b.batches.Load()-before != 1 {
				t.Errorf("other ran %d times in %d transactions; want once, in one shared", otherCalls, b.batches.Load()-before)
			}
			if len(got) != 5001 || !got["other"] || !got["midway-5000"] {
				t.Errorf("%d rows committed; want other and midway's 5000", len(got))
			}
		})
	}
}
