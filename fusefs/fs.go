package fusefs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
	"github.com/alkblobfs/alkblobfs/upkeep"
)

// Store is what the mount needs of the blob pool; *store.Store satisfies
// it. The mount never sees an engine or the collector, only this facade:
// the store owns what is known of each blob (verdicts, passthrough) and
// what the large tier's filesystem holds (StatFS).
type Store interface {
	Has(ctx context.Context, d blob.Digest) (bool, error)
	Stat(ctx context.Context, d blob.Digest) (store.Info, bool, error)
	// Size is d's logical size, which a namespace link charges to the
	// namespace's usage (namespaces.Pool).
	Size(ctx context.Context, d blob.Digest) (int64, error)
	StatMany(ctx context.Context, ds []blob.Digest) (map[blob.Digest]store.Info, error)
	Get(ctx context.Context, d blob.Digest) (*store.Reader, bool, error)
	NewUpload(ctx context.Context) (*store.Upload, error)
	// ImportUpload goes on with an upload a predecessor exported (a
	// handover: handover_files.go).
	ImportUpload(ctx context.Context, f *os.File, e store.Exported) (*store.Upload, error)
	Pin(ctx context.Context, d blob.Digest) (*store.Pin, error)
	PinMany(ctx context.Context, ds []blob.Digest) ([]*store.Pin, error)
	Sweep(ctx context.Context) (store.Report, error)
	LastReport() (store.Report, bool)
	Digests(ctx context.Context) iter.Seq2[blob.Digest, error]
	Scrub(ctx context.Context, seq iter.Seq2[blob.Digest, error], o store.ScrubOptions) (store.ScrubSummary, error)
	// Corrupt lists the blobs the store refuses (a scrub found them
	// corrupt), for the stats.
	Corrupt(ctx context.Context) ([]store.CorruptBlob, error)
	Stats() store.Stats
	ReadOnly() bool
	// Sync makes what was committed before it durable against a power
	// loss (an fsync of an incoming file).
	Sync(ctx context.Context) error
	// Register adds the mount's open references as a liveness source.
	Register(src store.Source) *store.Registration
	// PinTTL is the life of an unrenewed pin row (the writer leases'
	// renewal follows it).
	PinTTL() time.Duration
	// StatFS is the large tier's filesystem, for df and the passthrough
	// probe; ok is false when the large tier is not local files.
	StatFS() (store.FSUsage, bool, error)
	// CacheStats is the large tier's local cache (store.ErrNoCache
	// without one), for the stats file.
	CacheStats(ctx context.Context) (store.CacheStats, error)
}

var _ Store = (*store.Store)(nil)

// Verify is the --verify mode.
type Verify string

const (
	// VerifyFull never serves a byte that has not been checked: range
	// reads verify the chunks they touch, and passthrough (which bypasses
	// the daemon) is used only for blobs already verified end to end.
	VerifyFull Verify = "full"
	// VerifyPublish trusts the hashing done at publish: reads are not
	// verified and local blobs pass through from the first open.
	VerifyPublish Verify = "publish"
	// VerifyStrict verifies every read through the daemon, at every open:
	// no passthrough, no page cache kept across opens, and a handle that
	// reads a blob from offset 0 to its end also checks the sha256.
	VerifyStrict Verify = "strict"
)

// ParseVerify parses a --verify value.
func ParseVerify(s string) (Verify, error) {
	switch v := Verify(s); v {
	case VerifyFull, VerifyPublish, VerifyStrict:
		return v, nil
	}
	return "", fmt.Errorf("verify mode %q: want full, strict or publish", s)
}

// DefaultReceiptTTL is how long an incoming/ receipt stays after publish.
const DefaultReceiptTTL = 10 * time.Minute

