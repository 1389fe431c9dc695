// Package s3 is the large-tier engine over an S3-compatible object store
// (AWS S3, MinIO, Ceph RGW, SeaweedFS, Garage, versitygw, …), through
// minio-go.
//
// # URL and credentials
//
//	s3://BUCKET/PREFIX?endpoint=HOST:PORT&region=REGION&tls=true|false
//
// endpoint is required; region defaults to asking the server; tls to
// true. Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
// (and AWS_SESSION_TOKEN), else the AWS credentials file (AWS_PROFILE,
// AWS_SHARED_CREDENTIALS_FILE); a URL with credentials in it is refused.
// The bucket must exist.
//
// # Layout
//
//	PREFIX/ab/abcdef…         a blob, named by its 64-hex digest, sharded
//	                          by its first two hex digits
//	PREFIX/sums/ab/abcdef…    its per-chunk checksum sidecar
//	PREFIX/stage/TIME-RANDOM  a staged put's object (multipart upload,
//	                          then a completed object until Commit copies it)
//
// "stage" and "sums" sort after every shard ("s" > "f"), so a listing of
// blobs ends before them.
//
// # Contract
//
//   - Stage buffers writes into parts of 8 MiB (PartSize). A blob that never
//     fills one is a single PUT at Commit, straight to its key. Otherwise the
//     first full part starts a multipart upload to a staging key, and parts
//     upload in the background, two at a time, while the next fills: a
//     stage holds at most three part buffers (24 MiB), whatever the blob's
//     size. Parts grow by one PartSize every 1000 parts, so S3's 10 000
//     parts hold 430 GiB at the default (a stage then holds at most 3×80
//     MiB).
//   - Commit publishes under the digest only a complete blob: HEAD the key
//     first (present: the stage is dropped, dedup); else complete the
//     upload (the staging object appears), write the sidecar, server-side
//     copy the staging object to the blob's key (CopyObject; UploadPartCopy
//     in 5 GiB parts above 5 GiB), and delete the staging object. Small
//     blobs are one PUT with If-None-Match: *, so that a racing put of the
//     same digest does not replace the first (servers that ignore the
//     header still have the HEAD).
//   - Cost of that choice: a blob over one part is written twice on the
//     server (the upload, then the copy) and costs a COPY and a DELETE
//     request more than a plain upload; the copy takes server time in
//     proportion to the size, but no client bandwidth, local disk or
//     memory. The alternative, spooling to a local scratch file and
//     uploading under the known key, costs a local write and read of every
//     blob and scratch space as large as the largest blob.
//   - Every failure path aborts the multipart upload or deletes the staging
//     object. If the server cannot be reached to do so, the leftover stays
//     under PREFIX/stage/ (or as an incomplete upload), counted by
//     StageResidue, until an Open finds it older than StaleAfter (a day)
//     and removes it, with a log line.
//   - Open is a HEAD (Len), then a cursor of ranged GETs. Small reads are
//     served from windows: 1 MiB for a read out of sequence; sequential
//     reads fetch the next window in the background, doubling up to 16 MiB.
//     Reads of 16 MiB or more go straight into the caller's buffer.
//   - Cursors do not survive Delete (not [engines.DeleteSafe]): a GET after
//     it fails with an error wrapping blob.ErrMissing. The store's pins
//     keep a mount's open files from being deleted, so this reaches only
//     readers outside the store's GC.
//   - Size and Has are HEADs. Delete is a HEAD (S3's DELETE does not say
//     whether the key existed), the DELETE, and the sidecar's DELETE.
//   - List is ListObjectsV2 pages of 1000 keys from after's key on, in key
//     order, which is digest order. Keys under the prefix that are not
//     blobs are skipped and logged.
//   - StageResidue ([engines.ResidueCounter]) counts the stages live in
//     this process plus the staging objects and incomplete multipart
//     uploads under the prefix that none of them owns (other processes'
//     live stages included).
//   - SharedMedium reports true: every host that opens the same URL sees the
//     same blobs, so a fleet needs no --shared-media declaration.
//
// # Retries and timeouts
//
// minio-go retries 5xx answers, throttling codes and connection errors
// with jittered exponential backoff (200 ms doubling to a 1 s cap), at most
// MaxRetries (5) attempts per request; a GET whose body breaks midway is
// tried again up to 3 times. Each request has a deadline: a minute for
// HEAD, DELETE and a list page, ten minutes for a part or a window, two
// hours for the copy at Commit. An error after the retries names the
// request, the key and the endpoint, wrapped by blob.Wrap with the
// engine's name; the mount answers it with EIO and logs it.
package s3
