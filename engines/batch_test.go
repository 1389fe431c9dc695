package engines

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"
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
	b.linger = time.Second // every lazy job below lands in one batch
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

// TestBatcherLazyRidesWithEager: a lazy job waits for company; an eager
// job that comes within the linger commits with it, at once.
func TestBatcherLazyRidesWithEager(t *testing.T) {
	db := openBatchDB(t)
	b := NewBatcher(db)
	defer b.Close()
	b.linger = 5 * time.Second
	lazy := make(chan error, 1)
	go func() { lazy <- b.Do(t.Context(), true, insert("lazy")) }()
	time.Sleep(50 * time.Millisecond) // queued, lingering
	select {
	case err := <-lazy:
		t.Fatalf("a lazy job alone committed before its linger: %v", err)
	default:
	}
	start := time.Now()
	if err := b.Do(t.Context(), false, insert("eager")); err != nil {
		t.Fatal(err)
	}
	if err := <-lazy; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the eager job waited %v for the lazy one's linger", d)
	}
	if n := b.batches.Load(); n != 1 {
		t.Errorf("%d transactions; want the two jobs in one", n)
	}

	// Alone, a lazy job commits once its linger is over.
	b.linger = 20 * time.Millisecond
	if err := b.Do(t.Context(), true, insert("alone")); err != nil {
		t.Fatal(err)
	}
	if got := rows(t, db); len(got) != 3 {
		t.Errorf("committed %v", got)
	}
}

// TestBatcherClose: Close commits what is queued without waiting out a
// linger, and refuses jobs after it.
func TestBatcherClose(t *testing.T) {
	db := openBatchDB(t)
	b := NewBatcher(db)
	b.linger = time.Hour
	done := make(chan error, 1)
	go func() { done <- b.Do(t.Context(), true, insert("queued")) }()
	time.Sleep(50 * time.Millisecond)
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
	b.linger = time.Second
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
	b.linger = time.Second
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
