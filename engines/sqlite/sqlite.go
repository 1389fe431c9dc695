package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"time"

	sqlitedrv "modernc.org/sqlite" // also registers the "sqlite" driver

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Engine is a kv engine over one SQLite database file.
type Engine struct {
	name string
	path string // absolute path of the database file
	db   *sql.DB
	ro   bool // opened read-only (readOnly)
	// batch commits PutRows and the registry's links in shared
	// transactions; nil when read-only.
	batch *meta.Batcher
	// syncs shares Sync's runs; wal is what they sync (sync.go).
	syncs syncGroup
	wal   walSync
	ckpt  *checkpointer // background checkpoints (checkpoint.go); nil read-only

	has, size, get, put, del, list *sql.Stmt
	putValue                       *sql.Stmt // layout 2's second put statement
	// meta is the pool's shared GC state in this database: pin rows,
	// arbitration, the sweep lease, the delete window, the corrupt ledger
	// and the row clock (package meta owns their tables).
	meta *meta.SQLite
	// layout is the database's storage layout (layout.go), which picks
	// the statements of puts and reads.
	layout layout
	// sized is the table expression Has, Size, List and SizeMany read:
	// on layout 1 the size index where the database has it
	// (sizeindex.go); on layout 2 the key table.
	sized string
}

var (
	_ engines.KV           = (*Engine)(nil)
	_ engines.ReadOnly     = (*Engine)(nil)
	_ engines.SQL          = (*Engine)(nil)
	_ meta.Putter          = (*Engine)(nil)
	_ engines.DeleteSafe   = (*Engine)(nil)
	_ engines.BatchDeleter = (*Engine)(nil)
	_ engines.BatchSizer   = (*Engine)(nil)
	_ engines.Locator      = (*Engine)(nil)
	_ meta.Holder          = (*Engine)(nil)
	_ meta.Batching        = (*Engine)(nil)
	_ engines.Syncer       = (*Engine)(nil)
	_ engines.RowClock     = (*Engine)(nil)
)

// listPage is how many rows one List query reads.
const listPage = 1000

// Open opens (creating if needed) the database at path. The directory must
// exist.
func Open(ctx context.Context, path string) (*Engine, error) { return OpenLog(ctx, path, nil) }

// OpenLog is Open that logs to log (nil: nowhere) what opening does at
// length: building the size index of an older database (sizeindex.go).
func OpenLog(ctx context.Context, path string, log *slog.Logger) (*Engine, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Engine{name: "sqlite:" + path}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, e.wrap("open", err)
	}
	// A URI filename, so that the path is escaped ('?', '#', '%' are legal
	// in file names) and the parameters reach the driver.
	dsn := "file:" + (&url.URL{Path: abs}).EscapedPath() + "?" +
		fmt.Sprintf("_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate", busyTimeout.Milliseconds())
	if ro, err := readOnly(abs); err != nil {
		return nil, e.wrap("open", err)
	} else if ro {
		// Read-only media. Without a WAL or shared-memory file beside it
		// nothing is writing the database: SQLite may read it as
		// immutable, without the locks it cannot create. With them (a
		// read-only view of a live store), it reads read-only through
		// them, with the locking a writer elsewhere needs.
		dsn = "file:" + (&url.URL{Path: abs}).EscapedPath() + fmt.Sprintf("?mode=ro&_pragma=busy_timeout(%d)", busyTimeout.Milliseconds())
		if !exists(abs+"-shm") && emptyOrAbsent(abs+"-wal") {
			dsn += "&immutable=1"
		}
		e.ro = true
	} else if err := private(abs); err != nil {
		// Private: the database and its WAL and shared-memory files
		// (SQLite gives them the database's mode) are 0600 whatever
		// existed before.
		return nil, e.wrap("open", err)
	}
	if !e.ro {
		// checkpoint.go: checkpoints run in the background; this is the
		// writers' backstop.
		dsn += fmt.Sprintf("&_pragma=wal_autocheckpoint(%d)", autoCheckpoint)
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, e.wrap("open", err)
	}
	// Each connection is a reader in WAL mode; writers queue on the write
	// lock (busy_timeout), so more connections than CPUs buys nothing.
	conns := max(4, runtime.GOMAXPROCS(0))
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	e.db, e.path = db, abs
	if err := e.init(ctx, log); err != nil {
		db.Close()
		return nil, err
	}
	if !e.ro {
		// Before the state opens: its writes go through the Batcher.
		e.batch = meta.NewBatcher(db)
	}
	fail := func(err error) (*Engine, error) {
		if e.batch != nil {
			e.batch.Close()
		}
		if e.meta != nil {
			e.meta.Close()
		}
		e.closeStmts()
		db.Close()
		return nil, err
	}
	e.meta, err = meta.OpenSQLite(ctx, meta.SQLiteConfig{Name: e.name, Path: abs, DB: db, Batch: e.batch,
		ReadOnly: e.ro, Boot: meta.HostBoot, Wrap: e.wrapD, BlobDelete: delRetSQL, BlobPut: e.putIn, Log: log})
	if err != nil {
		return fail(err)
	}
	if !e.ro {
		if err := e.wal.open(ctx, dsn, abs+"-wal"); err != nil {
			return fail(e.wrap("open", err))
		}
		if e.ckpt, err = startCheckpointer(dsn); err != nil {
			e.wal.close()
			return fail(e.wrap("open", err))
		}
	}
	return e, nil
}

