// Package gc is alkblobfs's garbage collector: pins, liveness sources, the
// protect callback, delete-time arbitration, the delete window and the sweep.
//
// # Invariants
//
// Two properties hold under any interleaving and are asserted by tests:
//
//  1. A visible pool entry is never deleted while liveness protects it:
//     pinned, reported live by a registered Source, or named by the protect
//     callback.
//  2. An in-flight put is never deleted by a sweep that started before it
//     committed. Callers mint the put's Pin before the entry becomes visible
//     (pin-before-publish); arbitration happens at delete time, under the
//     same lock that Pin takes, so a pin is either seen by the arbitration or
//     minted after the delete (and the put then re-inserts).
//
// # Sweep
//
// Sweep runs: protect consult → reap expired pin rows → execute overdue window candidates (each
// re-arbitrated now; a candidate that vanished meanwhile counts as
// cancelled) → mark (a sorted merge of the pool's listing with every
// source's sorted enumeration and the pins: memory does not grow with the
// pool) → queue the dead at visible_after = mark_end + delay, on the window
// host's clock. With a durable window (a SQL gc_window table) the queued
// candidates wait for the next sweep; with the in-process window they are
// executed by this same sweep once the delay has passed on the injected
// Clock.
//
// Executing the window arbitrates candidates in batches under one hold of
// the arbitration lock, with one liveness query per source that can answer
// for many digests (BatchSource) and one delete transaction per engine that
// can take many (BatchPool, engines.BatchDeleter); anything else is asked
// per key.
//
// # Shared state
//
// With a host (meta.Host: the state package meta keeps in the SQL kv
// engine's database), the GC state that other processes and hosts must
// see lives in the pool's database:
//
//   - Pins are rows gc_pins(digest, owner, expiry). An expiry is the host's
//     clock plus the TTL, written and compared by the host (the database
//     server's clock on PostgreSQL, the machine's boot clock on SQLite):
//     the collector passes TTLs, never instants, so no process's clock —
//     wrong by minutes, or jumping — decides whether another's row has
//     expired. The same holds for the durable window's rows and for
//     namespace intents. The first pin of a
//     digest in this collector commits a row (inside the put's own
//     transaction for a kv put; before the commit-rename for a large one)
//     and later pins only count in process. Every TTL/3 one tick drops
//     the rows whose last pin was released and renews the rest in one
//     statement for the owner; an expired row is never renewed back to
//     life. Close deletes the owner's rows.
//   - A delete is arbitrated by one operation of the host
//     (meta.Host.Arbitrate), one transaction that holds the digests'
//     arbitration lock — SQLite's write lock, or a PostgreSQL advisory lock
//     per digest that pin writes take in shared mode — and reads every
//     owner's unexpired rows and the table of every SharedSource
//     (namespace links, liveness Tables) before deleting the kv rows in
//     the transaction. No transaction reaches this package. Large-tier
//     files and objects, which no rollback brings back, go once that has
//     committed, in a second hold of the lock, alone and once
//     (meta.Arbitration.Outside, through the pool's OutsidePool), that
//     checks them again. A pin, link or put committed by any process is
//     seen, or ordered after the delete (and then re-puts the content).
//   - The sweep lease is the host's (an flock beside the SQLite database,
//     a PostgreSQL session advisory lock), held for one sweep and checked
//     before each delete batch; contention is an AbortSweeperLock report,
//     a lost lease an error.
//
// Without a host (mem stores) all of it is in-process.
//
// Direct deletes need a liveness source: with none registered nothing can
// be proven unreferenced, so Delete refuses (ForceDelete overrides).
//
// Deliberate no-ops are report data ([Report.Aborted]), never errors: no
// source registered, another sweep running, protect failed. An abort deletes
// nothing. Sweep's error is for operational failure only.
package gc
