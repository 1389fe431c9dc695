// Package postgres is the PostgreSQL kv engine: small blobs stored whole in
// one table, over a pgx/v5 pool. It also holds what both PostgreSQL engines
// share: [Connect], schema creation and keyset listing; engines/pglo
// builds on them.
//
// # Schema
//
//	blobs(digest BYTEA PRIMARY KEY, size BIGINT NOT NULL, value BYTEA NOT NULL)
//
// The table is created at Open (IF NOT EXISTS, under an advisory lock so
// that engines opening one database at once do not collide). Open then
// opens the pool's shared GC state in the same database through package
// meta, which owns its tables (gc_pins, gc_window, gc_corrupt), their
// statements and the sweep lease ([meta.Postgres], [meta.Holder]).
//
// # Contract
//
//   - Put is INSERT … ON CONFLICT (digest) DO NOTHING: inserted is true for
//     exactly one of any number of racing puts of a digest.
//   - Size and List read the size column only; Open materializes the value
//     and the cursor survives a Delete ([engines.DeleteSafe]).
//   - List pages by key (digest > last LIMIT 1000) and reads each page whole
//     before yielding it: no connection, cursor or transaction is held
//     while the caller's loop body runs.
//   - [engines.SQL]: DB is a database/sql handle over the same pool
//     (pgx stdlib), for namespace registries. [meta.Putter]: PutRows
//     commits a put's rows (its pin row, its link or intent) with its
//     entry, in a batch that concurrent puts share (group commit: one
//     statement takes the arbitration locks, writes the pin rows and
//     intents and inserts the blobs of every put of it; see putGroup).
//     The lock, the pin rows and the intents of that statement are meta's
//     fragments ([meta.PGLockShared], [meta.PGBatchPins],
//     [meta.PGBatchIntents]); a batch whose puts have rows the statement
//     cannot carry (a link, an intent that replaces another) writes those
//     with meta ([meta.NSRows.WriteTx]) in the batch's transaction.
//   - A delete's arbitration is meta's ([meta.Host.Arbitrate]): Open
//     gives it the engine's blob delete statement
//     ([meta.PostgresConfig.BlobDelete]), which meta runs in the
//     arbitration's transaction with the deleted blobs' window rows in
//     the same statement ([meta.PGWindowGone]); DeleteMany runs the same
//     statement, built once, through meta ([meta.Postgres.DeleteBlobs]).
//
// # Connections and failures
//
// Open parses the DSN (a postgres:// URL or a libpq key=value string) and
// pings the server, so a wrong DSN or an unreachable server fails at once
// with one line naming user@host:port/database — never the password. The
// pool holds up to max(16, 4×GOMAXPROCS) connections unless the DSN says
// pool_max_conns, and closes idle ones after 5 minutes.
//
// When the server restarts, operations in flight fail with the server's
// error (e.g. SQLSTATE 57P01) wrapped with the operation, engine and digest;
// their transactions roll back, so nothing half-written is visible. The
// pool then drops the dead connections before reusing them: a connection
// idle over a second is pinged (pgxpool's rule), and one the server wrote
// to while it sat idle — the "terminating connection" message and EOF a
// restart leaves — is pinged too, found dead and replaced. The next
// operation succeeds on the same engine; nothing needs reopening.
//
// A server that goes silent instead (a partition, a dropping firewall) is
// bounded too: every statement and connect on a connection of [Connect]'s
// pool, or of a connection made from its config, fails with a
// *[TimeoutError] once the server has sent nothing for the op timeout
// ([DefaultOpTimeout], or the DSN's alkblobfs_op_timeout) while it waits,
// and the pool drops the connections older than that failure. TCP
// keepalives run on both ends, so that a dead peer is noticed under an
// idle connection, and the server ends a vanished client's session
// (rolling back its transaction, dropping its locks) within about 25 s.
// docs/fleet.md states what a fleet host promises under these bounds.
package postgres
