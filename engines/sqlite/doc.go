// Package sqlite is the embedded kv engine: small blobs stored whole in one
// SQLite database file (modernc.org/sqlite, no cgo).
//
// # Schema
//
// The blobs' tables are those of the database's storage layout
// (layout.go), recorded in PRAGMA user_version; a new database gets
// layout 2, one made before keeps layout 1:
//
//	layout 2: blobs(digest BLOB PRIMARY KEY, size INTEGER NOT NULL, vid INTEGER NOT NULL) WITHOUT ROWID
//	          blob_values(vid INTEGER PRIMARY KEY, value BLOB NOT NULL)
//	layout 1: blobs(digest BLOB PRIMARY KEY, size INTEGER NOT NULL, value BLOB NOT NULL) WITHOUT ROWID
//	          blobs_size ON blobs(digest, size)
//
// and in every layout
//
//	gc_window(digest BLOB PRIMARY KEY, visible_after INTEGER NOT NULL) WITHOUT ROWID
//	gc_pins(digest BLOB, owner TEXT, expiry INTEGER, PRIMARY KEY (digest, owner)) WITHOUT ROWID
//	gc_clock(id INTEGER PRIMARY KEY CHECK (id = 1), boot_id TEXT, epoch INTEGER, seen INTEGER)
//
// Has, Size, List and SizeMany read pages of keys and sizes only: layout
// 2's key table, or layout 1's covering index blobs_size rather than its
// table, whose leaf pages hold a few hundred bytes of every value
// (sizeindex.go). visible_after and expiry are unix nanoseconds on the
// row clock.
//
// # Time
//
// Every time in a row that another process compares — a pin row's expiry,
// a window row's visible_after, a namespace intent's expiry — is the row
// clock's ([engines.RowClock]; clock.go): the host's CLOCK_BOOTTIME, which
// every process of the host reads alike and which never jumps, plus an
// epoch recorded in gc_clock by the first process of the boot to open the
// database. Callers pass TTLs and delays; the engine reads the clock inside
// the write transaction.
//
// A jump of the wall clock (settimeofday, NTP stepping it, a VM restored
// from a snapshot with the wall time of its snapshot) does nothing to pin
// rows, window rows or intents: no process reads the wall clock for them
// once the boot's epoch is recorded, so none expires early, none lingers
// late, and two processes whose wall clocks disagree agree on every row.
// (The wall clock still stamps what is meant as wall time: a namespace
// reference's linked_at, a file's mtime on the mount, sweep reports.)
// The boot clock counts suspend: after a host sleeps past a TTL its pin
// rows have expired, and each owner's next renewal finds that and pins
// afresh (gc's lapse), as after any stall longer than the TTL.
//
// At boot the clock restarts, so a process that opens the database under a
// boot id (/proc/sys/kernel/random/boot_id) other than the recorded one
// treats the old boot's rows as what they are — their processes are gone:
// it deletes every pin row, lapses every intent (the next Recover settles
// it), and moves every window row to now plus what was left of its delay
// when the old boot last staged a row, so that no candidate waits longer
// than its window, and none less than what it had left. A database from
// before gc_clock keeps its rows, which are on the wall clock, and the
// first epoch continues that clock. A database must therefore be used by
// one host at a time (SQLite's locks do not span hosts anyway): a second
// host opening it would take the first one's rows for a dead boot's. Two
// containers in different time namespaces (CLOCK_BOOTTIME offset) must not
// share one either.
//
// # Contract
//
//   - Put is insert-or-ignore: inserted is true for exactly one of any
//     number of racing puts of a digest.
//   - Open materializes the value; the cursor reads memory and survives a
//     Delete ([engines.DeleteSafe]).
//   - List pages by key (digest > last LIMIT 1000) and reads each page whole
//     before yielding it, so it holds no connection, cursor or transaction
//     while the caller's loop body runs.
//   - [engines.SQL]: DB is the engine's pool; namespace registries keep
//     their tables in the same file. [engines.TxPutter]: PutTx runs the
//     caller's statements in the insert's transaction.
//   - [engines.WindowHost]: the GC's delete window lives in gc_window and
//     survives restarts; staging a digest that is already staged keeps the
//     existing row.
//
// # Durability
//
// The database runs in WAL mode with synchronous=NORMAL: a commit appends
// its pages to the write-ahead log (kv.db-wal) without syncing it. A
// crash of the process (kill -9) loses nothing committed; a crash of the
// machine never corrupts the file, but loses the commits not yet synced.
// SQLite syncs the log only at a checkpoint (checkpoint.go: every 100 ms
// on a connection of its own while there is log to copy);
// [Engine.Sync] ([engines.Syncer]) fdatasyncs it, which makes every
// earlier commit durable (sync.go says why the log is enough); it touches
// no disk when nothing committed since the last one, and once an
// fdatasync failed every later Sync fails. The store syncs once a second
// while the database is written (store.Config.SyncEvery), at its Close,
// and when asked (Store.Sync, which an fsync(2) in the mount calls), so a
// power loss takes at most the commits of the last second (and of the
// fdatasync under way). Syncing at every commit (synchronous=FULL) would
// cost each close(2) in incoming/ that commits alone an fdatasync, 0.3 to
// 0.5 ms here.
//
// # Concurrency
//
// Connections wait up to 10 s for a lock (busy timeout). Every
// write transaction of the engine, and the registry's puts' links and
// settles, go through one [engines.Batcher], which commits concurrent ones
// in one transaction. Readers run in parallel on the pool's connections;
// writers serialize on SQLite's write lock. Every transaction begins
// IMMEDIATE (_txlock=immediate), taking the write lock up front: a
// deferred transaction that reads and then writes can fail with
// SQLITE_BUSY without waiting when another writer committed in between.
package sqlite