// busyTimeout is how long a statement waits for another connection's lock
// (SQLite's busy_timeout) before it fails with SQLITE_BUSY.
const busyTimeout = 10 * time.Second

func (e *Engine) init(ctx context.Context, log *slog.Logger) error {
	// The layout first: a database this build must refuse gets nothing
	// written to it.
	if err := e.initLayout(ctx, log); err != nil {
		return err
	}
	// Layout 1: ON CONFLICT (digest) DO NOTHING is INSERT OR IGNORE
	// narrowed to the key: OR IGNORE would also swallow constraint
	// failures. A nil value binds as NULL; coalesce stores it as the empty
	// blob. Layout 2: layout.go.
	get, put, putValue := `SELECT size, value FROM blobs WHERE digest = ?`,
		`INSERT INTO blobs (digest, size, value) VALUES (?, ?, coalesce(?, x'')) ON CONFLICT (digest) DO NOTHING`, ""
	if e.layout == layoutSplit {
		get, put, putValue = splitGet, splitPutKey, splitPutValue
		e.sized = blobsUnsized
	} else if err := e.initSizeIndex(ctx, log); err != nil {
		return err
	}
	for _, s := range []struct {
		stmt **sql.Stmt
		sql  string // "": none in this layout
	}{
		{&e.has, e.hasSQL()},
		{&e.size, e.sizeSQL()},
		{&e.get, get},
		{&e.put, put},
		{&e.putValue, putValue},
		{&e.del, `DELETE FROM blobs WHERE digest = ?`},
		{&e.list, e.listSQL()},
	} {
		if s.sql == "" {
			continue
		}
		st, err := e.db.PrepareContext(ctx, s.sql)
		if err != nil {
			return e.wrap("open", fmt.Errorf("prepare %q: %w", s.sql, err))
		}
		*s.stmt = st
	}
	return nil
}

// The size lookups' statements read e.sized (sizeindex.go).
func (e *Engine) hasSQL() string  { return `SELECT 1 FROM ` + e.sized + ` WHERE digest = ?` }
func (e *Engine) sizeSQL() string { return `SELECT size FROM ` + e.sized + ` WHERE digest = ?` }
func (e *Engine) listSQL() string {
	return `SELECT digest, size FROM ` + e.sized + ` WHERE digest > coalesce(?, x'') ORDER BY digest LIMIT ?`
}

// Name implements engines.Engine: "sqlite:" and the path given to Open.
func (e *Engine) Name() string { return e.name }

// DB implements engines.SQL.
func (e *Engine) DB() *sql.DB { return e.db }

// Dialect implements engines.SQL.
func (e *Engine) Dialect() string { return "sqlite" }

// CursorsSurviveDelete implements engines.DeleteSafe: cursors hold a copy.
func (e *Engine) CursorsSurviveDelete() bool { return true }

// Batcher implements meta.Batching; nil on a read-only database.
func (e *Engine) Batcher() *meta.Batcher { return e.batch }

// Meta implements meta.Holder: every part of the shared state.
func (e *Engine) Meta() meta.State { return e.meta.Meta() }

