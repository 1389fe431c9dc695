package postgres

import (
	"context"
	"errors"
	"fmt"
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
		d[:], nonNil(file), reason)
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
	tag, err := e.pool.Exec(ctx, `DELETE FROM gc_corrupt WHERE digest = $1 AND file = $2`, d[:], nonNil(file))
	if err != nil {
		return false, e.wrapD("clear corrupt", d, err)
	}
	return tag.RowsAffected() > 0, nil
}

// CorruptMarks implements engines.CorruptLedger.
func (e *Engine) CorruptMarks(ctx context.Context) ([]engines.CorruptMark, error) {
	rows, err := e.pool.Query(ctx, `SELECT digest, file, reason, marked FROM gc_corrupt ORDER BY digest`)
	if err != nil {
		return nil, e.wrap("corrupt marks", err)
	}
	defer rows.Close()
	var out []engines.CorruptMark
	for rows.Next() {
		var m engines.CorruptMark
		var key []byte
		var marked int64
		if err := rows.Scan(&key, &m.File, &m.Reason, &marked); err != nil {
			return nil, e.wrap("corrupt marks", err)
		}
		if len(key) != len(m.Digest) {
			return nil, e.wrap("corrupt marks", fmt.Errorf("a digest of %d bytes in gc_corrupt", len(key)))
		}
		copy(m.Digest[:], key)
		m.Marked = time.Unix(0, marked)
		out = append(out, m)
	}
	return out, e.wrap("corrupt marks", rows.Err())
}

// nonNil binds an empty identity as the empty bytea, not NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
