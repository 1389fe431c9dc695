package sqlite

import (
	"context"
	"database/sql"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// WindowQueue implements engines.WindowHost in one transaction. A digest
// already queued keeps its row (and its time). The transaction also moves
// gc_clock.seen to now: what a reboot counts the rows' remaining delays
// from (clock.go).
func (e *Engine) WindowQueue(ctx context.Context, ds []blob.Digest, delay time.Duration) error {
	if len(ds) == 0 {
		return nil
	}
	return e.inTx(ctx, "window queue", func(ctx context.Context, tx *sql.Tx) error {
		now := e.clock.now()
		at := engines.AddNanos(now, max(delay, 0))
		st := tx.StmtContext(ctx, e.wStage)
		for _, d := range ds {
			if _, err := st.ExecContext(ctx, d[:], at); err != nil {
				return blob.Wrap("window queue", e.name, d, err)
			}
		}
		if _, err := tx.ExecContext(ctx, `UPDATE gc_clock SET seen = max(seen, ?) WHERE id = 1`, now); err != nil {
			return e.wrap("window queue", err)
		}
		return nil
	})
}

// WindowDue implements engines.WindowHost.
func (e *Engine) WindowDue(ctx context.Context, after blob.Digest, limit int) ([]blob.Digest, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := e.wDue.QueryContext(ctx, cursorArg(after), e.clock.now(), limit)
	if err != nil {
		return nil, e.wrap("window due", err)
	}
	defer rows.Close()
	var ds []blob.Digest
	if err := engines.ScanDigests(rows, func(d blob.Digest) { ds = append(ds, d) }); err != nil {
		return nil, e.wrap("window due", err)
	}
	return ds, nil
}

// WindowRemove implements engines.WindowHost; absent digests are ignored.
func (e *Engine) WindowRemove(ctx context.Context, ds []blob.Digest) error {
	if len(ds) == 0 {
		return nil
	}
	return e.inTx(ctx, "window remove", func(ctx context.Context, tx *sql.Tx) error {
		st := tx.StmtContext(ctx, e.wRemove)
		for _, d := range ds {
			if _, err := st.ExecContext(ctx, d[:]); err != nil {
				return blob.Wrap("window remove", e.name, d, err)
			}
		}
		return nil
	})
}

// WindowLen implements engines.WindowHost.
func (e *Engine) WindowLen(ctx context.Context) (int, error) {
	var n int
	if err := e.wLen.QueryRowContext(ctx).Scan(&n); err != nil {
		return 0, e.wrap("window len", err)
	}
	return n, nil
}

// inTx runs fn in a write transaction (write) and commits it, rolling
// back on any error. fn's error comes back as it is; a failed BEGIN or
// COMMIT is wrapped with op. fn is a Batcher job: it must use the context
// it is given, which no caller can cancel midway (see engines.Batcher),
// and be safe to run twice.
func (e *Engine) inTx(ctx context.Context, op string, fn func(ctx context.Context, tx *sql.Tx) error) error {
	var ferr error
	err := e.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		ferr = fn(ctx, tx)
		return ferr
	})
	if err != nil && err != ferr {
		err = e.wrap(op, err)
	}
	return err
}

// write runs fn in a write transaction: through the Batcher (eager) when
// the database is writable, so that puts, pin rows, window rows, deletes
// and the sweep's arbitration share its queue instead of polling SQLite's
// lock behind it; in a transaction of its own otherwise (a read-only
// database, where it fails).
func (e *Engine) write(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if e.batch != nil {
		return e.batch.Do(ctx, false, fn)
	}
	return engines.InTx(ctx, e.db, nil, func(tx *sql.Tx) error { return fn(ctx, tx) })
}
