package sqlite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	sqlitedrv "modernc.org/sqlite"
)

// The size index: blobs_size(digest, size), a covering index of the blobs
// table's keys and sizes, on databases of layout 1 (layout.go). Layout 2's
// key table holds only keys, sizes and value ids: it is its own size
// index, and gets none.
//
// In layout 1, blobs is WITHOUT ROWID with the value in the row, so a leaf cell keeps
// the first 489 bytes of a 4 KiB value (SQLite's minimum local payload)
// and a 4 KiB leaf page holds about seven such rows: a store of 250 000
// such blobs and 100 000 tiny ones has 34 700 leaf pages (136 MB), and
// every size lookup of a cold listing (SizeMany, once per page of a
// namespace's entries) reads one of them at random. The index holds only
// digest and size, about 100 rows a page (3 400 leaf pages, 14 MB, for the
// same store), so Size, Has, SizeMany and List read it instead (INDEXED
// BY: the planner would take the primary key, which it knows is unique).
// It costs a put one more b-tree insert: WAL frames per 4 KiB put alone
// in its transaction go from 4.65 to 5.90 on a table of 20 000, from 5.91
// to 7.84 on the store above (4.09 to 5.47 sixteen to a transaction).
// Layout 2, which keeps the values apart, saves them back on new
// databases; moving an old one to it would copy every value, and is not
// done.
//
// An index is a schema object: processes of older builds keep it up to
// date without knowing of it, and a database that has it still opens
// there.
const sizeIndexSchema = `CREATE INDEX IF NOT EXISTS blobs_size ON blobs (digest, size)`

// blobsSized is what the size lookups read: the index where it exists.
const (
	blobsSized   = `blobs INDEXED BY blobs_size`
	blobsUnsized = `blobs`
)

// initSizeIndex creates the size index if it is missing and chooses the
// table expression the size lookups read (e.sized).
//
// On a database of an older build the table is full, and the build reads
// its leaf level once (the keys and sizes, never the overflow pages of the
// values): 6 to 9 s cold for the store above, logged before and after,
// with the write lock held throughout. Another
// process opening the database meanwhile waits for the lock (the busy
// timeout); one that gives up first, or a database on read-only media,
// opens without the index and reads the table, as before: correct, slower
// to list. A crash midway rolls the build back, and the next open starts
// it again.
func (e *Engine) initSizeIndex(ctx context.Context, log *slog.Logger) error {
	have, err := e.hasSizeIndex(ctx)
	if err != nil {
		return err
	}
	if !have && !e.ro {
		have, err = e.buildSizeIndex(ctx, log)
		if err != nil {
			return err
		}
	}
	e.sized = blobsUnsized
	if have {
		e.sized = blobsSized
	}
	return nil
}

func (e *Engine) hasSizeIndex(ctx context.Context) (bool, error) {
	var n int
	if err := e.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'blobs_size'`).Scan(&n); err != nil {
		return false, e.wrap("open", err)
	}
	return n == 1, nil
}

// buildSizeIndex runs sizeIndexSchema; false, nil when another process
// held the write lock past the busy timeout.
func (e *Engine) buildSizeIndex(ctx context.Context, log *slog.Logger) (bool, error) {
	var nonEmpty int
	if err := e.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM blobs)`).Scan(&nonEmpty); err != nil {
		return false, e.wrap("open", err)
	}
	start := time.Now()
	if nonEmpty == 1 {
		log.Info("sqlite: building the size index of the blobs table, once (a cold listing reads sizes from it); the database is locked until it is done",
			"db", e.path)
	}
	if _, err := e.db.ExecContext(ctx, sizeIndexSchema); err != nil {
		if busy(err) {
			log.Warn("sqlite: another process holds the database's write lock; opened without the size index (listings read the blobs table), the next open builds it",
				"db", e.path, "waited", time.Since(start).Round(time.Millisecond))
			return e.hasSizeIndex(ctx)
		}
		return false, e.wrap("open", fmt.Errorf("create the size index: %w", err))
	}
	if nonEmpty == 1 {
		log.Info("sqlite: built the size index", "db", e.path, "took", time.Since(start).Round(time.Millisecond))
	}
	return true, nil
}

// busy reports whether err is SQLITE_BUSY (or SQLITE_LOCKED): a lock
// another connection held past the busy timeout.
func busy(err error) bool {
	var se *sqlitedrv.Error
	return errors.As(err, &se) && (se.Code()&0xff == 5 || se.Code()&0xff == 6)
}
