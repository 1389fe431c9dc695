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
// Has, Size, List and SizeMany read pages of keys and sizes only: layout
// 2's key table, or layout 1's covering index blobs_size rather than its
// table, whose leaf pages hold a few hundred bytes of every value
// (sizeindex.go).
//
// Open then opens the pool's shared GC state in the same file through
// package meta, which owns its tables (gc_pins, gc_window, gc_clock,
// gc_corrupt), their statements, the sweep lease (a file beside the
// database, DB.gc-lease) and the row clock ([meta.SQLite], [meta.Holder];
// meta's doc says what the clock does at a reboot or a jump of the wall
// clock). [Engine.RowNow] is that clock ([engines.RowClock]), for the
// namespace registry's intents. Every write of the state goes through the
// engine's Batcher, as the engine's own do.
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
//     their tables in the same file. [meta.Putter]: PutRows has meta
//     write a put's rows (its pin row, its link or intent) in the
//     insert's transaction, a job of the group commit (meta.Batcher).
//   - A delete's arbitration is meta's (meta.Host.Arbitrate): Open gives
//     it the engine's blob delete statement (meta.SQLiteConfig.BlobDelete),
//     which meta runs in the arbitration's transaction, and DeleteMany
//     is meta's loop of it too (meta.SQLite.DeleteBlobs).
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
// settles, go through one [meta.Batcher], which commits concurrent ones
// in one transaction. Readers run in parallel on the pool's connections;
// writers serialize on SQLite's write lock. Every transaction begins
// IMMEDIATE (_txlock=immediate), taking the write lock up front: a
// deferred transaction that reads and then writes can fail with
// SQLITE_BUSY without waiting when another writer committed in between.
package sqlite
