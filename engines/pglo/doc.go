// Package pglo is the PostgreSQL large-object engine for the large tier:
// each blob is one large object, named by a companion row.
//
// # Schema
//
//	pglo_blobs(digest BYTEA PRIMARY KEY, oid OID NOT NULL UNIQUE, size BIGINT NOT NULL, sums BYTEA)
//
// and, opened through package meta (which owns it), the delete window
// gc_window.
//
// sums is the store's per-chunk checksum sidecar ([engines.SidecarStage],
// [engines.SidecarReader]); NULL reads as blob.ErrMissing.
//
// # Contract
//
//   - A Stage is one transaction: lo_from_bytea creates the object with the
//     first 512 KiB, lo_put appends each further 512 KiB, and Commit inserts
//     the companion row (ON CONFLICT DO NOTHING) and commits. If the digest
//     is present already, Commit rolls back instead, and the new object
//     vanishes with the transaction (dedup). Discard, a failed write or a
//     failed Commit roll back too: a stage never leaves an orphan object.
//     The transaction (and its pooled connection) is taken at the first
//     full chunk, so a stage of under 512 KiB holds nothing until Commit.
//   - StageResidue ([engines.ResidueCounter]) counts the stages open in this
//     process plus the large objects no companion row owns (other
//     applications' objects in the same database count too).
//   - Open reads the companion row (oid, size): Len and Size are metadata.
//     The cursor then reads windows of 512 KiB with SELECT lo_get(oid, off,
//     len) — no transaction or descriptor held between reads — and keeps the
//     last window, so small sequential reads cost one statement per window;
//     reads of a window or more go straight into the caller's buffer.
//     Cursors do not survive Delete: a read after it returns an error
//     wrapping blob.ErrMissing.
//   - Delete removes the row and unlinks the object in one transaction.
//   - List pages the companion table by key, holding nothing between pages.
//   - [meta.Holder]: the delete window (a [meta.PGWindow]) in the same
//     database. The store uses one window per instance: the kv engine's
//     when it keeps one, so with kv=postgres this one stays dormant, and
//     with kv=mem it is the durable window.
//
// Open takes a DSN and owns its pool (see package postgres for connection
// handling, failures and restarts); OpenPool borrows one.
package pglo
