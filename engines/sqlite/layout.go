package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// The storage layout: how a database keeps the blobs' keys and values.
// A database keeps the layout it was made with; nothing migrates one.
//
// Layout 1, "inline", is every database made before layouts were recorded
// (PRAGMA user_version 0):
//
//	blobs(digest BLOB PRIMARY KEY, size INTEGER NOT NULL, value BLOB NOT NULL) WITHOUT ROWID
//	blobs_size ON blobs(digest, size)     (sizeindex.go)
//
// A WITHOUT ROWID table is a b-tree of whole rows in key order: a row
// longer than about 1 000 bytes (4 KiB pages) keeps 489 bytes in its cell
// and the rest in overflow pages, and SQLite reads a spilled cell's whole
// payload, overflow pages included, for every comparison of a key with it,
// in interior and leaf pages alike (sqlite3BtreeIndexMoveto). So each put,
// Get, Has and delete in a store of 1–4 KiB blobs read several values to
// compare digests, and a 1 KiB blob cost a whole overflow page.
//
// Layout 2, "split", is every database this build creates
// (PRAGMA user_version 2):
//
//	blobs(digest BLOB PRIMARY KEY, size INTEGER NOT NULL, vid INTEGER NOT NULL) WITHOUT ROWID
//	blob_values(vid INTEGER PRIMARY KEY, value BLOB NOT NULL)
//	blobs_value_delete: AFTER DELETE ON blobs, delete the row's value
//
// The key table's rows are about 50 bytes, a hundred to a page and never
// spilled: it is its own size index, and Has, Size, List and SizeMany read
// it. Values sit in a rowid table, reached by vid and never compared; a
// put's vid is the largest plus one, so puts append to its last page (a
// vid freed by deleting the last value may be given again: nothing but
// its key row names a vid), and a value of up to about 4 050 bytes stays
// in its cell. A put inserts the key
// first (ON CONFLICT DO NOTHING RETURNING vid) and the value only when the
// key went in, in one transaction: a dedup writes no value row, and a put
// that fails midway rolls both back. The trigger deletes a key's value in
// the statement that deletes the key, whoever deletes it (the engine, the
// GC's arbitration in package meta, a tool by SQL).
//
// On a table of 20 000 blobs (medians of 3, layout 1 with its size index
// against layout 2), a 1 KiB put alone in its transaction appends 6.00
// WAL frames against 3.06 and costs 118 µs of CPU against 55 (16 to a
// transaction: 4.97 frames against 1.79); a 4 KiB put 5.89 against 4.49,
// 129 µs against 77 (16 to a transaction: 4.86 against 2.60); and 20 000
// blobs of 1 KiB take 94.7 MB against 28.3.
//
// The key table keeps the name blobs with other columns, so that an older
// build opening a new database fails at open ("no such column: value",
// preparing its Get) rather than seeing an empty store. A build that has
// the size index creates blobs_size on the new key table before it fails;
// the next open here drops it, as it would cost every put a b-tree insert.
// A database recording a layout newer than this build knows is refused
// before anything is written to it (ErrNewerLayout).
type layout int

const (
	layoutNone   layout = 0 // no blobs table yet: a new database
	layoutInline layout = 1
	layoutSplit  layout = 2
	// layoutLatest is the newest layout this build knows, which it gives
	// new databases.
	layoutLatest = layoutSplit
)

// ErrNewerLayout is the error of opening a database whose recorded layout
// is newer than this build knows: a newer alkblobfs made it.
var ErrNewerLayout = errors.New("storage layout newer than this build knows")

// splitSchema creates layout 2. Plain CREATE, not IF NOT EXISTS: it runs
// only where the write lock's fresh look found no blobs table, and a table
// that appeared anyway must fail the open, not half-make a layout.
const splitSchema = `
CREATE TABLE blobs (
	digest BLOB PRIMARY KEY,
	size   INTEGER NOT NULL,
	vid    INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE blob_values (
	vid   INTEGER PRIMARY KEY,
	value BLOB NOT NULL
);
CREATE TRIGGER blobs_value_delete AFTER DELETE ON blobs BEGIN
	DELETE FROM blob_values WHERE vid = old.vid;
END;
PRAGMA user_version = 2;
`

