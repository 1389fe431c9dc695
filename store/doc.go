// Package store is the facade of alkblobfs: a content-addressed pool of
// blobs over two tiers, with garbage collection.
//
// Small blobs (≤ Threshold, default 128 KiB) live whole in a kv engine; large
// blobs stream through a large engine's staged put. Every key-addressed
// operation (Get, Stat, Has, ReadRange, Delete) falls through: kv tier first,
// then the large tier.
//
// # Puts
//
// A put hashes the content as it flows, mints its Pin before the entry
// becomes visible (pin-before-publish, so no sweep can delete an in-flight
// put), then publishes. A re-put of present content writes nothing and still
// returns a pin. Every error path leaves nothing behind: no entry, no stage
// residue, no leaked pin.
//
// # Reads
//
// Wrong bytes are never returned as good. kv blobs are verified when
// materialized. A Reader streaming a large blob from 0 to EOF hashes as it
// goes and fails at EOF with ErrVerification on mismatch, and, as range
// reads of a large blob do, checks each 64 KiB chunk against the checksums
// recorded at publish (sums.go) before handing out a byte of it; a blob
// without them is hashed whole before its first byte is served
// (verify.go), as is one whose checksums alone are damaged.
//
// # Verification memory
//
// The store remembers what end-to-end checks found (verdicts.go), so that
// every surface — the mount, serve's HTTP, the CLI — keeps one rule: a
// blob a scrub found corrupt is refused at Get, with an error wrapping
// ErrCorrupt (and ErrVerification) that names the digest, before a byte is
// served. The corrupt verdict is durable and shared: it is recorded in the
// kv engine's meta.Ledger, gc_corrupt beside the GC's pin rows,
// which every process and fleet host that opens the pool already reads —
// so a scrub in a mount, in serve or in alkblobfs verify protects all of
// them, with no daemon to ask. (Stores without such a kv engine keep it in
// the process, as they keep pins.) The verdict is about one version of the
// blob's file (device, inode, size, times): a changed file makes it
// suspect, served verified only (no passthrough, no Trust), until a reader
// that checked every byte or a scrub finds it good, which clears it. A put
// of the right content repairs it: it replaces the corrupt copy, where a
// put of present content otherwise writes nothing. Good verdicts stay in
// the process: they only let a local blob pass through (Reader.Passthrough)
// in --verify=full.
//
// # Capabilities
//
// The facade never hands out an engine, the collector or a cursor. What
// the surfaces need of them is a method here: Reader.Passthrough (the
// backing file the kernel may read directly), StatFS (the large tier's
// filesystem, for df), TierSizes (for metrics), Register, SetProtect,
// PinTTL and LastReport (the collector's), EngineNames (for messages); the
// collector's types are re-exported (Report, Source, Registration, Clock).
//
// # Uploads
//
// NewUpload is the put for content written at random offsets (the mount's
// incoming/ files): in memory while it fits the kv tier, then in a stage
// that Commit publishes in place (a rename on the local engine).
//
// # Errors
//
// Sentinels are re-exported from package blob (ErrMissing, ErrKeyInvalid,
// ErrVerification, ErrTooLarge, ErrGcRefuse, ErrCorrupt, ErrLost); match
// them with errors.Is. Get and Stat report a miss as ok=false, not as an
// error, unless a namespace links the digest: then it is lost (lost.go)
// and the error wraps ErrLost; ReadRange and Delete return ErrMissing.
package store
