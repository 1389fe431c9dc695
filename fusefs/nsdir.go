package fusefs

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// incomingName is the write path inside every namespace.
const incomingName = "incoming"

// nsDir is a namespace: its blobs, looked up and listed from the registry
// on demand, plus incoming/ and the verified puts by path in flight.
type nsDir struct {
	node
	name string

	once   sync.Once
	inited atomic.Bool
	// incAttr is incoming/'s StableAttr when a handover restores it
	// (the kernel knows it by the predecessor's); zero: automatic.
	incAttr fs.StableAttr

	tree *incTree
	inc  *incDir

	mu      sync.Mutex
	pending map[string]*fileNode // verified puts by path, by digest name

	permMu sync.Mutex
	permV  namespaces.Perm
	permAt time.Time // zero: not loaded

	// refreshedAt is when the last listing that gave the kernel the
	// attributes of every entry began (Unix nanoseconds; 0: none yet).
	// For refreshAge after it, listings leave them out for the entries
	// the kernel knows (nsStream.Lookup).
	refreshedAt atomic.Int64
}

var (
	_ = (fs.NodeOnAdder)((*nsDir)(nil))
	_ = (fs.NodeGetattrer)((*nsDir)(nil))
	_ = (fs.NodeSetattrer)((*nsDir)(nil))
	_ = (fs.NodeLookuper)((*nsDir)(nil))
	_ = (fs.NodeOpendirHandler)((*nsDir)(nil))
	_ = (fs.NodeCreater)((*nsDir)(nil))
	_ = (fs.NodeMkdirer)((*nsDir)(nil))
	_ = (fs.NodeUnlinker)((*nsDir)(nil))
	_ = (fs.NodeRmdirer)((*nsDir)(nil))
	_ = (fs.NodeRenamer)((*nsDir)(nil))
	_ = (fs.NodeSymlinker)((*nsDir)(nil))
	_ = (fs.NodeMknoder)((*nsDir)(nil))
	_ = (fs.NodeLinker)((*nsDir)(nil))
)

func newNSDir(f *FS, name string) *nsDir {
	d := &nsDir{node: node{fsys: f}, name: name, pending: make(map[string]*fileNode)}
	d.tree = newIncTree(d)
	d.inc = newIncDir(f, d.tree, 0o755, f.uid, f.gid)
	d.inc.ns = d
	return d
}

// inode returns the directory's persistent inode, creating it under the
// root on first use. Persistent, so that incoming/ (in-memory state) lives
// as long as the namespace, whatever the kernel forgets.
func (d *nsDir) inode(ctx context.Context, root *fs.Inode) *fs.Inode {
	return d.inodeAttr(ctx, root, fs.StableAttr{Mode: syscall.S_IFDIR})
}

// inodeAttr is inode with the StableAttr attr: a handover restores the
// directory with the predecessor's.
func (d *nsDir) inodeAttr(ctx context.Context, root *fs.Inode, attr fs.StableAttr) *fs.Inode {
	d.once.Do(func() {
		root.NewPersistentInode(ctx, d, attr)
		d.inited.Store(true)
	})
	return &d.Inode
}

// OnAdd attaches incoming/.
func (d *nsDir) OnAdd(ctx context.Context) {
	attr := d.incAttr
	attr.Mode = syscall.S_IFDIR
	ch := d.NewPersistentInode(ctx, d.inc, attr)
	d.AddChild(incomingName, ch, true)
}

// perm is the namespace's owner, group and mode, as its directory and
// incoming/ show them: the registry's Perm, or, for a namespace created
// without one (alkblobfs ns create, an older version), the mount's user
// and 0755. It is cached for the kernel's attribute timeout, so a chmod
// through another mount shows within a second.
func (d *nsDir) perm(ctx context.Context) (namespaces.Perm, error) {
	d.permMu.Lock()
	defer d.permMu.Unlock()
	if !d.permAt.IsZero() && time.Since(d.permAt) < defaultTimeout {
		return d.permV, nil
	}
	p, ok, err := d.fsys.reg.Perm(ctx, d.name)
	if err != nil {
		return namespaces.Perm{}, err
	}
	if !ok {
		p = namespaces.Perm{Uid: d.fsys.uid, Gid: d.fsys.gid, Mode: 0o755}
	}
	d.permV, d.permAt = p, time.Now()
	return p, nil
}

