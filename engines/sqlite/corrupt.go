package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

var _ engines.CorruptLedger = (*Engine)(nil)

// The corrupt ledger (engines.CorruptLedger), beside the GC tables: every
// process of the host that opens the database reads it. marked is the row
// clock (clock.go).
const corruptSchema = `CREATE TABLE IF NOT EXISTS gc_corrupt (
	digest BLOB PRIMARY KEY,
	file   BLOB NOT NULL,
	reason TEXT NOT NULL,
	marked INTEGER NOT NULL
) WITHOUT ROWID`

// initCorrupt creates gc_corrupt. A database on read-only media that
// predates the table cannot get it, and has no record to read: the
// ledger then reads as empty (noLedger) and refuses writes.
func (e *Engine) initCorrupt(ctx context.Context) error {
	if !e.ro {
		if _, err := e.db.ExecContext(ctx, corruptSchema); err != nil {
			return e.wrap("open", fmt.Errorf("create schema: %w", err))
		}
		return nil
	}
	var n int
	if err := e.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'gc_corrupt'`).Scan(&n); err != nil {
		return e.wrap("open", err)
	}
	e.noLedger = n == 0
	return nil
}

// MarkCorrupt implements engines.CorruptLedger.
func (e *Engine) MarkCorrupt(ctx context.Context, d blob.Digest, file []byte, reason string) error {
	if e.noLedger {
		return e.wrapD("mark corrupt", d, blob.ErrReadOnly)
	}
	_, err := e.db.ExecContext(ctx, `INSERT INTO gc_corrupt (digest, file, reason, marked) VALUES (?, ?, ?, ?)
		ON CONFLICT (digest) DO UPDATE SET file = excluded.file, reason = excluded.reason, marked = excluded.marked`,
		d[:], engines.NonNil(file), reason, e.clock.now())
	return e.wrapD("mark corrupt", d, err)
}

// CorruptMark implements engines.CorruptLedger.
func (e *Engine) CorruptMark(ctx context.Context, d blob.Digest) (engines.CorruptMark, bool, error) {
	if e.noLedger {
		return engines.CorruptMark{}, false, nil
	}
	m := engines.CorruptMark{Digest: d}
	var marked int64
	err := e.db.QueryRowContext(ctx, `SELECT file, reason, marked FROM gc_corrupt WHERE digest = ?`, d[:]).Scan(&m.File, &m.Reason, &marked)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return engines.CorruptMark{}, false, nil
	case err != nil:
		return engines.CorruptMark{}, false, e.wrapD("corrupt mark", d, err)
	}
	m.Marked = time.Unix(0, marked)
	return m, true, nil
}

// ClearCorrupt implements engines.CorruptLedger.
func (e *Engine) ClearCorrupt(ctx context.Context, d blob.Digest, file []byte) (bool, error) {
	if e.noLedger {
		return false, nil
	}
	res, err := e.db.ExecContext(ctx, `DELETE FROM gc_corrupt WHERE digest = ? AND file = ?`, d[:], engines.NonNil(file))
	if err != nil {
		return false, e.wrapD("clear corrupt", d, err)
	}
	n, err := res.RowsAffected()
	return n > 0, e.wrapD("clear corrupt", d, err)
}

// CorruptMarks implements engines.CorruptLedger.
func (e *Engine) CorruptMarks(ctx context.Context) ([]engines.CorruptMark, error) {
	if e.noLedger {
		return nil, nil
	}
	rows, err := e.db.QueryContext(ctx, engines.CorruptMarksSQL)
	if err != nil {
		return nil, e.wrap("corrupt marks", err)
	}
	defer rows.Close()
	marks, err := engines.ScanCorruptMarks(rows)
	return marks, e.wrap("corrupt marks", err)
}
