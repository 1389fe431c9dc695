package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"strings"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Has implements engines.Engine.
func (e *Engine) Has(ctx context.Context, d blob.Digest) (bool, error) {
	if err := e.batch.Visible(ctx); err != nil {
		return false, blob.Wrap("has", e.name, d, err)
	}
	var one int
	switch err := e.has.QueryRowContext(ctx, d[:]).Scan(&one); {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, blob.Wrap("has", e.name, d, err)
	}
	return true, nil
}

// Size implements engines.Engine from the size column.
func (e *Engine) Size(ctx context.Context, d blob.Digest) (int64, error) {
	if err := e.batch.Visible(ctx); err != nil {
		return 0, blob.Wrap("size", e.name, d, err)
	}
	var n int64
	if err := e.size.QueryRowContext(ctx, d[:]).Scan(&n); err != nil {
		return 0, blob.Wrap("size", e.name, d, missing(err))
	}
	return n, nil
}

// Open implements engines.Engine: the value is read whole into the cursor.
func (e *Engine) Open(ctx context.Context, d blob.Digest) (engines.Cursor, error) {
	if err := e.batch.Visible(ctx); err != nil {
		return nil, blob.Wrap("open", e.name, d, err)
	}
	var n int64
	var v []byte
	found := true // layout 2 says whether the key's value row exists
	dest := []any{&n, &v}
	if e.layout == layoutSplit {
		dest = append(dest, &found)
	}
	if err := e.get.QueryRowContext(ctx, d[:]).Scan(dest...); err != nil {
		return nil, blob.Wrap("open", e.name, d, missing(err))
	}
	if !found {
		return nil, blob.Wrap("open", e.name, d, fmt.Errorf("row is damaged: the key's value row (blob_values) is missing"))
	}
	if n != int64(len(v)) {
		return nil, blob.Wrap("open", e.name, d, fmt.Errorf("row is damaged: size column says %d bytes, value has %d", n, len(v)))
	}
	return engines.BytesCursor(v), nil
}

func missing(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return blob.ErrMissing
	}
	return err
}

// Put implements engines.KV. On layout 2 it is PutRows with no rows: its
// two statements commit together.
func (e *Engine) Put(ctx context.Context, d blob.Digest, value []byte) (bool, error) {
	if e.layout == layoutSplit {
		return e.PutRows(ctx, d, value, meta.Rows{})
	}
	res, err := e.put.ExecContext(ctx, d[:], len(value), value)
	if err != nil {
		return false, e.wrapD("put", d, err)
	}
	return inserted(res, e.name, d)
}

// PutRows implements meta.Putter: in one write transaction of the group
// commit (meta.Batcher), meta writes rows (the pin row, then the
// namespace part) and the entry is inserted (or found: a dedup); all of
// it commits, or none.
//
// A put the database's close journal takes (meta.Journal: a namespace
// part, no pin row, a namespace without a quota) returns once its record
// is written, before its transaction; inserted then says whether the
// digest was stored when the put was taken.
func (e *Engine) PutRows(ctx context.Context, d blob.Digest, value []byte, rows meta.Rows) (bool, error) {
	if j := e.meta.Journal(); j != nil {
		stored := func() bool {
			var one int
			return e.has.QueryRowContext(ctx, d[:]).Scan(&one) == nil
		}
		if taken, had, err := j.Put(ctx, d, value, rows, stored); taken {
			if err != nil {
				return false, e.wrapD("put", d, err)
			}
			return !had, nil
		}
	}
	var ok bool
	put := func(ctx context.Context, tx *sql.Tx) error {
		if err := e.meta.WriteRows(ctx, tx, rows); err != nil {
			return err
		}
		var err error
		ok, err = e.putIn(ctx, tx, d, value)
		return err
	}
	if err := e.write(ctx, put); err != nil {
		return false, e.wrapD("put", d, err)
	}
	return ok, nil
}