// Config configures a mount.
type Config struct {
	Store Store
	// Namespaces is the registry the mount's directories show. The mount
	// links through a namespaces.Service over it and Store.
	Namespaces namespaces.Registry
	Verify     Verify        // "" means VerifyFull
	ReceiptTTL time.Duration // 0 means DefaultReceiptTTL
	// MaxReceipts caps the receipts kept; 0 means DefaultMaxReceipts.
	MaxReceipts int
	SweepEvery  time.Duration // 0: no timer
	// ScrubEvery re-verifies the whole store on a timer (0: off); each
	// scrub reads at most ScrubRate bytes a second (0: unlimited).
	ScrubEvery time.Duration
	ScrubRate  int64
	AllowOther bool
	Debug      bool // go-fuse request tracing on the log
	// NoPassthrough keeps every read in the daemon even where the kernel
	// could read a local blob's file directly.
	NoPassthrough bool
	// ReadOnly mounts read-only (MS_RDONLY): the kernel refuses every
	// change with EROFS — puts, links, unlinks, namespaces, control
	// writes — and the mount runs no sweep timer. Open files still pin.
	ReadOnly bool
	// NonEmpty mounts over a directory that holds files (hidden while
	// mounted); without it such a mountpoint is an error.
	NonEmpty bool
	// Source is what the mount shows as its source (/proc/mounts,
	// findmnt, df): mount(8) compares it with an fstab line's to tell
	// whether that line is mounted. "" shows "alkblobfs".
	Source string
	// Data is the store's data directory, if it has one: the "mounted"
	// log line names it.
	Data   string
	Logger *slog.Logger
	// Observe, if set, is told how long each FUSE request took, by
	// operation ("lookup", "read", "flush", …): the metrics' latency
	// histogram.
	Observe func(op string, d time.Duration)
	// Guard starts a guard process beside a mount with a change feed
	// (guard.go): the executable must hand RunGuard the process it runs
	// as GuardName. Off for a mount in a process that cannot (a test
	// binary).
	Guard bool
	// RestartOnCrash has the guard keep the connection when the daemon
	// dies and restart the daemon on it (restart.go); with Guard only.
	RestartOnCrash bool
}

// Timeouts. Blob files are immutable and their dentries change only by
// links and unlinks, which this mount announces to the kernel
// (NotifyEntry); so the kernel may keep them for long. Directories and
// incoming/ files change under the kernel's feet (other processes' links,
// publishes), so they get the one-second default.
const (
	blobTimeout    = time.Hour
	defaultTimeout = time.Second
)

// Fixed inode numbers. Digest files take the first eight bytes of the
// digest, remapped out of this range; everything else gets go-fuse's
// automatic numbers from 2^63.
const (
	inoRoot       = 1
	inoControl    = 2
	inoSweep      = 3
	inoSweepTimer = 4
	inoStats      = 5
	inoScrub      = 6
	inoReserved   = 64
)

// blobAttr is the StableAttr of a digest file: Ino is the first eight bytes
// of the digest (st_ino, stable across mounts), Gen the next eight. go-fuse
// identifies nodes by (Ino, Gen), so two digests sharing an eight-byte
// prefix still get distinct nodes: a collision could only ever show as two
// files with the same st_ino, never as one file's bytes under another name.
func blobAttr(d blob.Digest) fs.StableAttr {
	ino := binary.BigEndian.Uint64(d[:8])
	if ino < inoReserved || ino == ^uint64(0) {
		ino ^= 1 << 62
	}
	return fs.StableAttr{Mode: syscall.S_IFREG, Ino: ino, Gen: binary.BigEndian.Uint64(d[8:16])}
}

// FS is the state of one mount: the node tree's shared services.
type FS struct {
	st   Store
	reg  namespaces.Registry
	svc  *namespaces.Service
	cfg  Config
	log  *slog.Logger
	uid  uint32
	gid  uint32
	born time.Time

	// ctx ends at unmount: long-running work started by the mount (timer
	// sweeps, seeding re-opened uploads) stops with it.
	ctx    context.Context
	cancel context.CancelFunc

	root       *rootDir
	mount      *Server
	refs       *openRefs
	intents    *intents
	refsSource *store.Registration // refs, registered as a liveness source
	// upkeep sweeps and scrubs the store for the control files and the
	// timers; it stops at unmount.
	upkeep *upkeep.Upkeep

	nsMu sync.Mutex
	ns   map[string]*nsDir // namespace directories the kernel has seen

	receipts receiptList

	// blobHandles are the open handles of blob files, with their pins:
	// a handover's cleanup releases them (the kernel sends their RELEASE
	// to the successor).
	blobHandlesMu sync.Mutex
	blobHandles   map[*blobHandle]struct{}

	// Passthrough: available once the probe at mount succeeded; off again
	// if go-fuse silently gave up registering a backing file (a read then
	// reaches a handle that asked for passthrough).
	// carriedPending: files of incoming/ a takeover restored whose
	// version waits for its last release, until PendCarried records
	// their pending links.
	carriedPending []*fileNode

	ptAvailable atomic.Bool
	ptReason    atomic.Value // string: why not
	ptFellBack  atomic.Bool

	stats counters
}

