package engines

// Row times: every expiry and due time that one process writes into a
// shared table and another compares — pin rows and the delete window
// (package meta), namespace intents — is taken from one clock that every
// process sharing the table reads, never from the process's own: callers
// pass durations (a TTL, a delay), and the engine adds them to its now.
// Two hosts whose clocks disagree by minutes then agree on every row; a
// process's clock decides nothing about another process's rows.
//
//   - PostgreSQL: the server's clock, read in the statement itself
//     (PGNow).
//   - SQLite: the host's boot clock (CLOCK_BOOTTIME, which every process
//     on the host shares and which never jumps) from an epoch recorded in
//     the database for the boot (meta's gc_clock); the engine binds it
//     (RowClock).
//
// Times are stored as unix nanoseconds (BIGINT, INTEGER) either way.

// PGNow is the PostgreSQL server's clock in unix nanoseconds, as an SQL
// expression: clock_timestamp() — the time the expression is evaluated,
// not the start of its transaction, which may be long past — to the
// microsecond, its precision. A statement that compares more than one row
// reads it once, as (SELECT PGNow), so that every row is judged at one
// instant.
const PGNow = `(floor(extract(epoch from clock_timestamp()) * 1000000)::bigint * 1000)`

// RowClock is implemented by SQL engines whose row times the process
// computes and binds rather than the server (SQLite: every process is on
// one host). Tables other packages keep in the engine's database (the
// namespace registry's intents) are timed by it.
type RowClock interface {
	// RowNow is the engine's clock now, in unix nanoseconds.
	RowNow() int64
}
