package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// SQLite is the shared state in a SQLite database (the sqlite kv engine's
// file): pins, arbitration and the sweep lease (Host, SerialHost), the
// delete window, the corrupt ledger and the row clock (sqlite_clock.go).
//
// Its arbitration lock is the database's write lock: every transaction on
// the database begins IMMEDIATE (the engine opens it with
// _txlock=immediate), so Arbitrate's transaction excludes every writer of
// every process for its whole length — pin rows, links, puts alike — and
// PinRows needs no lock of its own. Expiries are the row clock plus the
// TTL, read inside the write transaction, after the lock is held: a row
// that waited for an arbitration counts its TTL from when it commits, and
// an arbitration judges rows at the moment it excludes every writer.
type SQLite struct {
	name  string
	path  string // the database file; the lease file is beside it
	db    *sql.DB
	batch *Batcher // nil: read-only
	wrapD Wrap
	// noLedger: read-only, and the database predates gc_corrupt.
	noLedger bool
	clock    rowClock

	wStage, wDue, wRemove, wLen, pinUp, pinDel *sql.Stmt
	// blobDel is SQLiteConfig.BlobDelete, prepared.
	blobDel *sql.Stmt
	// journal is the close journal (journal.go); nil without one.
	journal *Journal
}

var (
	_ SerialHost = (*SQLite)(nil)
	_ Window     = (*SQLite)(nil)
	_ Ledger     = (*SQLite)(nil)
)

// SQLiteConfig is what OpenSQLite needs of the engine that opened the
// database.
type SQLiteConfig struct {
	// Name is the engine's name, for messages.
	Name string
	// Path is the database file's absolute path.
	Path string
	// DB is the engine's pool. Its transactions must begin IMMEDIATE.
	DB *sql.DB
	// Batch is the engine's Batcher, which every write transaction of the
	// database goes through; nil when the database is read-only.
	Batch *Batcher
	// ReadOnly: the database is on read-only media. Nothing is created or
	// written; a ledger the database predates reads as empty.
	ReadOnly bool
	// Boot is where the row clock comes from (HostBoot, or a test's).
	Boot Boot
	// Wrap names the engine on errors (nil: blob.Wrap with Name).
	Wrap Wrap
	// BlobDelete is the engine's statement that deletes one blob's kv
	// rows by its digest (the one parameter) and returns its size, no
	// row when it holds none: what Arbitrate deletes the dead with, in
	// its transaction. Required: every database with this state keeps
	// the engine's blobs.
	BlobDelete string
	// BlobPut is the engine's insert of a blob in a transaction: with it
	// (and Batch), small puts into a namespace go through the close
	// journal (journal.go), which applies a record's blob with it. nil:
	// no journal; every put commits before it returns.
	BlobPut BlobPut
	// Log is where the journal says what it could not do (nil: nowhere).
	Log *slog.Logger
}

// sqliteSchema is the GC's tables, the same in every layout of the
// engine's blob tables.
const sqliteSchema = `
CREATE TABLE IF NOT EXISTS gc_window (
	digest        BLOB PRIMARY KEY,
	visible_after INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS gc_pins (
	digest BLOB NOT NULL,
	owner  TEXT NOT NULL,
	expiry INTEGER NOT NULL,
	PRIMARY KEY (digest, owner)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS gc_pins_owner ON gc_pins (owner);
`

// sqliteCorruptSchema is the corrupt ledger; marked is the row clock.
const sqliteCorruptSchema = `CREATE TABLE IF NOT EXISTS gc_corrupt (
	digest BLOB PRIMARY KEY,
	file   BLOB NOT NULL,
	reason TEXT NOT NULL,
	marked INTEGER NOT NULL
) WITHOUT ROWID`

