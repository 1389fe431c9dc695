package postgres

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

const putSQL = `INSERT INTO blobs (digest, size, value) VALUES ($1, $2, $3) ON CONFLICT (digest) DO NOTHING`

// Has implements engines.Engine.
func (e *Engine) Has(ctx context.Context, d blob.Digest) (bool, error) {
	var one int
	switch err := e.pool.QueryRow(ctx, `SELECT 1 FROM blobs WHERE digest = $1`, d[:]).Scan(&one); {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, blob.Wrap("has", e.name, d, err)
	}
	return true, nil
}

// Size implements engines.Engine from the size column.
func (e *Engine) Size(ctx context.Context, d blob.Digest) (int64, error) {
	var n int64
	if err := e.pool.QueryRow(ctx, `SELECT size FROM blobs WHERE digest = $1`, d[:]).Scan(&n); err != nil {
		return 0, blob.Wrap("size", e.name, d, Missing(err))
	}
	return n, nil
}

// Open implements engines.Engine: the value is read whole into the cursor.
func (e *Engine) Open(ctx context.Context, d blob.Digest) (engines.Cursor, error) {
	var n int64
	var v []byte
	if err := e.pool.QueryRow(ctx, `SELECT size, value FROM blobs WHERE digest = $1`, d[:]).Scan(&n, &v); err != nil {
		return nil, blob.Wrap("open", e.name, d, Missing(err))
	}
	if n != int64(len(v)) {
		return nil, blob.Wrap("open", e.name, d, fmt.Errorf("row is damaged: size column says %d bytes, value has %d", n, len(v)))
	}
	return engines.BytesCursor(v), nil
}

// Missing maps pgx.ErrNoRows to blob.ErrMissing.
func Missing(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return blob.ErrMissing
	}
	return err
}

// Put implements engines.KV.
func (e *Engine) Put(ctx context.Context, d blob.Digest, value []byte) (bool, error) {
	tag, err := e.pool.Exec(ctx, putSQL, d[:], len(value), notNil(value))
	if err != nil {
		return false, e.wrapD("put", d, err)
	}
	return tag.RowsAffected() == 1, nil
}

// notNil: a nil slice binds as NULL; the empty blob is an empty bytea.
func notNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// PutRows implements meta.Putter: the insert (or the no-op insert of a
// dedup) and rows commit together or not at all, in a batch shared with
// the puts of other callers (putGroup): its one statement carries the
// pin row and an intent that replaces none; a batch with other rows
// writes them with meta in its transaction (meta.NSRows.WriteTx), with
// the group's context (the caller's without its cancellation).
func (e *Engine) PutRows(ctx context.Context, d blob.Digest, value []byte, rows meta.Rows) (bool, error) {
	j := &putJob{d: d, value: notNil(value), rows: rows, ctx: context.WithoutCancel(ctx)}
	e.puts.do(j)
	if j.err != nil {
		err := j.err
		// The group's error names the put and the engine, for all its
		// puts; this one adds the digest, and says the rest once.
		if be, ok := err.(*blob.Error); ok && be.Op == "put" && be.Engine == e.name && be.Digest.IsZero() {
			err = be.Err
		}
		return false, e.wrapD("put", d, err)
	}
	return j.inserted, nil
}

// Delete implements engines.Engine.
func (e *Engine) Delete(ctx context.Context, d blob.Digest) error {
	tag, err := e.pool.Exec(ctx, `DELETE FROM blobs WHERE digest = $1`, d[:])
	if err != nil {
		return blob.Wrap("delete", e.name, d, err)
	}
	if tag.RowsAffected() == 0 {
		return blob.Wrap("delete", e.name, d, blob.ErrMissing)
	}
	return nil
}

// List implements engines.Engine with keyset pagination. Each page is read
// whole and its rows closed before the first yield, so the caller's loop
// body runs with no connection held.
func (e *Engine) List(ctx context.Context, after blob.Digest) iter.Seq2[engines.Entry, error] {
	return ListPages(ctx, e.name, after, func(ctx context.Context, after blob.Digest) (pgx.Rows, error) {
		return e.pool.Query(ctx, `SELECT digest, size FROM blobs WHERE digest > $1 ORDER BY digest LIMIT $2`, Key(after), listPage)
	})
}