// The split layout's put: the key, with the next vid, then its value.
const (
	splitPutKey   = `INSERT INTO blobs (digest, size, vid) VALUES (?, ?, (SELECT coalesce(max(vid), 0) + 1 FROM blob_values)) ON CONFLICT (digest) DO NOTHING RETURNING vid`
	splitPutValue = `INSERT INTO blob_values (vid, value) VALUES (?, coalesce(?, x''))`
	splitGet      = `SELECT b.size, v.value, v.vid IS NOT NULL FROM blobs AS b LEFT JOIN blob_values AS v ON v.vid = b.vid WHERE b.digest = ?`
)

// layoutState is what a database's header and catalogue say of its
// layout, read in one statement (one snapshot).
type layoutState struct {
	recorded  int64 // PRAGMA user_version
	blobs     bool  // a table blobs
	values    bool  // a table blob_values
	valueCol  bool  // blobs has a column value
	sizeIndex bool  // an index blobs_size
}

func readLayout(ctx context.Context, q engines.Querier) (layoutState, error) {
	var s layoutState
	err := q.QueryRowContext(ctx, `SELECT
		(SELECT user_version FROM pragma_user_version),
		EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'blobs'),
		EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'blob_values'),
		EXISTS (SELECT 1 FROM pragma_table_info('blobs') WHERE name = 'value'),
		EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'blobs_size')`).Scan(&s.recorded, &s.blobs, &s.values, &s.valueCol, &s.sizeIndex)
	if err != nil {
		return layoutState{}, fmt.Errorf("read the storage layout: %w", err)
	}
	return s, nil
}

// layout is the layout s describes, or why it is none this build can use.
func (s layoutState) layout(path string) (layout, error) {
	switch {
	case s.recorded > int64(layoutLatest):
		return 0, fmt.Errorf("%s records storage layout %d (PRAGMA user_version), and this build knows layouts 1 to %d: %w; open it with the build that made it, or a newer one",
			path, s.recorded, layoutLatest, ErrNewerLayout)
	case s.recorded == int64(layoutSplit) && s.blobs && s.values && !s.valueCol:
		return layoutSplit, nil
	case s.recorded == int64(layoutSplit):
		return 0, fmt.Errorf("%s records storage layout 2 but lacks its tables (blobs with a vid column, blob_values): the database is damaged", path)
	case s.recorded != 0 && s.recorded != int64(layoutInline):
		return 0, fmt.Errorf("%s records storage layout %d (PRAGMA user_version), which no build has made: the database is damaged or not alkblobfs's", path, s.recorded)
	case !s.blobs:
		return layoutNone, nil
	case s.valueCol && !s.values:
		return layoutInline, nil
	default:
		return 0, fmt.Errorf("%s records no storage layout and its tables are of none this build knows (blobs with a value column and no blob_values): the database is damaged", path)
	}
}

// beforeCreate, when set (by tests), runs between the look that found no
// blobs table and the write lock under which the layout is made.
var beforeCreate func(path string)

// initLayout finds the database's layout and sets e.layout, making layout
// 2 in a database that has none. Processes creating one database at the
// same moment (a CLI beside a mount) agree on its layout: the making
// happens under the write lock (BEGIN IMMEDIATE), after a second look at
// the catalogue there, and records the layout in the same transaction.
// The first look takes no lock, so opening a database that has its
// layout never waits for a writer.
func (e *Engine) initLayout(ctx context.Context, log *slog.Logger) error {
	s, err := readLayout(ctx, e.db)
	// The first statement on a new database also opens its connection,
	// whose pragmas switch the file to WAL; while another process makes
	// that switch SQLite may answer SQLITE_BUSY at once, without its busy
	// handler (six opens of one new file at once on a loaded machine, 1 in
	// 40: TestLayoutRacingCreators). Look again for as long as the busy
	// timeout would have waited.
	for wait, deadline := 5*time.Millisecond, time.Now().Add(busyTimeout); err != nil && busy(err) && time.Now().Before(deadline); wait = min(2*wait, 200*time.Millisecond) {
		select {
		case <-ctx.Done():
			return e.wrap("open", ctx.Err())
		case <-time.After(wait):
		}
		s, err = readLayout(ctx, e.db)
	}
	if err != nil {
		return e.wrap("open", err)
	}
	l, err := s.layout(e.path)
	if err != nil {
		return e.wrap("open", err)
	}
	if !e.ro && (l == layoutNone || l == layoutSplit && s.sizeIndex) {
		if l == layoutNone && beforeCreate != nil {
			beforeCreate(e.path)
		}
		if l, err = e.makeLayout(ctx, log); err != nil {
			return e.wrap("open", err)
		}
	}
	if l == layoutNone {
		return e.wrap("open", fmt.Errorf("%s holds no blobs table and is read-only: no store to open", e.path))
	}
	e.layout = l
	return nil
}

