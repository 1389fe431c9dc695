// Package fusefs is the alkblobfs mount: a go-fuse (fs API) node tree over
// the store facade and the namespaces registry (docs/mount.md shows the tree).
//
//	/                      rootDir   namespaces (from the registry) + .alkblobfs/
//	/<ns>/                 nsDir     digests, listed a page at a time + incoming/
//	/<ns>/<digest>         blobFile  read-only; one inode per digest
//	/<ns>/incoming/...     incDir, fileNode, symNode   in memory; uploads and receipts
//	/.alkblobfs/           ctlDir, ctlFile             sweep, sweep-timer, stats
//
// Mount mounts a Config (store, registry, options) and returns a Server;
// cmd/alkblobfs's mount command is a thin shell around it.
//
// # Attributes
//
// Every node fills its whole mode (type, permission, set-id and sticky
// bits), owner and group in Getattr and in the entries of Lookup, Create,
// Mkdir, Symlink, Link and READDIRPLUS; go-fuse adds nothing
// (NullPermissions), so a mode of 0 shows as 0 and the kernel's
// default_permissions checks what the registry and the incoming/ metadata
// record (TestModesShown).
//
// # Caching
//
// Blob files are immutable, so the kernel may keep everything about them:
// an hour of entry and attribute timeout, FOPEN_KEEP_CACHE on opens served
// by the daemon, kernel readahead raised to 1 MiB (the mount's max_read and
// max_write are 1 MiB too). A name a publish adds needs no announcement:
// lookups of absent names are never cached (no negative entries). Names
// that go away outside a kernel request are announced with NotifyEntry only
// where a cached entry would lie for long: a put by path's name, and the
// changes other hosts of a fleet make (watch.go: from one goroutine fed by
// the registry's change feed, never from a request). That is kept off the hot
// paths on purpose: the kernel takes the directory's lock to invalidate,
// and a LOOKUP that holds it may be waiting on the daemon; a daemon killed
// while a thread waits there cannot exit, and its mount hangs. Expired
// receipts and swept ones simply leave the tree; incoming/ entries live a
// second in the kernel's cache. Directories and incoming/ files keep the
// one-second default; the kernel does not auto-invalidate data on mtime
// changes (ExplicitDataCacheControl), since content changes only through
// this mount's own writes.
//
// Local large blobs are served by FUSE passthrough where the kernel offers
// it: the kernel reads the blob's file directly. A probe at mount (go-fuse
// would otherwise turn passthrough off silently on the first failed
// registration) decides, logs, and shows in stats. In --verify=full only a
// blob verified end to end (by an earlier read through the daemon, or a
// scrub) passes through, and only while its file keeps the identity it had
// then (the store's verification memory: store.Reader.Passthrough); a
// changed file is verified again; --verify=publish passes through from the
// first open, and --verify=strict never (seqCheck adds the sha256 of a
// handle's whole read). A blob a scrub (in any process) found corrupt is
// EIO at open, as the store refuses it, until it is repaired. The kernel refuses to mix passthrough and
// page-cached opens on one inode, so a new open takes the mode of the
// opens already there. The writeback cache
// would pipeline writes into incoming/, but the kernel refuses passthrough
// with it, so it stays off.
//
// # Errors
//
// Node methods produce Go errors (store and namespace sentinels, or this
// package's policy errors such as errReadOnly) and convert them in one
// place, toErrno, which is the errno table of docs/errors.md as code and is
// table-tested. (*FS).errno wraps it: whatever maps to EIO is logged with
// the operation, digest and engine message first. Unknown errors are EIO,
// never ENOSYS (which would switch the operation off for the whole mount).
// A read that fails verification is EIO and a log line naming the digest
// and offset; wrong bytes are never served through the daemon in
// --verify=full or strict.
//
// # Write path
//
// Every file created under incoming/ is a store Upload: random-access
// writes, truncation, reads back. When it publishes (a FLUSH stores the
// content and records a pending link, namespaces.Intent; the last RELEASE
// links it) is docs/publish.md, with the test behind each rule; publish.go
// decides it as a pure function of the file's state, and its doc is the
// state table.
//
// After publish the name stays as a receipt: same size and content
// (served from the store), the digest in xattr user.alkblobfs.digest, and
// chmod/chown/utimes kept in memory so that cp -a, tar and a second rsync
// pass are satisfied. Receipts expire after Config.ReceiptTTL and at
// unmount; rm removes one early; opening one for writing starts a new
// upload (empty with O_TRUNC, else seeded with its content: rsync
// --inplace, dd conv=notrunc, >>). A seed copies nothing at open: the
// upload reads unwritten ranges from the published blob (pinned until the
// upload ends) and copies the rest into its stage when it publishes, so
// opening a 1 GiB receipt takes about a millisecond. Directories and
// symbolic links under incoming/ live in memory (inctree.go, incdir.go,
// symlink.go); a directory goes a TTL after it is found empty, like a
// receipt.
//
// # Pins
//
// Every open handle on a blob holds a store Pin until RELEASE, minted
// before the blob is opened; the mount also registers a store.Source fed by
// the digests of its open handles. So a blob unlinked (rm) or no longer
// referenced while open stays readable until closed, and a sweep meanwhile
// keeps it — a sweep of this mount, of another mount of the same store, or
// of a CLI command: where the store is SQL, the first pin of a digest
// writes a gc_pins row that every process's arbitration reads, and further
// opens of a held digest cost no database write. Handles on one blob share
// one store Reader, so chunks verified for one handle are verified for
// all. Uploads pin through the store at commit (pin before publish).
//
// # Deadlocks
//
// Nothing in this package calls into the mount it serves. Tests that do
// (they run the server in-process) keep page faults on mount files out of
// the serving process: a fault stalls a thread that the Go runtime's
// stop-the-world then waits for, while the server that would resolve it
// cannot run. Their mmap reads and writes run in a child process.
package fusefs
