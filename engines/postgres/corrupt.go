package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

var _ engines.CorruptLedger = (*Engine)(nil)

// The corrupt ledger (engines.CorruptLedger), beside gc_pins: every host
// of a fleet reads it. marked is the server's clock (engines.PGNow).
const corruptSchema = `CREATE TABLE IF NOT EXISTS gc_corrupt (
	digest BYTEA PRIMARY KEY,
	file   BYTEA NOT NULL,
	reason TEXT NOT NULL,
	marked BIGINT NOT NULL
)`

// MarkCorrupt implements engines.CorruptLedger.
func (e *Engine) MarkCorrupt(ctx context.Context, d blob.Digest, file []byte, reason string) error {
	_, err := e.pool.Exec(ctx, `INSERT INTO gc_corrupt (digest, file, reason, marked) VALUES ($1, $2, $3, `+engines.PGNow+`)
		ON CONFLICT (digest) DO UPDATE SET file = excluded.file, reason = excluded.reason, marked = excluded.marked`,
		d[:], engines.NonNil(file), reason)
	return e.wrapD("mark corrupt", d, err)
}

// CorruptMark implements engines.CorruptLedger.
func (e *Engine) CorruptMark(ctx context.Context, d blob.Digest) (engines.CorruptMark, bool, error) {
	m := engines.CorruptMark{Digest: d}
	var marked int64
	err := e.pool.QueryRow(ctx, `SELECT file, reason, marked FROM gc_corrupt WHERE digest = $1`, d[:]).Scan(&m.File, &m.Reason, &marked)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return engines.CorruptMark{}, false, nil
	case err != nil:
		return engines.CorruptMark{}, false, e.wrapD("corrupt mark", d, err)
	}
	m.Marked = time.Unix(0, marked)
	return m, true, nil
}

// ClearCorrupt implements engines.CorruptLedger.
func (e *Engine) ClearCorrupt(ctx context.Context, d blob.Digest, file []byte) (bool, error) {
	tag, err := e.pool.Exec(ctx, `DELETE FROM gc_corrupt WHERE digest = $1 AND file = $2`, d[:], engines.NonNil(file))
	if err != nil {
		return false, e.wrapD("clear corrupt", d, err)
	}
	return tag.RowsAffected() > 0, nil
}

// CorruptMarks implements engines.CorruptLedger.
func (e *Engine) CorruptMarks(ctx context.Context) ([]engines.CorruptMark, error) {
	rows, err := e.pool.Query(ctx, engines.CorruptMarksSQL)
	if err != nil {
		return nil, e.wrap("corrupt marks", err)
	}
	defer rows.Close()
	marks, err := engines.ScanCorruptMarks(rows)
	return marks, e.wrap("corrupt marks", err)
}
