package sqlite_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"path/filepath"
	"sync"
	"testing"
	"time"

	sqlitedrv "modernc.org/sqlite"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/gc"
)

var (
	holdOnce sync.Once
	holdCh   = make(chan chan struct{}, 1)
)

// registerHold registers alkblobfs_test_hold(x), true for every x: at
// x = 1 it hands the test a channel on holdCh and waits until the test
// closes it, so that a test can act while a statement is midway.
func registerHold(t *testing.T) {
	holdOnce.Do(func() {
		err := sqlitedrv.RegisterScalarFunction("alkblobfs_test_hold", 1, func(_ *sqlitedrv.FunctionContext, args []driver.Value) (driver.Value, error) {
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

// TestArbitrateCanceledCaller: a sweep canceled while its arbitration's
// statement runs, in a transaction the Batcher shares with another
// writer's job, neither interrupts that statement nor rolls back the
// other job's work (which the Batcher would then run a second time).
func TestArbitrateCanceledCaller(t *testing.T) {
	registerHold(t)
	e := open(t, filepath.Join(t.TempDir(), "kv.db"))
	defer e.Close()
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
		e.Batcher().Do(t.Context(), false, func(context.Context, *sql.Tx) error {
			close(started)
			<-stop
			return nil
		})
	})
	<-started
	otherCalls := 0
	var otherErr, arbErr error
	wg.Go(func() {
		otherErr = e.Batcher().Do(t.Context(), false, func(ctx context.Context, tx *sql.Tx) error {
			otherCalls++
			return insert(ctx, tx, "other")
		})
	})
	time.Sleep(50 * time.Millisecond) // queued first
	sweep, cancel := context.WithCancel(t.Context())
	defer cancel()
	wg.Go(func() {
		arbErr = e.Arbitrate(sweep, []blob.Digest{blob.Sum([]byte("x"))}, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5000)
				INSERT INTO t (k) SELECT 'arb-' || x FROM c WHERE alkblobfs_test_hold(x)`)
			return err
		})
	})
	time.Sleep(50 * time.Millisecond)
	close(stop)
	ch := <-holdCh // the arbitration's statement is midway
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

// The collector unlinks the large tier's blobs in ArbitrateAlone.
var _ gc.AloneHost = (*sqlite.Engine)(nil)
