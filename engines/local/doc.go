// Package local is the large-tier engine over a local directory: one file
// per blob, published by rename.
//
// # Layout
//
//	dir/blobs/ab/abcdef…   a blob, named by its 64-hex digest, sharded by the
//	                       first two hex digits, mode 0444
//	dir/stage/stage-*      puts in progress (same filesystem, so publishing
//	                       is a rename)
//
// # Contract
//
//   - Stage creates a stage file; it is an [engines.RandomStage] (writes at
//     any offset, sparse holes read as zeros, truncation). Commit fsyncs the
//     file, makes it read-only and renames it into its shard without ever
//     replacing an existing blob (RENAME_NOREPLACE, else link+unlink), then
//     fsyncs the shard directory. If the blob exists — before or during the
//     rename — the stage is dropped (dedup). Commit and Discard both end the
//     stage; a failed Commit has already removed the stage file.
//   - Open returns an [engines.FileCursor]: pread on the blob file, whose
//     descriptor the mount may pass through. A cursor stays readable after
//     Delete unlinks the file ([engines.DeleteSafe]).
//   - Size and Has stat the file; they never read it.
//   - List walks shards 00..ff, reading and sorting one shard directory at a
//     time. Files that are not blobs (wrong name, wrong shard, not regular)
//     are skipped and logged once.
//   - Open removes stage files a crashed process left behind and logs one
//     line with the count. A live stage holds an exclusive flock on its file,
//     so a second process opening the same directory (a CLI next to the
//     mount) leaves it alone.
//   - StageResidue ([engines.ResidueCounter]) counts the files in the stage
//     directory; Root ([engines.StatFS]) is dir.
//   - Close releases nothing: the engine holds no descriptor between calls.
//
// Errors are wrapped with blob.Wrap; a missing file is blob.ErrMissing.
package local