// PutMany puts the blobs ds, values[i] the value of ds[i], in one write
// transaction with no rows of the shared state, and returns how many it
// inserted (the others were there): the bulk load of a store that no
// pin or namespace uses yet (scripts/mkpool), many puts to a commit
// instead of one each. All of them commit, or none. One call holds the
// database's writer for its whole slice, so a caller bounds it (mkpool
// puts 100 000 at a time, in digest order, so that the inserts are
// near-appends to the key B-tree).
func (e *Engine) PutMany(ctx context.Context, ds []blob.Digest, values [][]byte) (int, error) {
	if len(ds) != len(values) {
		return 0, e.wrap("put", fmt.Errorf("%d digests for %d values", len(ds), len(values)))
	}
	var n int
	err := e.inTx(ctx, "put", func(ctx context.Context, tx *sql.Tx) error {
		n = 0 // a job may run twice
		for i, d := range ds {
			ok, err := e.putIn(ctx, tx, d, values[i])
			if err != nil {
				return e.wrapD("put", d, err)
			}
			if ok {
				n++
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

func inserted(res sql.Result, name string, d blob.Digest) (bool, error) {
	n, err := res.RowsAffected()
	if err != nil {
		return false, blob.Wrap("put", name, d, err)
	}
	return n == 1, nil
}

// Delete implements engines.Engine.
func (e *Engine) Delete(ctx context.Context, d blob.Digest) error {
	res, err := e.del.ExecContext(ctx, d[:])
	if err != nil {
		return blob.Wrap("delete", e.name, d, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return blob.Wrap("delete", e.name, d, err)
	}
	if n == 0 {
		return blob.Wrap("delete", e.name, d, blob.ErrMissing)
	}
	return nil
}

// List implements engines.Engine with keyset pagination. Each page is read
// whole and its rows closed before the first yield, so the caller's loop
// body runs with no connection held: it may write to this database.
func (e *Engine) List(ctx context.Context, after blob.Digest) iter.Seq2[engines.Entry, error] {
	return func(yield func(engines.Entry, error) bool) {
		if err := e.batch.Visible(ctx); err != nil {
			yield(engines.Entry{}, blob.Wrap("list", e.name, after, err))
			return
		}
		cur := after
		page := make([]engines.Entry, 0, listPage)
		for {
			var err error
			if page, err = e.page(ctx, cur, page[:0]); err != nil {
				yield(engines.Entry{}, blob.Wrap("list", e.name, cur, err))
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

func (e *Engine) page(ctx context.Context, after blob.Digest, page []engines.Entry) ([]engines.Entry, error) {
	rows, err := e.list.QueryContext(ctx, cursorArg(after), listPage)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var en engines.Entry
		var raw sql.RawBytes
		if err := rows.Scan(&raw, &en.Size); err != nil {
			return nil, err
		}
		if en.Digest, err = blob.FromBytes(raw); err != nil {
			return nil, err
		}
		page = append(page, en)
	}
	return page, rows.Err()
}

// delRetSQL deletes one blob's rows and returns its size: on layout 2 the
// trigger blobs_value_delete deletes the value in the same statement.
// Package meta runs it (meta.SQLiteConfig.BlobDelete): in a delete's
// arbitration, and for DeleteMany.
const delRetSQL = `DELETE FROM blobs WHERE digest = ? RETURNING size`

// DeleteMany implements engines.BatchDeleter: one write transaction, one
// DELETE … RETURNING size per digest (meta.SQLite.DeleteBlobs, the loop
// the GC's arbitration runs).
func (e *Engine) DeleteMany(ctx context.Context, ds []blob.Digest) ([]int64, error) {
	return e.meta.DeleteBlobs(ctx, ds)
}

// sizeManyBatch bounds the IN list of one SizeMany query.
const sizeManyBatch = 500

// SizeMany implements engines.BatchSizer with IN-list queries on the size
// index (sizeindex.go).
func (e *Engine) SizeMany(ctx context.Context, ds []blob.Digest) ([]int64, error) {
	if err := e.batch.Visible(ctx); err != nil {
		return nil, e.wrap("size", err)
	}
	sizes := make([]int64, len(ds))
	idx := make(map[blob.Digest][]int, len(ds))
	for i, d := range ds {
		sizes[i] = -1
		idx[d] = append(idx[d], i)
	}
	for lo := 0; lo < len(ds); lo += sizeManyBatch {
		batch := ds[lo:min(len(ds), lo+sizeManyBatch)]
		args := make([]any, len(batch))
		for i, d := range batch {
			args[i] = d[:]
		}
		rows, err := e.db.QueryContext(ctx, e.sizeManySQL(len(batch)), args...)
		if err != nil {
			return nil, blob.Wrap("size", e.name, blob.Digest{}, err)
		}
		err = engines.ScanSizes(rows, func(d blob.Digest, n int64) {
			for _, i := range idx[d] {
				sizes[i] = n
			}
		})
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, blob.Wrap("size", e.name, blob.Digest{}, err)
		}
	}
	return sizes, nil
}

// sizeManySQL is SizeMany's query for n digests.
func (e *Engine) sizeManySQL(n int) string {
	return "SELECT digest, size FROM " + e.sized + " WHERE digest IN (?" + strings.Repeat(", ?", n-1) + ")"
}
