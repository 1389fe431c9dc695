package meta

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// State is the shared GC state of one pool, as its kv engine's database
// keeps it: each part is nil where that database keeps none (see Holder).
// It is what the store hands the collector and the store's verdicts.
type State struct {
	// Host holds pin rows, the arbitration lock and the sweep lease
	// (SQLite, PostgreSQL).
	Host Host
	// Window is the durable delete window (SQLite, PostgreSQL, and the
	// pglo large engine's database).
	Window Window
	// Ledger is the corrupt ledger (SQLite, PostgreSQL, mem).
	Ledger Ledger
}

// Holder is an engine whose storage keeps shared state: the engine opens
// its database, and its part of the state there through this package,
// at Open. Meta returns the same State on every call.
type Holder interface {
	Meta() State
}

// Host is the pool's shared pins and arbitration: the one home of the GC
// state that every process and host that opens the pool must see. It holds
// pin rows,
//
//	gc_pins(digest, owner, expiry)    primary key (digest, owner)
//
// and the arbitration lock, and carries out a delete's arbitration as one
// operation (Arbitrate). It contributes rows, locks and that operation;
// the collector (package gc) owns what they mean — which owner, how long a
// row lives, which tables protect a key (Arbitration.Live). Host never
// decides liveness: it applies the one rule that a pin row or a live row
// protects.
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
// An expiry is written and compared on the row clock (see "Row times" in
// doc.go): PinRows and RenewPins take a TTL and store the clock's now plus
// it; ReapPins, PinCount and Arbitrate compare with the clock's now when
// they run. No method takes an instant, so no process's clock decides
// whether another process's row has expired. A TTL <= 0 writes a row that
// has already expired. Times are stored as unix nanoseconds.
//
// Every method ends its transaction on every path: no connection goes back
// to a pool inside a transaction.
type Host interface {
	// PinRows upserts a row (d, owner, now + ttl) for each d of ds, in a
	// transaction of its own, taking each digest's arbitration lock in
	// shared mode first. An existing row keeps the later of its expiry
	// and the new one. A put's pin row commits in the put's transaction
	// instead, handed to the engine as a value (Rows.Pin).
	PinRows(ctx context.Context, owner string, ds []blob.Digest, ttl time.Duration) error
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

	// Arbitrate holds the exclusive arbitration lock of every digest of
	// a.Digests for the whole of one transaction, and in it reads what
	// protects them — every owner's pin rows unexpired now (read once,
	// after the locks are held), then each of a.Live — and deletes the
	// rest: their kv rows, with the delete statement the engine gave
	// when it opened this state (on PostgreSQL their window rows leave
	// with them, PGWindowGone), or, with a.Outside set, through
	// a.Outside. It returns out[i] = a.Digests[i]'s size, NotHeld or
	// Protected, from the run that committed, and nothing on an error,
	// when nothing of it committed (but what a.Outside did).
	//
	// The kv form's transaction may be shared with other writers' work
	// and run again after it rolled back (SQLite's Batcher): each run
	// decides afresh, and the answer is the committed run's. The Outside
	// form runs once, in a transaction of its own that shares nothing, so
	// that it reads only committed work: Outside does what no rollback
	// undoes.
	Arbitrate(ctx context.Context, a Arbitration) ([]int64, error)

	// SweepLease takes the pool-wide sweep lease without waiting. held is
	// false (and the lease nil) when another process holds it.
	SweepLease(ctx context.Context) (l Lease, held bool, err error)
}