// OpenSQLite creates the state's tables in the database if needed, fixes
// the row clock of this process for it (moving a dead boot's rows onto
// this one: sqlite_clock.go) and prepares the statements. Close releases
// them; the engine closes the pool.
func OpenSQLite(ctx context.Context, cfg SQLiteConfig) (*SQLite, error) {
	s := &SQLite{name: cfg.Name, path: cfg.Path, db: cfg.DB, batch: cfg.Batch, wrapD: cfg.Wrap}
	if s.wrapD == nil {
		s.wrapD = func(op string, d blob.Digest, err error) error { return blob.Wrap(op, cfg.Name, d, err) }
	}
	if cfg.BlobDelete == "" {
		return nil, s.wrap("open", errNoBlobDelete)
	}
	if _, err := s.db.ExecContext(ctx, sqliteSchema); err != nil {
		return nil, s.wrap("open", fmt.Errorf("create schema: %w", err))
	}
	if err := s.initLedger(ctx, cfg.ReadOnly); err != nil {
		return nil, err
	}
	for _, st := range []struct {
		stmt **sql.Stmt
		sql  string
	}{
		{&s.wStage, `INSERT INTO gc_window (digest, visible_after) VALUES (?, ?) ON CONFLICT (digest) DO NOTHING`},
		{&s.wDue, `SELECT digest FROM gc_window WHERE digest > coalesce(?, x'') AND visible_after <= ? ORDER BY digest LIMIT ?`},
		{&s.wRemove, `DELETE FROM gc_window WHERE digest = ?`},
		{&s.wLen, `SELECT count(*) FROM gc_window`},
		{&s.pinUp, `INSERT INTO gc_pins (digest, owner, expiry) VALUES (?, ?, ?)
			ON CONFLICT (digest, owner) DO UPDATE SET expiry = max(expiry, excluded.expiry)`},
		{&s.pinDel, `DELETE FROM gc_pins WHERE digest = ? AND owner = ?`},
	} {
		p, err := s.db.PrepareContext(ctx, st.sql)
		if err != nil {
			s.Close()
			return nil, s.wrap("open", fmt.Errorf("prepare %q: %w", st.sql, err))
		}
		*st.stmt = p
	}
	var err error
	if s.blobDel, err = s.db.PrepareContext(ctx, cfg.BlobDelete); err != nil {
		s.Close()
		return nil, s.wrap("open", fmt.Errorf("prepare %q: %w", cfg.BlobDelete, err))
	}
	if err := s.openClock(ctx, cfg.Boot, cfg.ReadOnly); err != nil {
		s.Close()
		return nil, err
	}
	if cfg.BlobPut != nil && cfg.Batch != nil && !cfg.ReadOnly {
		if s.journal, err = openJournal(ctx, s, cfg.Path, cfg.Batch, cfg.DB, cfg.BlobPut, cfg.Log); err != nil {
			s.Close()
			return nil, s.wrap("open", err)
		}
	}
	return s, nil
}

// Journal is the database's close journal, nil without one.
func (s *SQLite) Journal() *Journal { return s.journal }

// Close closes the prepared statements.
func (s *SQLite) Close() error {
	s.journal.closeStmts()
	var errs []error
	for _, st := range []*sql.Stmt{s.wStage, s.wDue, s.wRemove, s.wLen, s.pinUp, s.pinDel, s.blobDel} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return s.wrap("close", errors.Join(errs...))
}

// Meta is the state as a State: every part.
func (s *SQLite) Meta() State { return State{Host: s, Window: s, Ledger: s} }

func (s *SQLite) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return s.wrapD(op, blob.Digest{}, err)
}