func (d *nsDir) cachePerm(p namespaces.Perm) {
	d.permMu.Lock()
	d.permV, d.permAt = p, time.Now()
	d.permMu.Unlock()
}

// attr fills the directory's attributes.
func (d *nsDir) attr(ctx context.Context, out *fuse.Attr) error {
	p, err := d.perm(ctx)
	if err != nil {
		return err
	}
	d.fsys.dirAttr(out, p.Mode, d.fsys.born)
	out.Uid, out.Gid = p.Uid, p.Gid
	// glibc sizes a directory stream's buffer from st_blksize (32 KiB to
	// 1 MiB), and the kernel a READDIRPLUS from the getdents64 it serves
	// (up to max_pages, 1 MiB here; kernels before that change ask for a
	// page whatever the buffer): 1 MiB lists ~4 800 entries with 64-hex
	// names per round trip, against ~150 with the default 32 KiB
	// (TestListingTakesFewRoundTrips).
	out.Blksize = listBlockSize
	return nil
}

// listBlockSize is the st_blksize of a namespace directory (see attr).
const listBlockSize = 1 << 20

func (d *nsDir) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if err := d.attr(ctx, &out.Attr); err != nil {
		return d.fsys.errno("getattr", blob.Digest{}, err)
	}
	return 0
}

// Setattr records chmod, chown and chgrp of the namespace, which decide
// who may use it when other users reach the mount. The kernel checks them
// first when it checks permissions (--allow-other); the daemon checks too,
// by namespaces.ChangePerm: only the owner or root changes the mode or
// the group (the owner to one of its groups), only root the owner.
// Time changes are accepted and ignored, so that rsync and cp -a
// finishing a copy do not fail on the directory.
func (d *nsDir) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	mode, setMode := in.GetMode()
	uid, setUID := in.GetUID()
	gid, setGID := in.GetGID()
	if setMode || setUID || setGID {
		p, err := d.perm(ctx)
		if err != nil {
			return d.fsys.errno("setattr", blob.Digest{}, err)
		}
		p, err = namespaces.ChangePerm(p, principal(ctx, d.fsys), namespaces.PermChange{
			Mode: mode, UID: uid, GID: gid, SetMode: setMode, SetUID: setUID, SetGID: setGID})
		if err != nil {
			return d.fsys.errno("setattr", blob.Digest{}, err)
		}
		if err := d.fsys.reg.SetPerm(uninterrupted(ctx), d.name, p); err != nil {
			return d.fsys.errno("setattr", blob.Digest{}, err)
		}
		d.cachePerm(p)
		d.fsys.log.Info("namespace permissions changed", "namespace", d.name, "uid", p.Uid, "gid", p.Gid, "mode", fmt.Sprintf("%04o", p.Mode))
	}
	if err := d.attr(ctx, &out.Attr); err != nil {
		return d.fsys.errno("setattr", blob.Digest{}, err)
	}
	return 0
}

// principal is the user behind a request and its groups, for the access
// rules of namespaces: the caller's uid and gid from the request, and its
// supplementary groups from /proc (a request carries none). A caller gone
// by the time it is asked is only its primary group; the kernel has
// checked a request from it already when it checks permissions.
func principal(ctx context.Context, f *FS) namespaces.Principal {
	uid, gid := caller(ctx, f)
	p := namespaces.Principal{UID: uid, GIDs: []uint32{gid}}
	c, ok := fuse.FromContext(ctx)
	if !ok || c.Pid == 0 {
		return p
	}
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(c.Pid), 10) + "/status")
	if err != nil {
		return p
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Groups:"); ok {
			for _, g := range strings.Fields(v) {
				if n, err := strconv.ParseUint(g, 10, 32); err == nil {
					p.GIDs = append(p.GIDs, uint32(n))
				}
			}
			break
		}
	}
	return p
}

// busy reports whether puts are in flight in the namespace.
func (d *nsDir) busy() bool {
	d.mu.Lock()
	n := len(d.pending)
	d.mu.Unlock()
	return n > 0 || d.tree.busy()
}

