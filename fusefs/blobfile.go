package fusefs

import (
	"context"
	"errors"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// Extended attributes of blob files (and of receipts, for the digest).
const (
	xattrDigest = "user.alkblobfs.digest"
	xattrTier   = "user.alkblobfs.tier"
)

// blobFile is a published blob in a namespace: read-only, immutable, one
// inode per digest (shared by every namespace that links it).
//
// The kernel keeps an inode for every entry a listing showed (ls -l of a
// namespace of 100 000 blobs makes as many), and go-fuse keeps a node for
// each until the kernel forgets it; few of them are ever opened. So a blob
// file holds only what its attributes need, packed: its name (the digest's
// hex, the very string go-fuse keeps as the entry's name, instead of the
// 32-byte digest beside it), the time as an integer and the tier as a bool
// (a time.Time and a store.Tier take 24 and 16 bytes). What opens need
// lives in a blobOpen while a handle is open. That makes 192 bytes a node
// with go-fuse's Inode, where it was 320; TestBlobFileSize keeps it so.
type blobFile struct {
	node
	name     string // the digest in hex: the entry's name in every namespace
	size     int64
	linkedAt int64 // Unix nanoseconds (the registry keeps it so too)

	mu    sync.Mutex
	open  *blobOpen // while handles are open; nil otherwise
	large bool      // its tier: store.TierLarge, else store.TierKV
}

// blobOpen is a blob file's state while handles are open on it.
//
// Open handles share one store Reader, so the chunks one handle verified
// need not be verified again for another, and the blob's passthrough
// backing file is that reader's descriptor.
type blobOpen struct {
	rd   *store.Reader
	ptFd uintptr // the backing file handed to the kernel, while pt > 0
	// ptOK: ptFd is set. A handle restored from a predecessor in
	// passthrough mode may have none (handover.go: restoreHandle).
	ptOK bool
	// open handles by I/O mode. The kernel refuses (EIO at open) a
	// passthrough open while the inode has cached-mode files open, and
	// the reverse, so a new open takes the mode of those already open.
	n, pt, cached int
}

// newBlobFile is the node of blob ref, named name (its digest's hex),
// whose content info describes.
func newBlobFile(f *FS, name string, ref namespaces.Ref, info store.Info) *blobFile {
	return &blobFile{node: node{fsys: f}, name: name, size: info.Size, linkedAt: ref.LinkedAt.UnixNano(), large: info.Tier == store.TierLarge}
}

// digest is the blob's digest, decoded from its name (valid hex: it was
// made from a digest).
func (b *blobFile) digest() blob.Digest {
	d, _ := blob.Parse(b.name)
	return d
}

// tier is the store tier that holds the blob.
func (b *blobFile) tier() store.Tier {
	if b.large {
		return store.TierLarge
	}
	return store.TierKV
}

var (
	_ = (fs.NodeGetattrer)((*blobFile)(nil))
	_ = (fs.NodeSetattrer)((*blobFile)(nil))
	_ = (fs.NodeOpener)((*blobFile)(nil))
	_ = (fs.NodeGetxattrer)((*blobFile)(nil))
	_ = (fs.NodeListxattrer)((*blobFile)(nil))
	_ = (fs.NodeSetxattrer)((*blobFile)(nil))
	_ = (fs.NodeRemovexattrer)((*blobFile)(nil))
	_ = (fs.NodeStatfser)((*blobFile)(nil))

	_ = (fs.FileReader)((*blobHandle)(nil))
	_ = (fs.FileReleaser)((*blobHandle)(nil))
	_ = (fs.FilePassthroughFder)((*ptHandle)(nil))
)

func (b *blobFile) attr(out *fuse.Attr) {
	out.Mode = syscall.S_IFREG | 0o444
	out.Nlink = 1
	out.Uid, out.Gid = b.fsys.uid, b.fsys.gid
	setSize(out, b.size)
	t := time.Unix(0, b.linkedAt)
	setTimes(out, t, t, t)
}

func (b *blobFile) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	b.attr(&out.Attr)
	out.SetTimeout(blobTimeout)
	return 0
}

// Setattr refuses everything: truncation is EACCES (as for an open for
// writing), mode, owner and time changes EPERM.
func (b *blobFile) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if _, ok := in.GetSize(); ok {
		return b.fsys.errno("setattr", b.digest(), errReadOnly)
	}
	return b.fsys.errno("setattr", b.digest(), errNotPermitted)
}

