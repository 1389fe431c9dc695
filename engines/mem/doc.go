// Package mem is an in-memory engine. It serves as either tier: it is an
// [engines.KV] (whole-value Put) and an [engines.Large] (staged puts with
// random access, [engines.RandomStage]), so a store can run entirely in
// memory ("mem-only" mode) and the other packages' tests can use it without a
// disk.
//
// # Contract
//
//   - Values are copied on the way in (Put, Stage writes) and on the way out
//     (cursor ReadAt); callers may reuse their buffers.
//   - A cursor keeps reading the value it opened after a Delete of its digest
//     ([engines.DeleteSafe]).
//   - List pages through the keys: each page scans the map under a read
//     lock and keeps only the page's worth of smallest keys, so a listing
//     holds one page of entries, never the whole key set, and no lock
//     between pages or yields. The page grows with the map (1/64 of it, at
//     least 1000 entries) so a full listing takes at most ~64 scans.
//   - StageResidue ([engines.ResidueCounter]) counts stages that are neither
//     committed nor discarded.
//   - A stage holds at most [MaxStageSize] bytes; writing past it fails with
//     an error wrapping blob.ErrTooLarge rather than exhausting memory.
//   - After Close every method returns an error wrapping blob.ErrClosed.
//
// Nothing is durable: the pool disappears with the process. Its part of
// the shared GC state ([meta.Holder]) is the corrupt ledger alone, a
// [meta.MemLedger] in the process that outlives Close; a mem store's pins,
// arbitration and window are the collector's, in the process.
package mem