// teardown ends the namespace's in-memory state: uploads are discarded,
// receipts dropped, persistent inodes released.
func (d *nsDir) teardown() {
	d.mu.Lock()
	pend := make([]*fileNode, 0, len(d.pending))
	for _, n := range d.pending {
		pend = append(pend, n)
	}
	d.pending = map[string]*fileNode{}
	d.mu.Unlock()
	for _, n := range pend {
		n.discard()
	}
	d.tree.close()
	if d.inited.Load() {
		d.RmAllChildren()
	}
}

func (d *nsDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := tooLong(name); e != 0 {
		return nil, e
	}
	if name == incomingName {
		if err := d.inc.attr(ctx, &out.Attr); err != nil {
			return nil, d.fsys.errno("lookup", blob.Digest{}, err)
		}
		return d.GetChild(incomingName), 0
	}
	d.mu.Lock()
	p := d.pending[name]
	d.mu.Unlock()
	if p != nil {
		p.getattr(&out.Attr)
		// Revalidate every time: once the put publishes, the same name
		// must resolve to the blob's own inode.
		out.SetEntryTimeout(0)
		out.SetAttrTimeout(0)
		return &p.Inode, 0
	}
	if !blob.IsDigestName(name) {
		return nil, syscall.ENOENT
	}
	dg, err := blob.Parse(name)
	if err != nil {
		return nil, syscall.ENOENT
	}
	if d.tree != nil {
		d.tree.awaitRelease(ctx, &dg)
	}
	ref, ok, err := d.fsys.reg.Has(ctx, d.name, dg)
	if err != nil {
		return nil, d.fsys.errno("lookup", dg, err)
	}
	if !ok {
		return nil, syscall.ENOENT
	}
	return d.blobChild(ctx, name, ref, nil, out)
}

// knownBlob returns the blob file the namespace already has an inode for
// under name (a digest's hex), or nil.
func (d *nsDir) knownBlob(name string) *blobFile {
	ch := d.GetChild(name)
	if ch == nil {
		return nil
	}
	if b, ok := ch.Operations().(*blobFile); ok && b.name == name {
		return b
	}
	return nil
}

// blobName is the name of dg's entry, and whether the namespace has an
// inode for it already. A known blob's name is the string its node and
// go-fuse's entry already hold: a listing of entries the kernel knows
// allocates no name, and leaves no second copy of one in go-fuse's entry
// (which takes the name each lookup brings).
func (d *nsDir) blobName(dg blob.Digest) (name string, known bool) {
	var buf [2 * blob.Size]byte
	hex.Encode(buf[:], dg[:])
	// A view of buf for the lookup alone: GetChild and knownBlob compare
	// it and keep nothing of it.
	if b := d.knownBlob(unsafe.String(&buf[0], len(buf))); b != nil {
		return b.name, true
	}
	return string(buf[:]), false
}

// blobChild makes (or finds) the inode of a referenced blob, named name
// (its digest's hex). Size and tier come from metadata (info, when the
// caller already has it); the content is not touched.
func (d *nsDir) blobChild(ctx context.Context, name string, ref namespaces.Ref, info *store.Info, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	// Known already (listed or opened before): size and tier are facts of
	// the content, no need to ask the store again.
	if b := d.knownBlob(name); b != nil {
		b.attr(&out.Attr)
		out.SetEntryTimeout(blobTimeout)
		out.SetAttrTimeout(blobTimeout)
		return &b.Inode, 0
	}
	if info == nil {
		i, ok, err := d.fsys.st.Stat(ctx, ref.Digest)
		if err != nil {
			return nil, d.fsys.errno("lookup", ref.Digest, err)
		}
		if ok {
			info = &i
		}
	}
	if info == nil {
		// A reference to a blob the pool does not hold: the Service never
		// links such a thing, so something removed it behind our back.
		d.fsys.log.Warn("namespace references a blob the pool does not hold", "namespace", d.name, "digest", ref.Digest.String())
		return nil, syscall.ENOENT
	}
	return d.newBlobChild(ctx, name, ref, *info, out), 0
}