// Open pins the blob for as long as the handle lives, so that an unlink or
// a sweep meanwhile leaves it readable (POSIX semantics for open files).
func (b *blobFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	f, dg := b.fsys, b.digest()
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0 {
		return nil, 0, f.errno("open", dg, errReadOnly)
	}
	// Pin before opening: a sweep between the open and the pin could
	// otherwise delete what we are about to read.
	pin, err := f.st.Pin(ctx, dg)
	if err != nil {
		return nil, 0, f.errno("open", dg, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	o := b.open
	fresh := o == nil
	if fresh {
		// The store refuses a blob known corrupt (ErrCorrupt, EIO here),
		// in every verify mode, until it is repaired; one whose file
		// changed since is served verified only (store: verdicts.go).
		r, ok, err := f.st.Get(ctx, dg)
		if err == nil && !ok {
			err = blob.Wrap("open", "", dg, blob.ErrMissing)
		}
		if err != nil {
			pin.Release()
			return nil, 0, f.errno("open", dg, err)
		}
		o = &blobOpen{rd: r}
		if f.cfg.Verify == VerifyPublish {
			// Not for a suspect blob: the store verifies it even here,
			// until a full read or a scrub finds it good.
			o.rd.Trust()
		}
	} else if err := o.rd.Recheck(ctx); err != nil {
		// The shared reader is judged again at every open: its file may
		// have changed, or a scrub found it corrupt, since.
		pin.Release()
		return nil, 0, f.errno("open", dg, err)
	}
	if o.rd.Changed() {
		f.stats.changedOnDisk.Add(1)
	}
	b.open = o
	o.n++
	f.refs.add(dg)
	f.stats.opens.Add(1)
	f.stats.openHandles.Add(1)
	h := &blobHandle{b: b, d: dg, rd: o.rd, pin: pin}
	f.trackBlobHandle(h)
	if f.cfg.Verify == VerifyStrict {
		h.seq = newSeqCheck(dg, b.size)
	}
	if o.pt > 0 || o.cached == 0 && o.choosePassthrough(f) {
		if !o.ptOK {
			o.ptFd, o.ptOK = o.rd.Passthrough()
		}
		o.pt++
		h.pt, h.ptFd, h.ptOK = true, o.ptFd, o.ptOK
		f.stats.ptOpens.Add(1)
		// go-fuse registers the backing file and clears KEEP_CACHE.
		return &ptHandle{h}, 0, 0
	}
	o.cached++
	f.stats.cachedOpens.Add(1)
	if f.cfg.Verify == VerifyStrict {
		// Each open reads through the daemon again: the kernel drops
		// the pages earlier opens cached.
		return h, 0, 0
	}
	// Immutable content: the kernel may keep pages across opens.
	return h, fuse.FOPEN_KEEP_CACHE, 0
}

// choosePassthrough picks the backing file the kernel may read the blob from
// directly: passthrough works on this mount, the verify mode is not
// strict, and the store allows it (store.Reader.Passthrough: a local file,
// trusted in --verify=publish, known good as the file it is now in
// --verify=full — a file changed on disk since is verified again through
// the daemon first: a stray dd or a restored backup gives EIO, never wrong
// bytes).
func (o *blobOpen) choosePassthrough(f *FS) bool {
	if !f.ptAvailable.Load() || f.cfg.Verify == VerifyStrict {
		return false
	}
	o.ptFd, o.ptOK = o.rd.Passthrough()
	return o.ptOK
}

func (b *blobFile) release(h *blobHandle) {
	if !b.fsys.untrackBlobHandle(h) {
		return // released already (a handover's cleanup)
	}
	b.mu.Lock()
	o := b.open
	if h.pt {
		o.pt--
	} else {
		o.cached--
	}
	o.n--
	if o.n == 0 {
		o.rd.Close()
		b.open = nil
	}
	b.mu.Unlock()
	h.pin.Release()
	b.fsys.refs.drop(h.d)
	b.fsys.stats.openHandles.Add(-1)
}

func (b *blobFile) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	var v string
	switch attr {
	case xattrDigest:
		v = b.name
	case xattrTier:
		v = string(b.tier())
	default:
		return b.node.Getxattr(ctx, attr, dest)
	}
	return xattrValue(b.fsys, dest, v)
}

func (b *blobFile) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	return xattrValue(b.fsys, dest, xattrDigest+"\x00"+xattrTier+"\x00")
}

