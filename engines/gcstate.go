package engines

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
)

// GCHost is implemented by the SQL kv engines (sqlite, postgres): the one
// home of a store's shared GC state, so that every process and host that
// opens the pool sees it. It holds pin rows,
//
//	gc_pins(digest, owner, expiry)    primary key (digest, owner)
//
// and the arbitration lock. The engine contributes rows and locks; the
// collector (package gc) owns what they mean — which owner, how long a row
// lives, what protects a key. An engine never decides liveness.
//
// # The arbitration lock
//
// Arbitrate holds, for each digest it is given, an exclusive lock for the
// whole of its transaction; PinRows takes the same digests' lock in shared
// mode before it writes. So a pin row either commits before an arbitration
// of its digest begins (and the arbitration sees it), or waits until that
// arbitration has committed its delete (and the pinner then re-puts). On
// SQLite the lock is the database's write lock (transactions begin
// IMMEDIATE); on PostgreSQL a transaction-scoped advisory lock per digest.
//
// # Times
//
// An expiry is written and compared on the engine's clock (see "Row times"
// in clock.go): PinRows and RenewPins take a TTL and store the engine's now
// plus it; ReapPins, PinCount and PinnedAmong compare with the engine's now
// when they run. No method takes an instant, so no process's clock decides
// whether another process's row has expired. A TTL <= 0 writes a row that
// has already expired. Times are stored as unix nanoseconds.
//
// Every method ends its transaction on every path: no connection goes back
// to a pool inside a transaction.
type GCHost interface {
	Engine
	SQL
	// PinRows upserts a row (d, owner, now + ttl) for each d of ds, taking
	// each digest's arbitration lock in shared mode first. An existing row
	// keeps the later of its expiry and the new one. With tx nil it runs in
	// a transaction of its own; otherwise in tx, which the caller commits.
	PinRows(ctx context.Context, tx *sql.Tx, owner string, ds []blob.Digest, ttl time.Duration) error
	// RenewPins sets owner's rows that are unexpired now to now + ttl, in
	// one statement (one reading of the clock), and returns the set of
	// digests it moved. A row expired now is never revived.
	RenewPins(ctx context.Context, owner string, ttl time.Duration) (map[blob.Digest]bool, error)
	// DropPins deletes owner's rows for ds (none when ds is empty).
	DropPins(ctx context.Context, owner string, ds []blob.Digest) error
	// DropOwner deletes every row of owner.
	DropOwner(ctx context.Context, owner string) error
	// ReapPins deletes every row, of any owner, expired now, and returns
	// how many.
	ReapPins(ctx context.Context) (int64, error)
	// PinCount counts the rows unexpired now, of any owner (for stats and
	// tests).
	PinCount(ctx context.Context) (int64, error)

	// Arbitrate runs fn in one transaction that holds the exclusive
	// arbitration lock of every digest of ds, and commits if fn succeeds.
	// fn reads what protects the digests (PinnedAmong, and any table in the
	// same database) and deletes the dead rows (DeleteManyTx). The
	// transaction may be shared with other writers' work and fn run again
	// after it rolled back (SQLite's Batcher): fn starts afresh each run
	// and does nothing a rollback does not undo (gc.AloneHost is the hold
	// for that).
	Arbitrate(ctx context.Context, ds []blob.Digest, fn func(ctx context.Context, tx *sql.Tx) error) error
	// PinnedAmong returns the digests of ds that have a row unexpired now
	// (read once, when the query runs: after fn's locks are held) whose
	// owner is not except, read in tx.
	PinnedAmong(ctx context.Context, tx *sql.Tx, ds []blob.Digest, except string) (map[blob.Digest]bool, error)
	// DeleteManyTx is BatchDeleter.DeleteMany inside tx.
	DeleteManyTx(ctx context.Context, tx *sql.Tx, ds []blob.Digest) ([]int64, error)

	// SweepLease takes the pool-wide sweep lease without waiting. held is
	// false (and the lease nil) when another process holds it.
	SweepLease(ctx context.Context) (l Lease, held bool, err error)
}