// RowNow implements engines.RowClock: the state's row clock, which the
// namespace registry times its intents with.
func (e *Engine) RowNow() int64 { return e.meta.RowNow() }

// Instance implements engines.Locator for messages: the database file.
func (e *Engine) Instance() string { return e.path }

// PoolSize implements engines.Locator.
func (e *Engine) PoolSize() int { return e.db.Stats().MaxOpenConnections }

// inTx runs fn in a write transaction (write) and commits it, rolling
// back on any error. fn's error comes back as it is; a failed BEGIN or
// COMMIT is wrapped with op. fn is a Batcher job: it must use the context
// it is given, which no caller can cancel midway (see meta.Batcher),
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

// write runs fn in a write transaction, eager (meta.Write: through the
// Batcher when the database is writable).
func (e *Engine) write(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return meta.Write(ctx, e.batch, e.db, false, fn)
}

// Close commits what is batched, and closes the statements and the pool.
// It does not sync: the store's Close does (and SQLite checkpoints, and
// syncs, when the last connection to the database closes).
func (e *Engine) Close() error {
	if e.batch != nil {
		if j := e.meta.Journal(); j != nil {
			j.Close(context.Background())
		}
		e.batch.Close()
	}
	e.syncs.close()
	errs := []error{e.ckpt.close(), e.wal.close(), e.meta.Close()}
	errs = append(errs, e.closeStmts()...)
	errs = append(errs, e.db.Close())
	return e.wrap("close", errors.Join(errs...))
}

func (e *Engine) closeStmts() []error {
	var errs []error
	for _, st := range []*sql.Stmt{e.has, e.size, e.get, e.put, e.putValue, e.del, e.list} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errs
}

// wrap names the engine and operation on err, and marks a full disk as
// blob.ErrNoSpace (ENOSPC at the mount), for every call that fails here.
func (e *Engine) wrap(op string, err error) error { return e.wrapD(op, blob.Digest{}, err) }

// wrapD is wrap for an operation on digest d.
func (e *Engine) wrapD(op string, d blob.Digest, err error) error {
	return blob.Wrap(op, e.name, d, full(err))
}

// full marks SQLite's "database or disk is full" (SQLITE_FULL) as
// blob.ErrNoSpace, so that a full disk reaches users as ENOSPC.
func full(err error) error {
	var se *sqlitedrv.Error
	if errors.As(err, &se) && se.Code()&0xff == sqliteFull && !errors.Is(err, blob.ErrNoSpace) {
		return fmt.Errorf("%w: %w", blob.ErrNoSpace, err)
	}
	return err
}

// sqliteFull is SQLITE_FULL, the primary result code of a full database or
// disk.
const sqliteFull = 13

// cursorArg is a listing cursor as the bind argument of
// "digest > coalesce(?, <empty blob>)". The zero digest binds as NULL, hence
// the empty blob, which sorts below every 32-byte key: the zero cursor lists
// from the start, the zero digest included, as engines.Engine.List requires.
func cursorArg(d blob.Digest) any {
	if d.IsZero() {
		return nil
	}
	return d[:]
}

// private creates path if needed and makes it and its -wal and -shm files
// readable by their owner only.
// readOnly reports whether the database at path must be opened read-only:
// it exists and its directory cannot be written. A database whose WAL
// still holds changes cannot be read that way (the WAL would be ignored):
// that is an error saying what to do.
func readOnly(path string) (bool, error) {
	if engines.Writable(filepath.Dir(path)) {
		return false, nil
	}
	if _, err := os.Stat(path); err != nil {
		return false, err
	}
	if fi, err := os.Stat(path + "-wal"); err == nil && fi.Size() > 0 && !exists(path+"-shm") {
		return false, fmt.Errorf("%s is on a read-only filesystem (or in a directory this user cannot write) and its write-ahead log %s still holds changes without the shared-memory file that indexes them: open the store read-write once so that SQLite merges them", path, path+"-wal")
	}
	return true, nil
}

// ReadOnly implements engines.ReadOnly.
func (e *Engine) ReadOnly() bool { return e.ro }

func emptyOrAbsent(path string) bool {
	fi, err := os.Stat(path)
	return err != nil || fi.Size() == 0
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func private(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm", path + ".gc-lease"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
