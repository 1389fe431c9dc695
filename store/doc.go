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
// goes and fails at EOF with ErrVerification on mismatch; range reads of a
// large blob check the 64 KiB chunks they touch against checksums recorded
// at publish (sums.go), and a blob without them is hashed whole before its
// first byte is served (verify.go).
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
// ErrVerification, ErrTooLarge, ErrGcRefuse); match them with errors.Is.
// Get and Stat report a miss as ok=false, not as an error; ReadRange and
// Delete return ErrMissing.
package store