type counters struct {
	opens, ptOpens, cachedOpens, openHandles atomic.Int64
	controlHandles                           atomic.Int64 // open control files (.alkblobfs/*)
	reads, bytesRead                         atomic.Int64
	writes, bytesWritten                     atomic.Int64
	publishes, publishFailures, superseded   atomic.Int64
	verifyFailures, changedOnDisk            atomic.Int64
	uploads, receipts, dirsExpired           atomic.Int64
	receiptsEvicted                          atomic.Int64
	// listing entries left without attributes for the kernel, which
	// knew them (nsStream.Lookup)
	entriesLeftOut atomic.Int64
}

// newFS builds the tree's shared state; Mount wires it to a server.
func newFS(cfg Config) (*FS, error) {
	if cfg.Store == nil || cfg.Namespaces == nil {
		return nil, errors.New("fusefs: Config needs a Store and a Namespaces registry")
	}
	if cfg.Verify == "" {
		cfg.Verify = VerifyFull
	}
	if _, err := ParseVerify(string(cfg.Verify)); err != nil {
		return nil, err
	}
	if cfg.ReceiptTTL <= 0 {
		cfg.ReceiptTTL = DefaultReceiptTTL
	}
	if cfg.MaxReceipts <= 0 {
		cfg.MaxReceipts = DefaultMaxReceipts
	}
	if cfg.Store.ReadOnly() && !cfg.ReadOnly {
		return nil, fmt.Errorf("fusefs: %w: its data is on a read-only filesystem, or in a directory this user cannot write; mount it with --read-only to serve reads", store.ErrReadOnly)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f := &FS{
		st:   cfg.Store,
		reg:  cfg.Namespaces,
		svc:  namespaces.NewService(cfg.Namespaces, cfg.Store),
		cfg:  cfg,
		log:  cfg.Logger,
		uid:  uint32(os.Getuid()),
		gid:  uint32(os.Getgid()),
		born: time.Now(),
		ns:   make(map[string]*nsDir),
		refs: newOpenRefs(),

		blobHandles: make(map[*blobHandle]struct{}),
	}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.ptReason.Store("not probed")
	f.root = &rootDir{node: node{fsys: f}}
	u, err := upkeep.New(upkeep.Config{
		Store:      cfg.Store,
		Logger:     cfg.Logger,
		SweepEvery: cfg.SweepEvery,
		ReadOnly:   cfg.ReadOnly,
		ScrubEvery: cfg.ScrubEvery,
		ScrubRate:  cfg.ScrubRate,
		OnScrub:    f.judgeScrub,
	})
	if err != nil {
		return nil, fmt.Errorf("fusefs: %w", err)
	}
	f.upkeep = u
	f.intents = newIntents(f)
	return f, nil
}

// node is embedded by every node type: the go-fuse inode, the mount, and
// the answers every node gives alike (statfs).
type node struct {
	fs.Inode
	fsys *FS
}

var (
	_ = (fs.NodeStatfser)((*node)(nil))
	_ = (fs.NodeGetxattrer)((*node)(nil))
	_ = (fs.NodeListxattrer)((*node)(nil))
)

// foreignXattr reports whether name is outside user.*, the only xattr
// namespace this filesystem keeps. security.*, system.* (ACLs) and
// trusted.* are EOPNOTSUPP rather than ENODATA: that tells ls and cp the
// filesystem does not support them, so they stop asking (ls -l otherwise
// sends two requests per entry, each a FUSE round trip, for nothing).
func foreignXattr(name string) bool { return !strings.HasPrefix(name, "user.") }

// Getxattr answers for every node the names it does not keep itself:
// foreign namespaces are EOPNOTSUPP, any other user.* name ENODATA. Nodes
// with attributes of their own (blobs, incoming files) fall back to it.
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if foreignXattr(attr) {
		return 0, syscall.EOPNOTSUPP
	}
	return 0, syscall.ENODATA
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) { return 0, 0 }