// initLedger creates gc_corrupt. A database on read-only media that
// predates the table cannot get it, and has no record to read: the
// ledger then reads as empty (noLedger) and refuses writes.
func (s *SQLite) initLedger(ctx context.Context, ro bool) error {
	if !ro {
		if _, err := s.db.ExecContext(ctx, sqliteCorruptSchema); err != nil {
			return s.wrap("open", fmt.Errorf("create schema: %w", err))
		}
		return nil
	}
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'gc_corrupt'`).Scan(&n); err != nil {
		return s.wrap("open", err)
	}
	s.noLedger = n == 0
	return nil
}

// inTx runs fn in a write transaction (write) and commits it, rolling
// back on any error. fn's error comes back as it is; a failed BEGIN or
// COMMIT is wrapped with op. fn is a Batcher job: it must use the context
// it is given, which no caller can cancel midway (see Batcher),
// and be safe to run twice.
func (s *SQLite) inTx(ctx context.Context, op string, fn func(ctx context.Context, tx *sql.Tx) error) error {
	var ferr error
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		ferr = fn(ctx, tx)
		return ferr
	})
	if err != nil && err != ferr {
		err = s.wrap(op, err)
	}
	return err
}

// write runs fn in a write transaction, eager (Write: through the
// engine's Batcher when the database is writable).
func (s *SQLite) write(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return Write(ctx, s.batch, s.db, false, fn)
}

// SerialArbitration implements SerialHost: Arbitrate's lock is the
// database's write lock, which every write transaction holds from its
// BEGIN IMMEDIATE to its end.
func (s *SQLite) SerialArbitration() bool { return true }

// PinRows implements Host.
func (s *SQLite) PinRows(ctx context.Context, owner string, ds []blob.Digest, ttl time.Duration) error {
	if len(ds) == 0 {
		return nil
	}
	return s.inTx(ctx, "pin", func(ctx context.Context, tx *sql.Tx) error { return s.pinRowsTx(ctx, tx, owner, ds, ttl) })
}

// pinRowsTx is PinRows in tx, which the caller commits: the write lock
// tx holds is the arbitration lock.
func (s *SQLite) pinRowsTx(ctx context.Context, tx *sql.Tx, owner string, ds []blob.Digest, ttl time.Duration) error {
	st := tx.StmtContext(ctx, s.pinUp)
	expiry := addNanos(s.clock.now(), ttl)
	for _, d := range ds {
		if _, err := st.ExecContext(ctx, d[:], owner, expiry); err != nil {
			return s.wrapD("pin", d, err)
		}
	}
	return nil
}

// WriteRows writes rows in tx, the transaction of a put's entry (the
// engine's Putter): the pin row first, which takes the arbitration lock
// (here the write lock tx holds already), then the namespace part.
func (s *SQLite) WriteRows(ctx context.Context, tx *sql.Tx, rows Rows) error {
	if p := rows.Pin; p != nil {
		if err := s.pinRowsTx(ctx, tx, p.Owner, []blob.Digest{p.D}, p.TTL); err != nil {
			return err
		}
	}
	return rows.NS.WriteTx(ctx, tx)
}

// RenewPins implements Host.
func (s *SQLite) RenewPins(ctx context.Context, owner string, ttl time.Duration) (map[blob.Digest]bool, error) {
	var out map[blob.Digest]bool
	err := s.inTx(ctx, "renew pins", func(ctx context.Context, tx *sql.Tx) error {
		out = make(map[blob.Digest]bool) // afresh: a job may run twice
		now := s.clock.now()
		if err := scanDigestsTx(ctx, tx, `UPDATE gc_pins SET expiry = ? WHERE owner = ? AND expiry > ? RETURNING digest`,
			[]any{addNanos(now, ttl), owner, now}, out); err != nil {
			return s.wrap("renew pins", err)
		}
		return nil
	})
	return out, err
}

// DropPins implements Host.
func (s *SQLite) DropPins(ctx context.Context, owner string, ds []blob.Digest) error {
	if len(ds) == 0 {
		return nil
	}
	return s.inTx(ctx, "drop pins", func(ctx context.Context, tx *sql.Tx) error {
		st := tx.StmtContext(ctx, s.pinDel)
		for _, d := range ds {
			if _, err := st.ExecContext(ctx, d[:], owner); err != nil {
				return s.wrapD("drop pins", d, err)
			}
		}
		return nil
	})
}

// DropOwner implements Host.
func (s *SQLite) DropOwner(ctx context.Context, owner string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM gc_pins WHERE owner = ?`, owner)
	return s.wrap("drop pins", err)
}

// ReapPins implements Host.
func (s *SQLite) ReapPins(ctx context.Context) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM gc_pins WHERE expiry <= ?`, s.clock.now())
	if err != nil {
		return 0, s.wrap("reap pins", err)
	}
	n, err := res.RowsAffected()
	return n, s.wrap("reap pins", err)
}

// PinCount implements Host.
func (s *SQLite) PinCount(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM gc_pins WHERE expiry > ?`, s.clock.now()).Scan(&n)
	return n, s.wrap("count pins", err)
}

// Arbitrate implements Host: the transaction begins IMMEDIATE, which is
// the write lock of the whole database. The kv form is a Batcher job like
// every write, which may share its transaction and run again after a
// rollback (arbitrateIn starts afresh); the Outside form runs alone and
// once (Batcher.DoAlone), so Outside acts only on committed work.
func (s *SQLite) Arbitrate(ctx context.Context, a Arbitration) ([]int64, error) {
	var out []int64
	job := func(ctx context.Context, tx *sql.Tx) error {
		got, err := arbitrateIn(ctx, tx, s, a)
		if err == nil {
			out = got // the committed run's, whatever an earlier one said
		}
		return err
	}
	if a.Outside == nil {
		if err := s.inTx(ctx, "arbitrate", job); err != nil {
			return nil, err
		}
		return out, nil
	}
	var ferr error
	run := func(ctx context.Context, tx *sql.Tx) error {
		ferr = job(ctx, tx)
		return ferr
	}
	var err error
	if s.batch != nil {
		err = s.batch.DoAlone(ctx, run)
	} else {
		err = InTx(ctx, s.db, nil, func(tx *sql.Tx) error { return run(ctx, tx) })
	}
	switch {
	case err == nil:
		return out, nil
	case err != ferr:
		err = s.wrap("arbitrate", err)
	}
	return nil, err
}