// newBlobChild makes the inode of a referenced blob whose size and tier
// info gives. If the blob already has an inode (open, looked up meanwhile,
// or linked in another namespace), go-fuse hands the kernel that one: one
// inode per digest.
func (d *nsDir) newBlobChild(ctx context.Context, name string, ref namespaces.Ref, info store.Info, out *fuse.EntryOut) *fs.Inode {
	b := newBlobFile(d.fsys, name, ref, info)
	b.attr(&out.Attr)
	out.SetEntryTimeout(blobTimeout)
	out.SetAttrTimeout(blobTimeout)
	return d.NewInode(ctx, b, blobAttr(ref.Digest))
}

// OpendirHandle streams the listing (see nsStream).
func (d *nsDir) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if d.tree != nil {
		d.tree.awaitRelease(ctx, nil)
	}
	now := time.Now()
	full := now.UnixNano()-d.refreshedAt.Load() >= int64(refreshAge)
	return &nsStream{d: d, start: now, full: full}, 0, 0
}

// Create in a namespace is the verified put by path: the name must be a
// digest, and the content must hash to it.
func (d *nsDir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if e := tooLong(name); e != 0 {
		return nil, nil, 0, e
	}
	if !blob.IsDigestName(name) {
		d.fsys.log.Warn("cannot create a file directly in a namespace unless its name is the sha256 of its content (lowercase hex); copy files into incoming/ instead",
			"namespace", d.name, "name", name)
		return nil, nil, 0, d.fsys.errno("create", blob.Digest{}, errNotPermitted)
	}
	want, _ := blob.Parse(name)
	up, err := d.fsys.st.NewUpload(ctx)
	if err != nil {
		return nil, nil, 0, d.fsys.errno("create", want, err)
	}
	uid, gid := caller(ctx, d.fsys)
	n := newFileNode(d.fsys, nil, d, mode, uid, gid)
	n.want, n.name = &want, name
	n.up, n.dirty = up, true
	h := n.newHandleLocked(flags)
	d.mu.Lock()
	d.pending[name] = n
	d.mu.Unlock()
	n.getattr(&out.Attr)
	out.SetEntryTimeout(0)
	out.SetAttrTimeout(0)
	return d.NewInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFREG}), h, 0, 0
}

// dropPending forgets a put by path once it published or failed.
func (d *nsDir) dropPending(name string, n *fileNode) {
	d.mu.Lock()
	if d.pending[name] == n {
		delete(d.pending, name)
	}
	d.mu.Unlock()
}

func (d *nsDir) Unlink(ctx context.Context, name string) syscall.Errno {
	d.mu.Lock()
	p := d.pending[name]
	if p != nil {
		delete(d.pending, name)
	}
	d.mu.Unlock()
	if p != nil {
		p.detach()
		return 0
	}
	if !blob.IsDigestName(name) {
		return syscall.ENOENT
	}
	dg, _ := blob.Parse(name)
	if err := d.fsys.reg.Unlink(uninterrupted(ctx), d.name, dg); err != nil {
		return d.fsys.errno("unlink", dg, err)
	}
	return 0
}

func (d *nsDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	d.fsys.log.Warn("directories cannot be made in a namespace; make them under incoming/", "namespace", d.name, "name", name)
	return nil, d.fsys.errno("mkdir", blob.Digest{}, errNotPermitted)
}

func (d *nsDir) Rmdir(ctx context.Context, name string) syscall.Errno {
	return d.fsys.errno("rmdir", blob.Digest{}, errNotPermitted)
}

// Rename of a blob (or of incoming/) is EPERM: a blob's name is its
// content. Copying works and dedups.
func (d *nsDir) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return d.fsys.errno("rename", blob.Digest{}, errNotPermitted)
}

func (d *nsDir) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, d.fsys.errno("symlink", blob.Digest{}, errNotPermitted)
}

func (d *nsDir) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, d.fsys.errno("mknod", blob.Digest{}, errNotPermitted)
}

// Link (a hard link, also across namespaces) is EPERM; cp dedups.
func (d *nsDir) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, d.fsys.errno("link", blob.Digest{}, errNotPermitted)
}