// Statfs reports the large tier's backing filesystem, so df shows real
// capacity; a store without one reports zeros.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	u, ok, err := n.fsys.st.StatFS()
	switch {
	case err != nil:
		return n.fsys.errno("statfs", blob.Digest{}, err)
	case !ok:
		out.NameLen = 255
		out.Bsize = 4096
		out.Frsize = 4096
		return 0
	}
	out.Blocks = u.Blocks
	out.Bfree = u.Bfree
	out.Bavail = u.Bavail
	out.Files = u.Files
	out.Ffree = u.Ffree
	out.Bsize = uint32(u.Bsize)
	out.Frsize = uint32(u.Frsize)
	out.NameLen = 255
	return 0
}

// dirAttr fills attributes shared by the mount's own directories.
func (f *FS) dirAttr(out *fuse.Attr, mode uint32, t time.Time) {
	out.Mode = syscall.S_IFDIR | mode
	out.Nlink = 2
	out.Uid, out.Gid = f.uid, f.gid
	setTimes(out, t, t, t)
}

func setTimes(out *fuse.Attr, atime, mtime, ctime time.Time) {
	out.SetTimes(&atime, &mtime, &ctime)
}

// setSize sets size and a block count with a 1 MiB preferred I/O size: cp
// and friends size their buffers from st_blksize, and 1 MiB matches the
// mount's max_write, so a copy is one FUSE request per write(2).
func setSize(out *fuse.Attr, size int64) {
	out.Size = uint64(size)
	out.Blksize = ioBlockSize
	out.Blocks = (uint64(size) + 4095) / 4096 * 8
}

const ioBlockSize = 1 << 20

// nsDirFor returns the directory node state of namespace name, creating it
// on first sight. The map keeps one nsDir per namespace for the mount's
// life (until rmdir), so incoming/ state survives the kernel forgetting
// the directory's inode.
func (f *FS) nsDirFor(name string) (*nsDir, bool) {
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	d, ok := f.ns[name]
	if !ok {
		d = newNSDir(f, name)
		f.ns[name] = d
	}
	return d, !ok
}

func (f *FS) dropNSDir(name string, d *nsDir) {
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	if f.ns[name] == d {
		delete(f.ns, name)
	}
}

func (f *FS) nsDirs() []*nsDir {
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	out := make([]*nsDir, 0, len(f.ns))
	for _, d := range f.ns {
		out = append(out, d)
	}
	return out
}

// notifyEntry tells the kernel to drop its dentry parent/name. It must run
// with no node lock held: the kernel takes the directory's lock to
// invalidate, and a request holding that lock may be waiting on ours.
func notifyEntry(parent *fs.Inode, name string) {
	if parent == nil {
		return
	}
	// ENOENT: the kernel does not know the directory or the name; nothing
	// cached, nothing to do.
	_ = parent.NotifyEntry(name)
}

// uninterrupted is the context of a namespace change (mkdir, rmdir, chmod,
// rm): once begun it runs to its end, because an interrupt (a signal to
// the caller) that cut it after its commit would report EINTR for a change
// that happened, and the retry that glibc and Go make of an interrupted
// mkdir or unlink would then fail with EEXIST or ENOENT. The wait stays
// bounded: every database wait has the store's own bound.
func uninterrupted(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

func (f *FS) trackBlobHandle(h *blobHandle) {
	f.blobHandlesMu.Lock()
	f.blobHandles[h] = struct{}{}
	f.blobHandlesMu.Unlock()
}

// untrackBlobHandle forgets h, reporting whether it was still open.
func (f *FS) untrackBlobHandle(h *blobHandle) bool {
	f.blobHandlesMu.Lock()
	defer f.blobHandlesMu.Unlock()
	if _, ok := f.blobHandles[h]; !ok {
		return false
	}
	delete(f.blobHandles, h)
	return true
}

// releaseBlobHandles releases every open blob handle: their pins, their
// readers. Only once nothing serves the kernel from this process (after
// a handover).
func (f *FS) releaseBlobHandles() {
	f.blobHandlesMu.Lock()
	hs := make([]*blobHandle, 0, len(f.blobHandles))
	for h := range f.blobHandles {
		hs = append(hs, h)
	}
	f.blobHandlesMu.Unlock()
	for _, h := range hs {
		h.b.release(h)
	}
}