// inListBatch bounds the IN list of one pinnedTx query.
const inListBatch = 500

// pinnedTx implements arbitrator with IN-list queries on the primary
// key, inListBatch digests at a time: a sweep asks for its arbitration
// batch's candidates at once, and one query per digest was a sixth of a
// million-entry sweep's delete pass. Rows of every owner count.
func (s *SQLite) pinnedTx(ctx context.Context, tx *sql.Tx, ds []blob.Digest) (map[blob.Digest]bool, error) {
	out := make(map[blob.Digest]bool)
	now := s.clock.now() // one instant for every batch
	for lo := 0; lo < len(ds); lo += inListBatch {
		batch := ds[lo:min(len(ds), lo+inListBatch)]
		args := make([]any, 0, len(batch)+1)
		for _, d := range batch {
			args = append(args, d[:])
		}
		args = append(args, now)
		q := "SELECT DISTINCT digest FROM gc_pins WHERE digest IN (?" + strings.Repeat(", ?", len(batch)-1) + ") AND expiry > ?"
		if err := scanDigestsTx(ctx, tx, q, args, out); err != nil {
			return nil, s.wrap("pinned", err)
		}
	}
	return out, nil
}

// DeleteBlobs deletes the kv rows of ds with the engine's BlobDelete,
// outside any arbitration, in a write transaction of its own, and returns
// each one's size or NotHeld: the engine's engines.BatchDeleter, so that
// the delete loop is this one, the arbitration's.
func (s *SQLite) DeleteBlobs(ctx context.Context, ds []blob.Digest) ([]int64, error) {
	var sizes []int64
	err := s.inTx(ctx, "delete", func(ctx context.Context, tx *sql.Tx) error {
		got, err := s.deleteBlobsTx(ctx, tx, ds)
		if err == nil {
			sizes = got // the committed run's (a Batcher job may run twice)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return sizes, nil
}

// deleteBlobsTx implements arbitrator: the engine's BlobDelete for each
// digest, in tx.
func (s *SQLite) deleteBlobsTx(ctx context.Context, tx *sql.Tx, ds []blob.Digest) ([]int64, error) {
	del := tx.StmtContext(ctx, s.blobDel)
	sizes := make([]int64, len(ds))
	for i, d := range ds {
		switch err := del.QueryRowContext(ctx, d[:]).Scan(&sizes[i]); {
		case errors.Is(err, sql.ErrNoRows):
			sizes[i] = NotHeld
		case err != nil:
			return nil, s.wrapD("delete", d, err)
		}
	}
	return sizes, nil
}

// scanDigestsTx runs q in tx and adds every digest it returns to out.
func scanDigestsTx(ctx context.Context, tx *sql.Tx, q string, args []any, out map[blob.Digest]bool) error {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return engines.ScanDigests(rows, func(d blob.Digest) { out[d] = true })
}

// SweepLease implements Host with an flock(2) on a file beside the
// database, DB.gc-lease: SQLite stores are on one host, and the kernel
// drops the lock when its holder dies, kill -9 included. The file holds the
// holder's pid, for the message another process prints.
func (s *SQLite) SweepLease(ctx context.Context) (Lease, bool, error) {
	path := s.path + ".gc-lease"
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, s.wrap("sweep lease", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, s.wrap("sweep lease", fmt.Errorf("flock %s: %w", path, err))
	}
	if err := f.Truncate(0); err == nil {
		fmt.Fprintf(f, "%d\n", os.Getpid())
	}
	return &fileLease{f: f}, true, nil
}

// fileLease is a held flock. It cannot be lost while the descriptor is
// open.
type fileLease struct{ f *os.File }

func (l *fileLease) Check(context.Context) error { return nil }

func (l *fileLease) Release() {
	if l.f != nil {
		l.f.Close() // closing the descriptor drops the flock
		l.f = nil
	}
}

// WindowQueue implements Window in one transaction. A digest already
// queued keeps its row (and its time). The transaction also moves
// gc_clock.seen to now: what a reboot counts the rows' remaining delays
// from (sqlite_clock.go).
func (s *SQLite) WindowQueue(ctx context.Context, ds []blob.Digest, delay time.Duration) error {
	if len(ds) == 0 {
		return nil
	}
	return s.inTx(ctx, "window queue", func(ctx context.Context, tx *sql.Tx) error {
		now := s.clock.now()
		at := addNanos(now, max(delay, 0))
		st := tx.StmtContext(ctx, s.wStage)
		for _, d := range ds {
			if _, err := st.ExecContext(ctx, d[:], at); err != nil {
				return s.wrapD("window queue", d, err)
			}
		}
		if _, err := tx.ExecContext(ctx, `UPDATE gc_clock SET seen = max(seen, ?) WHERE id = 1`, now); err != nil {
			return s.wrap("window queue", err)
		}
		return nil
	})
}

// WindowDue implements Window.
func (s *SQLite) WindowDue(ctx context.Context, after blob.Digest, limit int) ([]blob.Digest, error) {
	if limit <= 0 {
		return nil, nil
	}
	// The zero cursor binds as NULL, hence the empty blob, which sorts
	// below every 32-byte key: it lists from the start, the zero digest
	// included.
	var cur any
	if !after.IsZero() {
		cur = after[:]
	}
	rows, err := s.wDue.QueryContext(ctx, cur, s.clock.now(), limit)
	if err != nil {
		return nil, s.wrap("window due", err)
	}
	defer rows.Close()
	var ds []blob.Digest
	if err := engines.ScanDigests(rows, func(d blob.Digest) { ds = append(ds, d) }); err != nil {
		return nil, s.wrap("window due", err)
	}
	return ds, nil
}

// WindowRemove implements Window; absent digests are ignored.
func (s *SQLite) WindowRemove(ctx context.Context, ds []blob.Digest) error {
	if len(ds) == 0 {
		return nil
	}
	return s.inTx(ctx, "window remove", func(ctx context.Context, tx *sql.Tx) error {
		st := tx.StmtContext(ctx, s.wRemove)
		for _, d := range ds {
			if _, err := st.ExecContext(ctx, d[:]); err != nil {
				return s.wrapD("window remove", d, err)
			}
		}
		return nil
	})
}

// WindowLen implements Window.
func (s *SQLite) WindowLen(ctx context.Context) (int, error) {
	var n int
	if err := s.wLen.QueryRowContext(ctx).Scan(&n); err != nil {
		return 0, s.wrap("window len", err)
	}
	return n, nil
}

// MarkCorrupt implements Ledger.
func (s *SQLite) MarkCorrupt(ctx context.Context, d blob.Digest, file []byte, reason string) error {
	if s.noLedger {
		return s.wrapD("mark corrupt", d, blob.ErrReadOnly)
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO gc_corrupt (digest, file, reason, marked) VALUES (?, ?, ?, ?)
		ON CONFLICT (digest) DO UPDATE SET file = excluded.file, reason = excluded.reason, marked = excluded.marked`,
		d[:], nonNil(file), reason, s.clock.now())
	if err != nil {
		return s.wrapD("mark corrupt", d, err)
	}
	return nil
}

// CorruptMark implements Ledger.
func (s *SQLite) CorruptMark(ctx context.Context, d blob.Digest) (Mark, bool, error) {
	if s.noLedger {
		return Mark{}, false, nil
	}
	m := Mark{Digest: d}
	var marked int64
	err := s.db.QueryRowContext(ctx, `SELECT file, reason, marked FROM gc_corrupt WHERE digest = ?`, d[:]).Scan(&m.File, &m.Reason, &marked)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Mark{}, false, nil
	case err != nil:
		return Mark{}, false, s.wrapD("corrupt mark", d, err)
	}
	m.Marked = time.Unix(0, marked)
	return m, true, nil
}

// ClearCorrupt implements Ledger.
func (s *SQLite) ClearCorrupt(ctx context.Context, d blob.Digest, file []byte) (bool, error) {
	if s.noLedger {
		return false, nil
	}
	res, err := s.db.ExecContext(ctx, `DELETE FROM gc_corrupt WHERE digest = ? AND file = ?`, d[:], nonNil(file))
	if err != nil {
		return false, s.wrapD("clear corrupt", d, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, s.wrapD("clear corrupt", d, err)
	}
	return n > 0, nil
}

// CorruptMarks implements Ledger.
func (s *SQLite) CorruptMarks(ctx context.Context) ([]Mark, error) {
	if s.noLedger {
		return nil, nil
	}
	rows, err := s.db.QueryContext(ctx, corruptMarksSQL)
	if err != nil {
		return nil, s.wrap("corrupt marks", err)
	}
	defer rows.Close()
	marks, err := scanMarks(rows)
	return marks, s.wrap("corrupt marks", err)
}