// SerialHost is a GCHost whose arbitration lock is every write
// transaction's for its whole length, in every process (SQLite's database
// write lock: transactions begin IMMEDIATE). A row that any transaction
// commits is then seen by every arbitration after it, and no arbitration
// runs while the transaction is open: a put whose own transaction also
// writes what keeps its digest live (a namespace reference or intent,
// which arbitration reads in its transaction) needs no pin row
// (gc.Collector.PinLinked). On PostgreSQL the lock is per digest and taken
// by pin rows only, so puts keep their rows there.
type SerialHost interface {
	GCHost
	// SerialArbitration reports that the host is one (a wrapper may not be).
	SerialArbitration() bool
}

// Lease is a held sweep lease. It ends when released or when its holder
// dies (the lease is a lock the operating system or the server drops).
type Lease interface {
	// Check returns an error if the lease has been lost (a database
	// restart drops a session lock): the holder must then stop deleting.
	Check(ctx context.Context) error
	// Release gives the lease back. Idempotent.
	Release()
}

// Locator is implemented by engines whose data lives on a database server,
// so that a fleet's configuration can be checked: Instance names the server
// and database ("host:port/database"); PoolSize is the most connections the
// engine's pool opens.
type Locator interface {
	Instance() string
	PoolSize() int
}

// Ephemeral is implemented by engines whose content dies with the process
// (mem). A fleet refuses them.
type Ephemeral interface {
	Ephemeral() bool
}

// CorruptLedger is implemented by the kv engines (mem, sqlite, postgres):
// the store's record of the blobs a scrub found corrupt, kept with the
// rest of the GC state, in the one place every process and host that opens
// the pool reads. So a blob that a scrub in one process (a mount, serve,
// alkblobfs verify) found corrupt is refused by every other one up front,
// before any byte of it is sent, and not only found bad again, chunk by
// chunk, by whoever reads it next. On SQL engines it is one table,
//
//	gc_corrupt(digest PRIMARY KEY, file, reason, marked)
//
// file is opaque to the engine: the store's identity of the backing file
// the verdict is about (device, inode, size, times), or empty for a blob
// that is not a file. The engine never interprets it, and decides nothing:
// the store compares it with the file as it is now (a changed file makes
// the verdict suspect instead of corrupt) and clears the record on a
// repair. marked is the engine's row clock, for reports only; nothing
// compares it. A mem engine keeps its ledger in the process, as long as
// its blobs.
type CorruptLedger interface {
	Engine
	// MarkCorrupt records d as corrupt as file, replacing any record of d.
	MarkCorrupt(ctx context.Context, d blob.Digest, file []byte, reason string) error
	// CorruptMark returns d's record; ok is false when there is none.
	CorruptMark(ctx context.Context, d blob.Digest) (m CorruptMark, ok bool, err error)
	// ClearCorrupt deletes d's record if it still names file (so that a
	// later verdict about another version of the file survives), and
	// reports whether it did. No record is not an error.
	ClearCorrupt(ctx context.Context, d blob.Digest, file []byte) (bool, error)
	// CorruptMarks returns every record in digest order. Corrupt blobs are
	// few: the list is not paged.
	CorruptMarks(ctx context.Context) ([]CorruptMark, error)
}

// CorruptMark is one record of a CorruptLedger.
type CorruptMark struct {
	Digest blob.Digest
	File   []byte // the store's file identity; empty: not a file
	Reason string
	Marked time.Time // on the engine's row clock
}

// CorruptMarksSQL is the query a SQL CorruptLedger lists its marks with;
// ScanCorruptMarks reads its rows.
const CorruptMarksSQL = `SELECT digest, file, reason, marked FROM gc_corrupt ORDER BY digest`

// Rows is what ScanCorruptMarks reads: database/sql's rows and pgx's both.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// ScanCorruptMarks reads the rows of CorruptMarksSQL (marked in unix
// nanoseconds of the engine's row clock).
func ScanCorruptMarks(rows Rows) ([]CorruptMark, error) {
	var out []CorruptMark
	for rows.Next() {
		var m CorruptMark
		var key []byte
		var marked int64
		if err := rows.Scan(&key, &m.File, &m.Reason, &marked); err != nil {
			return nil, err
		}
		if len(key) != len(m.Digest) {
			return nil, fmt.Errorf("a digest of %d bytes in gc_corrupt", len(key))
		}
		copy(m.Digest[:], key)
		m.Marked = time.Unix(0, marked)
		out = append(out, m)
	}
	return out, rows.Err()
}

// NonNil binds an empty byte slice (an empty file identity) as the empty
// blob or bytea, never NULL.
func NonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
