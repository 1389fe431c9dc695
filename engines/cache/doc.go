// Package cache is a bounded local disk cache in front of a remote large
// tier (engines/s3, engines/pglo): a decorator of engines.Large, so that
// the store — and through it every surface, the mount, serve and the CLI —
// reads through it without knowing it is there.
//
// # Layout
//
// The cache directory is a local tier (engines/local) plus two files:
//
//	DIR/blobs/ab/abcdef…   a cached blob, named by its digest, mode 0444
//	DIR/sums/ab/abcdef…    its chunk checksums (the remote's sidecar, copied)
//	DIR/stage/stage-DIGEST a fill in flight, flocked by its process: the
//	                       host's claim on the blob's fill (claim.go)
//	DIR/index.db           SQLite (WAL): one row per copy (size, last
//	                       access) and the host's counters
//	DIR/lock               flock: shared by publishes and evictions,
//	                       exclusive for the rebuild at open
//
// A hit is the local tier's file cursor (an engines.FileCursor), so the
// store judges it as it judges a local blob: passthrough in
// --verify=publish, and in --verify=full once this process knows the file
// good as it is now — a reader of it checked every chunk, or this
// process's fill published it (below); a file whose identity changed is
// verified again first (store/verdicts.go).
//
// # Fill on read
//
// A miss opens the remote cursor and starts a fill (fill.go): Parallel
// workers (4) fetch Segment-sized (16 MiB) ranges — each one S3 ranged GET
// or a run of pglo lo_get windows — and write them into a stage file; a
// reader is served from the stage for a segment already written, waits
// for one being fetched, and fetches one nobody has started itself, so its
// first byte never waits for the whole blob. Readers of the blob in this
// process join the fill in flight (one fill, the blob's bytes fetched
// once). The store still checks every chunk a reader is given against the
// chunk checksums (store/verify.go), as it does without a cache. The
// fill's hasher reads the segments back in order and the stage is
// published (engines/local's Link: fsync, a link that never replaces,
// then the stage's name removed) only when the whole blob hashed to its
// digest; any failure drops the stage and the readers go on from the
// remote tier. A fill that published its own stage tells the store
// (OnVerified) the identity of the file it hashed, taken after the link
// and the unlink and compared with the file the name now leads to: the
// store records it known good, so --verify=full passes the copy through
// from its next open. A copy found there instead (another process's
// write-through won the link) is not vouched for: it is verified at its
// first read, as any file this process did not check.
//
// The stage's flock is the host's claim on the blob's fill: a process
// that misses a blob whose stage another process holds does not fetch it
// too; it waits, polling the lock, while that stage grows, then opens the
// published copy. If the filler dies (the kernel drops its lock) or gives
// up, the waiter takes the claim and fills; if the stage does not grow
// for Options.FillWait (10 s) — the filler is stopped or stuck — the
// waiter reads from the remote tier without filling (fill error "busy").
// A waiter's open blocks meanwhile: one fetch of the blob per host is
// worth more than the second process's first byte.
//
// # Bound and policy
//
// Before a fill, least recently accessed copies are evicted until the
// blob fits both Limit (the index's total plus the fills in flight on the
// host, in every process) and the filesystem's free space less 1/50 of it
// and less what those fills have yet to write: the cache never fills its
// disk. A claim sizes its stage to the blob's size at once (a sparse
// file), so the fills in flight are the stage files whose lock a live
// process holds: their sizes, and their holes for the disk (claim.go:
// inFlight, one read of DIR/stage per fill). LRU by last open: a content-addressed blob never goes
// stale, so recency is the only signal, and the workloads the cache serves
// (build outputs, datasets, images) re-read their recent working set; a
// frequency policy (LFU, ARC) would keep last month's hot blobs over
// today's. A copy open in any process of the host is never evicted: every
// hit cursor holds a shared flock on its descriptor and eviction takes an
// exclusive one without waiting; a blob being filled is not in blobs/ yet.
// Eviction and "cache drop" skip those. A fill that finds no room, or a
// disk that is full anyway (ENOSPC creating or writing the stage), gives
// the fill up with a log line and a counter; the read goes on from the
// remote tier.
//
// Access times are kept as precisely as eviction needs, not per open: a
// hit notes its time in memory, and the process writes its notes into
// the index in one transaction every 2 s (with the counters), at close,
// and before each of its evictions. A row is written only if its
// recorded access is older than 1/8 of the cache's horizon (the age of
// its oldest copy) before the new one. So a copy's recorded access lags
// its last open by at most 2 s (for another process's eviction; none for
// this process's) plus 1/8 of the horizon: eviction is LRU except among
// copies opened within that margin of each other, and the oldest copy,
// opened, always moves to the newest end. A copy opened over and over
// costs one write per eighth of the horizon, not one per open.
//
// # Shared by the processes of a host
//
// Every process that opens the same directory shares its files and one
// bound through index.db: a row is added in the publish and removed with
// the file, so the total is SUM(size) with no double counting, and
// eviction picks the oldest row whoever filled it. The alternative, flock
// and a directory scan per fill, costs time in proportion to the cache's
// files at every fill; the index costs a short SQLite write per fill and
// one batched transaction per process every 2 s for the opens (above).
// Counters are added to the index every 2 s and at close (cache stat sums
// the host's processes). A fill is claimed for the whole host (Fill on
// read): two processes missing one blob fetch it once.
//
// # Restarts
//
// Open removes stage files no live process holds locked (a fill cut by
// kill -9, engines/local), then reconciles the index with blobs/ in one
// merge of two digest-ordered listings: time in proportion to the number
// of files, not their bytes (a million files is a million directory
// entries read, seconds), and one transaction for what differs.
//
// # Corruption and deletes
//
// A cached copy whose chunk fails its checksum is never served: the
// store's reader asks the cursor to Refetch (engines.Refetcher), which
// drops the copy and serves the rest from the remote tier, filling the
// cache again; the failed read is retried once. Scrubs read the remote tier
// itself (engines.Direct), so a bad copy on one host never marks the blob
// corrupt in the shared ledger. A Delete (a sweep) deletes from the remote
// tier, then this host's copy. Other hosts' copies of a deleted blob are
// garbage only: namespaces decide lookups, so no path leads to them once
// no namespace links the blob, and they go by LRU eviction (they are never
// opened again, so they are the oldest). Has asks the remote tier, never
// the copy: a copy does not prove the pool still holds the blob. Size is
// answered locally when it can be (see Sizes).
//
// # Puts (write-through)
//
// Puts go to the remote tier's stage, unchanged. An upload (the mount's
// incoming/ files) past the kv threshold is written to a scratch file,
// which the cache makes (NewScratch, scratch.go) nameless with O_TMPFILE
// in ScratchDir (DIR/stage, on the cache's filesystem); the store streams
// it to the remote, hashing it and computing its chunk checksums on the
// way. Once the remote has committed the blob, Adopt links that very file
// into blobs/ (local.Engine.Link: linkat of /proc/self/fd/N, no byte
// copied) with the checksums as its sidecar, after evicting for its size
// (the bytes are on the disk already: only the limit binds). The cache's
// disk is sized for the cache, not for the largest put: when it fills
// while an upload is written (ENOSPC, EDQUOT), the scratch file moves,
// with what it holds (holes kept), to the store's scratch directory
// (--scratch) and the write is done there; the put goes on, is logged and
// counted (fill error "put_nospace"), and is not written through. A
// streamed put (store.Put) has no local file and is cached at its first
// read, as is a put that does not fit, moved off the cache's disk, or
// whose scratch file cannot be linked. See store/put_cache.go.
//
// # Memory
//
// A fill holds Parallel segment buffers (4 × 16 MiB) while its workers
// fetch, and its hasher reads the stage back through 1 MiB: the daemon's
// memory grows with the fills in flight, never with a blob's size or the
// cache's (the index is on disk; the notes of opens are one entry per
// copy opened in the last 2 s).
//
// # Sizes
//
// Size answers from the copy, else from the sizes the remote gave this
// host before (index.db's sizes table, one row per blob seen, removed by
// this host's Delete), else asks the remote and records the answer:
// ls -l and stat of a blob the host knows never reach the remote.
// Root is the cache directory (engines.StatFS), so the mount probes it for
// passthrough.
package cache