func (b *blobFile) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return b.fsys.errno("setxattr", b.digest(), errNotPermitted)
}

func (b *blobFile) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return b.fsys.errno("removexattr", b.digest(), errNotPermitted)
}

// xattrValue answers a getxattr/listxattr: the size when dest is empty,
// ERANGE when it is too small.
func xattrValue(f *FS, dest []byte, v string) (uint32, syscall.Errno) {
	if len(dest) == 0 {
		return uint32(len(v)), 0
	}
	if len(dest) < len(v) {
		return uint32(len(v)), f.errno("getxattr", blob.Digest{}, errRange)
	}
	return uint32(copy(dest, v)), 0
}

// blobHandle is one open of a blob file, served through the daemon:
// verified reads from the shared Reader, kept in the page cache.
type blobHandle struct {
	b    *blobFile
	d    blob.Digest
	rd   *store.Reader
	pin  *store.Pin
	pt   bool    // in passthrough mode: asked for it (ptHandle), or restored so
	ptFd uintptr // the backing file it asked with, if ptOK
	ptOK bool
	seq  *seqCheck // --verify=strict: the sha256 of a read from 0 to the end
}

// ptHandle asks go-fuse for passthrough. If the kernel does not take it,
// reads arrive here as for a blobHandle.
type ptHandle struct{ *blobHandle }

// PassthroughFd hands the kernel the blob file's descriptor. go-fuse calls
// it once per inode, right after Open, while the reader is open, and only
// when the node has no backing file registered yet. Without a descriptor
// (a node whose passthrough handles were restored from a predecessor,
// with a reader that offers none here) the open is not passthrough.
func (h *ptHandle) PassthroughFd() (int, bool) { return int(h.ptFd), h.ptOK }

func (h *blobHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	b, f := h.b, h.b.fsys
	if h.pt && h.ptOK && f.ptFellBack.CompareAndSwap(false, true) {
		// go-fuse turns passthrough off for the whole mount when a
		// backing-file registration fails; say so once.
		f.log.Warn("passthrough requested but the kernel sent a read: passthrough is off for this mount", "digest", b.name)
		f.ptAvailable.Store(false)
		f.ptReason.Store("backing file registration failed at open")
	}
	f.stats.reads.Add(1)
	if off >= h.rd.Len() {
		return fuse.ReadResultData(nil), 0
	}
	if h.rd.Trusted() {
		// Trusted and local: let go-fuse splice straight from the file.
		if fd, ok := h.rd.Passthrough(); ok {
			n := min(int64(len(dest)), h.rd.Len()-off)
			f.stats.bytesRead.Add(n)
			return fuse.ReadResultFd(fd, off, int(n)), 0
		}
	}
	n, err := h.rd.ReadAt(dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, h.failed(off, len(dest), err)
	}
	if h.seq != nil {
		if err := h.seq.add(dest[:n], off); err != nil {
			return nil, h.failed(off, len(dest), blob.Wrap("read", "", h.d, err))
		}
	}
	f.stats.bytesRead.Add(int64(n))
	return fuse.ReadResultData(dest[:n]), 0
}

// failed logs a failed read (naming the digest and the range for a
// verification failure) and returns its errno.
func (h *blobHandle) failed(off int64, n int, err error) syscall.Errno {
	f := h.b.fsys
	switch {
	case errors.Is(err, blob.ErrVerification):
		f.stats.verifyFailures.Add(1)
		f.log.Error("blob fails verification; refusing to serve it", "digest", h.b.name, "offset", off, "length", n, "err", err)
	case errors.Is(err, blob.ErrMissing):
		// Deleted under an open handle (its pin lapsed while this host
		// was cut off from the database): an I/O error on a file that is
		// open, not ENOENT, which read(2) never returns.
		f.log.Error("blob deleted while open; its pin lapsed", "digest", h.b.name, "offset", off, "length", n, "err", err)
		return syscall.EIO
	}
	return f.errno("read", h.d, err)
}

func (h *blobHandle) Release(ctx context.Context) syscall.Errno {
	h.b.release(h)
	return 0
}