// SerialHost is a Host whose arbitration lock is every write
// transaction's for its whole length, in every process (SQLite's database
// write lock: transactions begin IMMEDIATE). A row that any transaction
// commits is then seen by every arbitration after it, and no arbitration
// runs while the transaction is open: a put whose own transaction also
// writes what keeps its digest live (a namespace reference or intent,
// which arbitration reads in its transaction) needs no pin row
// (gc.Collector.BeginPublish, linked). On PostgreSQL the lock is per digest and taken
// by pin rows only, so puts keep their rows there.
type SerialHost interface {
	Host
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

// Window is the GC's durable delete window:
//
//	gc_window(digest PRIMARY KEY, visible_after)
//
// The store picks exactly one window per instance (the kv engine's state
// first, else the large engine's); a store without one gets the
// collector's in-process window.
//
// A row's time is the row clock's (see "Times" at Host): the caller passes
// how long a candidate waits, never when it is due, so that the processes
// and hosts that queue and execute rows agree on when that is.
type Window interface {
	// WindowQueue records each digest of ds as a candidate due delay
	// (>= 0) from now on the row clock. A digest already queued keeps
	// its row, and its time.
	WindowQueue(ctx context.Context, ds []blob.Digest, delay time.Duration) error
	// WindowDue lists up to limit candidates due now on the row clock,
	// ascending by digest, after `after`.
	WindowDue(ctx context.Context, after blob.Digest, limit int) ([]blob.Digest, error)
	// WindowRemove drops rows for ds (executed or cancelled).
	WindowRemove(ctx context.Context, ds []blob.Digest) error
	// WindowLen counts queued rows.
	WindowLen(ctx context.Context) (int, error)
}

// Ledger is the store's record of the blobs a scrub found corrupt, kept
// with the rest of the GC state, in the one place every process and host
// that opens the pool reads. So a blob that a scrub in one process (a
// mount, serve, alkblobfs verify) found corrupt is refused by every other
// one up front, before any byte of it is sent, and not only found bad
// again, chunk by chunk, by whoever reads it next. On SQL databases it is
// one table,
//
//	gc_corrupt(digest PRIMARY KEY, file, reason, marked)
//
// file is opaque here: the store's identity of the backing file the
// verdict is about (device, inode, size, times), or empty for a blob that
// is not a file. The ledger never interprets it, and decides nothing: the
// store compares it with the file as it is now (a changed file makes the
// verdict suspect instead of corrupt) and clears the record on a repair.
// marked is the row clock, for reports only; nothing compares it. A mem
// ledger lives in the process, as long as the mem engine's blobs.
type Ledger interface {
	// MarkCorrupt records d as corrupt as file, replacing any record of d.
	MarkCorrupt(ctx context.Context, d blob.Digest, file []byte, reason string) error
	// CorruptMark returns d's record; ok is false when there is none.
	CorruptMark(ctx context.Context, d blob.Digest) (m Mark, ok bool, err error)
	// ClearCorrupt deletes d's record if it still names file (so that a
	// later verdict about another version of the file survives), and
	// reports whether it did. No record is not an error.
	ClearCorrupt(ctx context.Context, d blob.Digest, file []byte) (bool, error)
	// CorruptMarks returns every record in digest order. Corrupt blobs are
	// few: the list is not paged.
	CorruptMarks(ctx context.Context) ([]Mark, error)
}

// Mark is one record of a Ledger.
type Mark struct {
	Digest blob.Digest
	File   []byte // the store's file identity; empty: not a file
	Reason string
	Marked time.Time // on the row clock
}

// corruptMarksSQL is the query both SQL ledgers list their marks with;
// scanMarks reads its rows.
const corruptMarksSQL = `SELECT digest, file, reason, marked FROM gc_corrupt ORDER BY digest`

// scanMarks reads the rows of corruptMarksSQL (marked in unix nanoseconds
// of the row clock).
func scanMarks(rows engines.DigestRows) ([]Mark, error) {
	var out []Mark
	for rows.Next() {
		var m Mark
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

// nonNil binds an empty byte slice (an empty file identity) as the empty
// blob or bytea, never NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// addNanos is t + d in unix nanoseconds, saturating at the ends of int64
// rather than wrapping: a huge TTL means "for as long as a row can say".
func addNanos(t int64, d time.Duration) int64 {
	switch {
	case d > 0 && t > math.MaxInt64-int64(d):
		return math.MaxInt64
	case d < 0 && t < math.MinInt64-int64(d):
		return math.MinInt64
	}
	return t + int64(d)
}

// Wrap is how an engine names itself and the operation on an error of
// its state (blob.Wrap, with the engine's own translations such as a
// full disk to blob.ErrNoSpace), so that an error reads the same whether
// the blob row or the pin row failed.
type Wrap func(op string, d blob.Digest, err error) error
