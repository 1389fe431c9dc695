// Package enginetest is the conformance suite every engine runs, in one line
// from its own test file:
//
//	func TestEngine(t *testing.T) {
//		enginetest.Run(t, func(t *testing.T) engines.Engine { return mem.New() })
//	}
//
// Run opens a fresh engine per subtest and closes it when the subtest ends;
// open must return an empty engine and must not close it itself.
//
// What is checked depends on what the engine is:
//
//   - every engine: Has/Size/Open/Delete, missing keys (blob.ErrMissing),
//     io.ReaderAt semantics of cursors, List order, resume, early stop,
//     cancellation, paging (a 10 000-entry listing must not grow the heap
//     by what materializing it would take), deleting from inside a listing
//     loop, concurrent use;
//   - [engines.KV]: Put dedup (insert-or-ignore), racing puts of one digest;
//   - [engines.Large]: every Stage path — commit, dedup commit, discard
//     before/after/twice, abandoned writers, canceled commits, use after the
//     end, racing stages of one digest — each followed by an exact count of
//     stage residue, so a Large engine must implement
//     [engines.ResidueCounter];
//   - [engines.RandomStage], [engines.FileCursor], [engines.DeleteSafe]
//     and [engines.SQL]: their extra contracts, when the engine (or its
//     stage or cursor) implements them.
//
// The shared GC state an engine opens (pin rows, arbitration, the sweep
// lease, the delete window, the corrupt ledger) is package meta's, and its
// suite is meta/metatest, which meta's tests run against every dialect.
//
// Tests use t.Context(). A possible deadlock is detected with a deadline.
package enginetest
