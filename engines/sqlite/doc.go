// Package sqlite is the embedded kv engine: small blobs stored whole in one
// SQLite database file (modernc.org/sqlite, no cgo).
//
// # Schema
//
//	blobs(digest BLOB PRIMARY KEY, size INTEGER NOT NULL, value BLOB NOT NULL) WITHOUT ROWID
//	gc_window(digest BLOB PRIMARY KEY, visible_after INTEGER NOT NULL) WITHOUT ROWID
//
// size precedes value in the record, so Size and List read the size column
// without touching the value's overflow pages. visible_after is unix
// nanoseconds.
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
// SQLite syncs the log only at a checkpoint (every 1000 pages of log);
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