// makeLayout looks again under the write lock and makes layout 2 if there
// is still none, or drops a size index an older build left on layout 2.
func (e *Engine) makeLayout(ctx context.Context, log *slog.Logger) (layout, error) {
	tx, err := e.db.BeginTx(ctx, nil) // BEGIN IMMEDIATE (_txlock)
	if err != nil {
		return 0, fmt.Errorf("make the storage layout: %w", err)
	}
	defer tx.Rollback()
	s, err := readLayout(ctx, tx)
	if err != nil {
		return 0, err
	}
	l, err := s.layout(e.path)
	if err != nil {
		return 0, err
	}
	switch {
	case l == layoutNone:
		if _, err := tx.ExecContext(ctx, splitSchema); err != nil {
			return 0, fmt.Errorf("make storage layout 2: %w", err)
		}
		l = layoutSplit
	case l == layoutSplit && s.sizeIndex:
		if _, err := tx.ExecContext(ctx, `DROP INDEX blobs_size`); err != nil {
			return 0, fmt.Errorf("drop the size index an older build made: %w", err)
		}
		log.Warn("sqlite: dropped the size index blobs_size, which an older build of alkblobfs made when it tried to open this database (layout 2 needs none)", "db", e.path)
	default:
		return l, nil
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("make the storage layout: %w", err)
	}
	return l, nil
}

// putIn puts d in tx, the statements of the database's layout: inserted
// is false for a dedup, which writes nothing.
func (e *Engine) putIn(ctx context.Context, tx *sql.Tx, d blob.Digest, value []byte) (bool, error) {
	if e.layout == layoutInline {
		res, err := tx.StmtContext(ctx, e.put).ExecContext(ctx, d[:], len(value), value)
		if err != nil {
			return false, err
		}
		n, err := res.RowsAffected()
		return n == 1, err
	}
	var vid int64
	switch err := tx.StmtContext(ctx, e.put).QueryRowContext(ctx, d[:], len(value)).Scan(&vid); {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil // the key is there: no value row
	case err != nil:
		return false, err
	}
	if _, err := tx.StmtContext(ctx, e.putValue).ExecContext(ctx, vid, value); err != nil {
		return false, err
	}
	return true, nil
}

// FlipValueBit flips the lowest bit of the first byte of d's stored value
// in the SQLite database db, by SQL past any engine, as disk rot would:
// what tests of the store's verification use, on either layout.
func FlipValueBit(ctx context.Context, db *sql.DB, d blob.Digest) error {
	s, err := readLayout(ctx, db)
	if err != nil {
		return err
	}
	l, err := s.layout("the database")
	if err != nil {
		return err
	}
	read, write := `SELECT value FROM blobs WHERE digest = ?`, `UPDATE blobs SET value = ? WHERE digest = ?`
	if l == layoutSplit {
		read = `SELECT v.value FROM blobs AS b JOIN blob_values AS v ON v.vid = b.vid WHERE b.digest = ?`
		write = `UPDATE blob_values SET value = ? WHERE vid = (SELECT vid FROM blobs WHERE digest = ?)`
	}
	var v []byte
	if err := db.QueryRowContext(ctx, read, d[:]).Scan(&v); err != nil {
		return fmt.Errorf("flip a bit of %s's value: %w", d, missing(err))
	}
	if len(v) == 0 {
		return fmt.Errorf("flip a bit of %s's value: the value is empty", d)
	}
	v[0] ^= 1
	if _, err := db.ExecContext(ctx, write, v, d[:]); err != nil {
		return fmt.Errorf("flip a bit of %s's value: %w", d, err)
	}
	return nil
}
