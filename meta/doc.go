// Package meta is the one owner of the state every process and host of a
// pool shares: for its garbage collection, pin rows, the arbitration lock,
// the sweep lease, the delete window, the corrupt ledger and the row clock
// that times them; for its namespaces, their names, links (references),
// intents and usage counters. It owns their tables — their schema, their migrations,
// every statement that reads or writes them — per dialect:
//
//   - SQLite (sqlite.go, sqlite_clock.go): [SQLite], in the sqlite kv
//     engine's database file.
//   - PostgreSQL (postgres.go): [Postgres] in the postgres kv engine's
//     database, and [PGWindow], the window alone, in pglo's.
//   - mem (mem.go): [MemLedger], the corrupt ledger of a mem engine, in the
//     process.
//   - a delete's arbitration, both SQL dialects (arbitrate.go):
//     [Arbitration], what it reads ([Liveness]; an embedder's liveness
//     table, [LiveTable], in livetable.go) and its outcomes.
//   - the namespaces' tables, both SQL dialects (ns_schema.go, ns*.go):
//     [Links], which package namespaces opens on the kv engine's database
//     ([OpenLinks]) and reaches its rows through; its mem registry keeps
//     its own, in the process.
//
// An engine opens its dialect in its own database at Open and hands it
// out as a [State] ([Holder]); the store gives the kv engine's (or, for
// the window alone, the large engine's) to the collector and its own
// verdicts. Package gc and package store reach the state only through
// [Host] (a delete's arbitration: [Arbitration], [Liveness]),
// [SerialHost], [Window], [Ledger] and [Lease], and engines keep blob
// storage only, handing this package the statement that deletes a blob's
// rows at open. docs/architecture_test.go holds every other package
// to that: no non-test file outside meta names these tables in SQL.
//
// # Tables
//
//	gc_pins(digest, owner, expiry)                 PRIMARY KEY (digest, owner); index gc_pins_owner (owner)
//	gc_window(digest PRIMARY KEY, visible_after)
//	gc_corrupt(digest PRIMARY KEY, file, reason, marked)
//	gc_clock(id = 1, boot_id, epoch, seen)          SQLite only
//	journal_marks(segment PRIMARY KEY, applied)    SQLite only: the close journal's (journal.go)
//	ns(name PRIMARY KEY, created_at, uid, gid, mode, blobs, bytes, quota_blobs, quota_bytes)
//	ns_refs(ns, digest, linked_at, size)           PRIMARY KEY (ns, digest); index ns_refs_digest (digest)
//	ns_pending(id PRIMARY KEY, ns, digest, holder, expiry, size)   index ns_pending_digest (digest)
//
// BLOB and INTEGER on SQLite (the gc_ tables WITHOUT ROWID), BYTEA and
// BIGINT on PostgreSQL; every time is unix nanoseconds, on the row clock
// except ns.created_at and ns_refs.linked_at, which are the caller's wall
// clock (what a user reads as the time of a namespace or a link). The
// names and columns are those the engines (the gc_ tables) and package
// namespaces (the ns tables) created before this package owned them: a database made by an earlier build opens with its rows, and the
// migrations that existed still run (a database from before gc_clock
// adopts its wall-clock rows; a read-only database from before gc_corrupt
// reads an empty ledger and refuses marks).
//
// # Invariants
//
//   - Liveness is the collector's: this package stores rows, takes locks
//     and carries out a delete's arbitration, and never decides what
//     protects a digest beyond the one rule that an unexpired pin row of
//     any owner, or a row of a table the collector names ([Liveness]:
//     [Links], [LiveTable]), does.
//   - A delete's arbitration is one operation ([Host.Arbitrate]): in one
//     transaction that holds the digests' exclusive lock from before its
//     first read to its commit, it reads every owner's unexpired pin rows,
//     then each Liveness, and deletes the rest's kv rows with the
//     statement the engine gave at open ([SQLiteConfig.BlobDelete],
//     [PostgresConfig.BlobDelete]). The large tier's files and objects,
//     which no rollback restores, go in a second hold that checks again
//     and runs once, alone ([Arbitration.Outside]), after the first
//     committed.
//   - Arbitration lock (see Host): a pin row commits either before an
//     arbitration of its digest takes the lock, and is seen by it, or after
//     that arbitration committed. On SQLite it is the database's write
//     lock (every transaction begins IMMEDIATE, so SQLite is a
//     [SerialHost]); on PostgreSQL a transaction-scoped advisory lock per
//     digest, shared for pin rows and exclusive for arbitration, taken in
//     key order so that nothing deadlocks. Arbitrate takes it before it
//     reads anything.
//   - Joint put: a put hands the kv engine its rows as a value ([Rows]:
//     the pin row, the link or intent), which commit with its entry
//     ([Putter]). On SQLite the engine has [SQLite.WriteRows] write them
//     in the entry's transaction; on PostgreSQL the put batch's one
//     statement carries the pin rows and the intents that replace none
//     ([PGLockShared], [PGBatchPins], [PGPinArgs], [PGBatchIntents]),
//     and [NSRows.WriteTx] writes the rest in the batch's transaction.
//   - A deleted blob's window row leaves with it, in the same statement,
//     on PostgreSQL ([PGWindowGone]); elsewhere the sweep removes it after
//     the delete (Window.WindowRemove).
//   - Close journal (SQLite, journal.go): a put taken by the journal
//     returns once its record (value and rows) is written; the record
//     applies as a job of the Batcher, once, in its segment's order
//     (journal_marks), by this process or, after its death, whoever
//     settles intents next. A record carries its content, so a delete
//     before it applied loses nothing; every read of rows a record writes
//     waits for this process's records first (Batcher.Visible).
//   - Every transaction is ended on every path; on SQLite every write goes
//     through the engine's Batcher, so an arbitration may run again after
//     a shared transaction rolled back: each run decides afresh, and
//     Arbitrate answers the run that committed (its Outside form runs
//     once, alone: Batcher.DoAlone).
//
// # Row times
//
// Every expiry and due time that one process writes and another compares
// — a pin row's expiry, a window row's visible_after, and the namespace
// registry's intents — is taken from one clock that every process sharing
// the table reads, never from the process's own: callers pass durations
// (a TTL, a delay), and this package adds them to the clock's now inside
// the write. Two hosts whose clocks disagree by minutes then agree on
// every row.
//
// On PostgreSQL it is the server's clock, read in the statement itself
// (engines.PGNow), once per statement, so that every row of a renewal or
// a reap is judged at one instant.
//
// On SQLite it is the host's CLOCK_BOOTTIME, which every process of the
// host reads alike and which never jumps, plus an epoch recorded in
// gc_clock by the first process of the boot to open the database
// ([SQLite.RowNow], an engines.RowClock the sqlite engine hands the
// namespace registry). A jump of the wall clock (settimeofday, NTP
// stepping it, a VM restored from a snapshot) does nothing to pin rows,
// window rows or intents: no process reads the wall clock for them once
// the boot's epoch is recorded, so none expires early, none lingers late,
// and two processes whose wall clocks disagree agree on every row. (The
// wall clock still stamps what is meant as wall time: a namespace
// reference's linked_at, a file's mtime on the mount, sweep reports.) The
// boot clock counts suspend: after a host sleeps past a TTL its pin rows
// have expired, and each owner's next renewal finds that and pins afresh
// (gc's lapse), as after any stall longer than the TTL.
//
// At boot the clock restarts, so a process that opens the database under a
// boot id (/proc/sys/kernel/random/boot_id) other than the recorded one
// treats the old boot's rows as what they are — their processes are gone:
// it deletes every pin row, lapses every namespace intent (the next
// Recover settles it), and moves every window row to now plus what was
// left of its delay when the old boot last staged a row (gc_clock.seen),
// so that no candidate waits longer than its window, and none less than
// what it had left. A database from before gc_clock keeps its rows, which
// are on the wall clock, and the first epoch continues that clock. A
// database must therefore be used by one host at a time (SQLite's locks do
// not span hosts anyway): a second host opening it would take the first
// one's rows for a dead boot's. Two containers in different time
// namespaces (CLOCK_BOOTTIME offset) must not share one either.
//
// # The sweep lease
//
// One sweep at a time per pool: on SQLite an flock(2) on DB.gc-lease
// beside the database, which the kernel drops when its holder dies; on
// PostgreSQL a session advisory lock on a connection of its own, outside
// the pool, which the server drops when the session ends — Check reports
// that loss, and the sweeper stops deleting.
//
// # Transactions
//
// A transaction is this package's: the SQLite database's writer, which
// every write transaction of a process on it goes through ([Batcher], a
// group.Commit of transactions: the engine opens it and hands it its
// blob statements as jobs), and the one helper for a transaction of
// one's own ([InTx]). No exported signature outside this package takes
// a *sql.Tx (docs/txsig_test.go): a delete's arbitration is one
// operation of this package ([Host.Arbitrate], which takes the tables
// that protect as [Liveness] values and the large tier's deletes as a
// function of digests), a close's rows cross it as a value ([Rows]), and
// [Host.PinRows] runs in a transaction of its own (a put's pin row is one
// of its [Rows]).
// An engine sees a transaction only as the job it gave the writer, in
// which it has this package write a close's rows ([SQLite.WriteRows],
// [NSRows.WriteTx]).
package meta