// ListPages streams (digest, size) rows page by page: query returns up to
// listPage rows after a cursor, in ascending digest order. The pglo engine
// lists its companion table with it.
func ListPages(ctx context.Context, name string, after blob.Digest, query func(ctx context.Context, after blob.Digest) (pgx.Rows, error)) iter.Seq2[engines.Entry, error] {
	return func(yield func(engines.Entry, error) bool) {
		cur := after
		page := make([]engines.Entry, 0, listPage)
		for {
			var err error
			if page, err = readPage(ctx, cur, page[:0], query); err != nil {
				yield(engines.Entry{}, blob.Wrap("list", name, cur, err))
				return
			}
			for _, en := range page {
				if !yield(en, nil) {
					return
				}
			}
			if len(page) < listPage {
				return
			}
			cur = page[len(page)-1].Digest
		}
	}
}

func readPage(ctx context.Context, after blob.Digest, page []engines.Entry, query func(ctx context.Context, after blob.Digest) (pgx.Rows, error)) ([]engines.Entry, error) {
	rows, err := query(ctx, after)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var en engines.Entry
		var raw []byte
		if err := rows.Scan(&raw, &en.Size); err != nil {
			return nil, err
		}
		var err error
		if en.Digest, err = blob.FromBytes(raw); err != nil {
			return nil, err
		}
		page = append(page, en)
	}
	return page, rows.Err()
}

// blobsDeleteSQL deletes the blobs of the digests $1 and returns each
// deleted one's digest and size. Package meta runs it
// (meta.PostgresConfig.BlobDelete), with the deleted blobs' window rows
// in the same statement: in a delete's arbitration, and for DeleteMany.
const blobsDeleteSQL = `DELETE FROM blobs WHERE digest = ANY($1::bytea[]) RETURNING digest, size`

// DeleteMany implements engines.BatchDeleter: one statement, in a
// transaction of its own, that deletes the blobs and, with them, their
// rows in the delete window (the window is package meta's, and so is the
// statement's other half: meta.Postgres.DeleteBlobs, meta.PGWindowGone).
func (e *Engine) DeleteMany(ctx context.Context, ds []blob.Digest) ([]int64, error) {
	return e.meta.DeleteBlobs(ctx, ds)
}

// SizeMany implements engines.BatchSizer: one query with digest = ANY($1).
func (e *Engine) SizeMany(ctx context.Context, ds []blob.Digest) ([]int64, error) {
	sizes := make([]int64, len(ds))
	idx := make(map[blob.Digest][]int, len(ds))
	keys := make([][]byte, 0, len(ds))
	for i, d := range ds {
		sizes[i] = -1
		if _, seen := idx[d]; !seen {
			keys = append(keys, d[:])
		}
		idx[d] = append(idx[d], i)
	}
	if len(keys) == 0 {
		return sizes, nil
	}
	rows, err := e.pool.Query(ctx, `SELECT digest, size FROM blobs WHERE digest = ANY($1)`, keys)
	if err != nil {
		return nil, blob.Wrap("size", e.name, blob.Digest{}, err)
	}
	defer rows.Close()
	err = engines.ScanSizes(rows, func(d blob.Digest, n int64) {
		for _, i := range idx[d] {
			sizes[i] = n
		}
	})
	if err != nil {
		return nil, blob.Wrap("size", e.name, blob.Digest{}, err)
	}
	return sizes, nil
}

// Full marks PostgreSQL's disk_full (SQLSTATE 53100) as blob.ErrNoSpace,
// so that a full server disk reaches users as ENOSPC.
func Full(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "53100" && !errors.Is(err, blob.ErrNoSpace) {
		return fmt.Errorf("%w: %w", blob.ErrNoSpace, err)
	}
	return err
}
