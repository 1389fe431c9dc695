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
// Sweep runs: protect consult → execute overdue window candidates (each
// re-arbitrated now; a candidate that vanished meanwhile counts as
// cancelled) → mark (a sorted merge of the pool's listing with every
// source's sorted enumeration and the pins: memory does not grow with the
// pool) → stage the dead at visible_after = mark_end + delay. With a durable
// window (a SQL gc_window table) the staged candidates wait for the next
// sweep; with the in-process window they are executed by this same sweep
// once the delay has passed on the injected Clock.
//
// Executing the window arbitrates candidates in batches under one hold of
// the arbitration lock, with one liveness query per source that can answer
// for many digests (BatchSource) and one delete transaction per engine that
// can take many (BatchPool, engines.BatchDeleter); anything else is asked
// per key.
//
// Deliberate no-ops are report data ([Report.Aborted]), never errors: no
// source registered, another sweep running, protect failed. An abort deletes
// nothing. Sweep's error is for operational failure only.
package gc
