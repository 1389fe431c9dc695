package fusefs

import (
	"context"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
)

// incDir is incoming/ or a directory inside it: in memory only, and
// everything below it publishes flat into the namespace.
type incDir struct {
	node
	tree *incTree
	ns   *nsDir // set on incoming/ itself, nil on its subdirectories

	mu   sync.Mutex
	meta meta
}

var (
	_ = (fs.NodeGetattrer)((*incDir)(nil))
	_ = (fs.NodeSetattrer)((*incDir)(nil))
	_ = (fs.NodeCreater)((*incDir)(nil))
	_ = (fs.NodeMkdirer)((*incDir)(nil))
	_ = (fs.NodeUnlinker)((*incDir)(nil))
	_ = (fs.NodeRmdirer)((*incDir)(nil))
	_ = (fs.NodeRenamer)((*incDir)(nil))
	_ = (fs.NodeSymlinker)((*incDir)(nil))
	_ = (fs.NodeLinker)((*incDir)(nil))
	_ = (fs.NodeMknoder)((*incDir)(nil))
	_ = (fs.NodeGetxattrer)((*incDir)(nil))
	_ = (fs.NodeSetxattrer)((*incDir)(nil))
	_ = (fs.NodeLookuper)((*incDir)(nil))
	_ = (fs.NodeReaddirer)((*incDir)(nil))
)

func newIncDir(f *FS, t *incTree, mode, uid, gid uint32) *incDir {
	return &incDir{node: node{fsys: f}, tree: t, meta: newMeta(mode, uid, gid)}
}

func (d *incDir) getattr(out *fuse.Attr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.meta.fill(out, syscall.S_IFDIR)
	out.Nlink = 2
}

// attr fills the directory's attributes. incoming/ itself takes its
// owner, group and mode from its namespace, so that writing into it needs
// write permission on the namespace.
func (d *incDir) attr(ctx context.Context, out *fuse.Attr) error {
	d.getattr(out)
	if d.ns == nil {
		return nil
	}
	p, err := d.ns.perm(ctx)
	if err != nil {
		return err
	}
	out.Mode = syscall.S_IFDIR | p.Mode
	out.Uid, out.Gid = p.Uid, p.Gid
	return nil
}

func (d *incDir) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if err := d.attr(ctx, &out.Attr); err != nil {
		return d.fsys.errno("getattr", blob.Digest{}, err)
	}
	return 0
}

// Setattr keeps what cp -a, tar and rsync set on a directory. On
// incoming/ itself only times stick: its owner, group and mode are the
// namespace's (chmod the namespace), and a mode or owner change is
// accepted and ignored, so that `rsync -a src/ ns/incoming/` does not
// fail on it.
func (d *incDir) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if _, ok := in.GetSize(); ok {
		return d.fsys.errno("setattr", blob.Digest{}, errIsDir)
	}
	d.mu.Lock()
	d.meta.set(in, false)
	d.mu.Unlock()
	if err := d.attr(ctx, &out.Attr); err != nil {
		return d.fsys.errno("setattr", blob.Digest{}, err)
	}
	return 0
}

func (d *incDir) touch() {
	d.mu.Lock()
	d.meta.mtime = time.Now()
	d.meta.ctime = d.meta.mtime
	d.mu.Unlock()
}

// Lookup resolves the names the tree holds, and refuses names no Linux
// filesystem could hold with ENAMETOOLONG rather than ENOENT.
func (d *incDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := tooLong(name); e != 0 {
		return nil, e
	}
	child := d.GetChild(name)
	if child == nil {
		return nil, syscall.ENOENT
	}
	if fn, ok := child.Operations().(*fileNode); ok {
		if fn.gone() {
			// Detached (a refused file at its RELEASE, an unlink) and its
			// name not yet removed: the name is free already. Found, a
			// retry's open of it would be ESTALE again on the kernel's
			// second try too (TestRetryAfterRefusedClose under load).
			return nil, syscall.ENOENT
		}
		if dg, check := fn.receiptToCheck(); check {
			ok, err := d.fsys.st.Has(ctx, dg)
			if err == nil && !ok && fn.dropIfGone(dg) {
				return nil, syscall.ENOENT
			}
			if err == nil && ok {
				fn.markSeen(dg)
			}
		}
	}
	if ga, ok := child.Operations().(fs.NodeGetattrer); ok {
		var a fuse.AttrOut
		if e := ga.Getattr(ctx, nil, &a); e != 0 {
			return nil, e
		}
		out.Attr = a.Attr
	}
	return child, 0
}

// Readdir lists the tree's names, less the receipts whose blob the store
// no longer holds (one metadata query for all of them): a receipt must not
// list what cannot be read.
func (d *incDir) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	children := d.Children()
	var receipts []*fileNode
	var ds []blob.Digest
	for _, ch := range children {
		if fn, ok := ch.Operations().(*fileNode); ok {
			if dg, ok := fn.receiptDigest(); ok {
				receipts = append(receipts, fn)
				ds = append(ds, dg)
			}
		}
	}
	gone := make(map[*fileNode]bool)
	if len(ds) > 0 {
		infos, err := d.fsys.st.StatMany(ctx, ds)
		if err != nil {
			return nil, d.fsys.errno("readdir", blob.Digest{}, err)
		}
		for i, fn := range receipts {
			if _, ok := infos[ds[i]]; ok {
				fn.markSeen(ds[i])
			} else if fn.dropIfGone(ds[i]) {
				gone[fn] = true
			}
		}
	}
	names := make([]string, 0, len(children))
	for name, ch := range children {
		if fn, ok := ch.Operations().(*fileNode); ok && gone[fn] {
			continue
		}
		names = append(names, name)
	}
	slices.Sort(names)
	entries := make([]fuse.DirEntry, len(names))
	for i, name := range names {
		ch := children[name]
		entries[i] = fuse.DirEntry{Name: name, Mode: ch.Mode(), Ino: ch.StableAttr().Ino}
	}
	return fs.NewListDirStream(entries), 0
}

// Create starts an upload: every file created under incoming/ is a put.
func (d *incDir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if e := tooLong(name); e != 0 {
		return nil, nil, 0, e
	}
	f := d.fsys
	if d.tree.isClosed() {
		return nil, nil, 0, f.errno("create", blob.Digest{}, errGone)
	}
	up, err := f.st.NewUpload(ctx)
	if err != nil {
		return nil, nil, 0, f.errno("create", blob.Digest{}, err)
	}
	uid, gid := caller(ctx, f)
	n := newFileNode(f, d.tree, d.tree.ns, mode, uid, gid)
	n.up, n.dirty = up, true
	d.tree.addLive(n)
	f.stats.uploads.Add(1)
	h := n.newHandleLocked(flags)
	n.getattr(&out.Attr)
	d.touch()
	return d.NewPersistentInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFREG}), h, writeOpen, 0
}

// writeOpen is how a descriptor open for writing into incoming/ is opened:
// FOPEN_DIRECT_IO, so that the kernel hands the writer's own pages to the
// daemon instead of first copying them into the file's page cache, which
// nothing would read before the upload publishes (cp's system time per
// GiB: 0.50 s before, 0.18 s with it). A reader opened later reads
// through the daemon; shared mmap keeps working through the mount's
// CAP_DIRECT_IO_ALLOW_MMAP.
const writeOpen = fuse.FOPEN_DIRECT_IO

func (d *incDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := tooLong(name); e != 0 {
		return nil, e
	}
	uid, gid := caller(ctx, d.fsys)
	sub := newIncDir(d.fsys, d.tree, mode, uid, gid)
	sub.getattr(&out.Attr)
	d.touch()
	in := d.NewPersistentInode(ctx, sub, fs.StableAttr{Mode: syscall.S_IFDIR})
	sub.watchEmpty()
	return in, 0
}

// watchEmpty makes a directory under incoming/ expire like a receipt: a
// TTL after it is found empty, it goes (cp -r and tar -x leave a tree of
// directories whose files all publish flat; 10 000 of them must not stay
// in memory for the mount's life). While it holds names it is looked at
// again every TTL.
func (d *incDir) watchEmpty() {
	ttl := d.fsys.cfg.ReceiptTTL
	var check func()
	check = func() {
		if d.tree.isClosed() {
			return
		}
		if len(d.Children()) > 0 {
			time.AfterFunc(ttl, check)
			return
		}
		d.fsys.stats.dirsExpired.Add(1)
		removeName(&d.Inode)
	}
	time.AfterFunc(ttl, check)
}

// Unlink removes an incoming name. A receipt goes (its blob stays
// published); a file still open for writing loses its name but not its
// content: its closes go on committing, and its last RELEASE publishes the
// final version (see publish.go).
func (d *incDir) Unlink(ctx context.Context, name string) syscall.Errno {
	ch := d.GetChild(name)
	if ch == nil {
		return syscall.ENOENT
	}
	switch x := ch.Operations().(type) {
	case *fileNode:
		x.detach()
	case *symNode:
		x.detach()
	case *incDir:
		return d.fsys.errno("unlink", blob.Digest{}, errIsDir)
	}
	d.touch()
	return 0
}

func (d *incDir) Rmdir(ctx context.Context, name string) syscall.Errno {
	ch := d.GetChild(name)
	if ch == nil {
		return syscall.ENOENT
	}
	if _, ok := ch.Operations().(*incDir); !ok {
		return d.fsys.errno("rmdir", blob.Digest{}, errNotDir)
	}
	if len(ch.Children()) > 0 {
		return d.fsys.errno("rmdir", blob.Digest{}, errDirNotEmpty)
	}
	ch.ForgetPersistent()
	d.touch()
	return 0
}

// Rename moves names within one incoming/ tree (rsync's temp-then-rename,
// tar's and cp's overwrites). Each namespace is a filesystem of its own to
// a rename: to anywhere else it is EXDEV, whatever the flags, so mv falls
// back to copy and unlink: into another namespace's incoming/ that
// publishes there, onto <ns>/<digest> it is a verified put. A file still
// open for writing, or a directory holding one, is EBUSY there instead: a
// copy would take what was written so far, and mv would then unlink a name
// that a writer goes on closing into (see publish.go).
func (d *incDir) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if e := tooLong(newName); e != 0 {
		return e
	}
	f := d.fsys
	np, ok := newParent.(*incDir)
	if !ok || np.tree != d.tree {
		busy := func() bool {
			return beingWritten(d.GetChild(name)) || (ok && flags&unix.RENAME_EXCHANGE != 0 && beingWritten(np.GetChild(newName)))
		}
		err := errCrossDevice
		if busy() {
			// A file whose last close just returned is still open to the
			// mount until the kernel's RELEASE arrives (`cp -r dir
			// incoming/ && mv incoming/dir …`): wait for the RELEASEs
			// owed by recent closes, as a lookup does, then look again.
			d.tree.awaitRelease(ctx, nil)
			if ok {
				np.tree.awaitRelease(ctx, nil)
			}
			if busy() {
				err = errBeingWritten
			}
		}
		return f.errno("rename", blob.Digest{}, err)
	}
	if flags&^(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 {
		return f.errno("rename", blob.Digest{}, errBadInput)
	}
	src := d.GetChild(name)
	if src == nil {
		return syscall.ENOENT
	}
	dst := np.GetChild(newName)
	if flags&unix.RENAME_EXCHANGE != 0 {
		if dst == nil {
			return syscall.ENOENT
		}
		d.touch()
		np.touch()
		return 0
	}
	if dst != nil {
		if flags&unix.RENAME_NOREPLACE != 0 {
			return f.errno("rename", blob.Digest{}, errExists)
		}
		if dst == src {
			return 0
		}
		srcDir, dstDir := src.IsDir(), dst.IsDir()
		switch {
		case srcDir && !dstDir:
			return f.errno("rename", blob.Digest{}, errNotDir)
		case !srcDir && dstDir:
			return f.errno("rename", blob.Digest{}, errIsDir)
		case dstDir && len(dst.Children()) > 0:
			return f.errno("rename", blob.Digest{}, errDirNotEmpty)
		}
		switch x := dst.Operations().(type) {
		case *fileNode:
			x.detach()
		case *symNode:
			x.detach()
		case *incDir:
			dst.ForgetPersistent()
		}
	}
	d.touch()
	np.touch()
	return 0
}

// beingWritten reports whether in is a file open for writing, or a
// directory holding one at any depth.
func beingWritten(in *fs.Inode) bool {
	if in == nil {
		return false
	}
	switch x := in.Operations().(type) {
	case *fileNode:
		x.mu.Lock()
		defer x.mu.Unlock()
		return len(x.writers) > 0
	case *incDir:
		for _, ch := range in.Children() {
			if beingWritten(ch) {
				return true
			}
		}
	}
	return false
}

// Symlink keeps a symbolic link in memory, so that cp -r, tar and rsync of
// trees containing links exit 0. Links are not published (a blob is
// bytes) and expire like receipts.
func (d *incDir) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := tooLong(name); e != 0 {
		return nil, e
	}
	uid, gid := caller(ctx, d.fsys)
	s := &symNode{node: node{fsys: d.fsys}, tree: d.tree, target: target, meta: newMeta(0o777, uid, gid)}
	s.getattr(&out.Attr)
	ch := d.NewPersistentInode(ctx, s, fs.StableAttr{Mode: syscall.S_IFLNK})
	s.mu.Lock()
	s.scheduleExpiryLocked()
	s.mu.Unlock()
	d.touch()
	return ch, 0
}

// Link makes a second receipt of a published file (tar -x and cp -a
// recreate hard links of the source tree). A file still being written
// cannot be linked.
func (d *incDir) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := tooLong(name); e != 0 {
		return nil, e
	}
	f := d.fsys
	src, ok := target.(*fileNode)
	if !ok || src.tree != d.tree {
		return nil, f.errno("link", blob.Digest{}, errNotPermitted)
	}
	src.mu.Lock()
	pub, m, staging := src.pub, src.meta, src.up != nil
	src.mu.Unlock()
	if pub == nil || staging {
		return nil, f.errno("link", blob.Digest{}, errNotPermitted)
	}
	n := newFileNode(f, d.tree, d.tree.ns, 0, 0, 0)
	n.meta = m
	n.pub = &version{d: pub.d, size: pub.size}
	f.stats.receipts.Add(1)
	n.mu.Lock()
	n.scheduleExpiryLocked()
	n.mu.Unlock()
	f.noteReceipt(n)
	n.getattr(&out.Attr)
	d.touch()
	return d.NewPersistentInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFREG}), 0
}

func (d *incDir) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := tooLong(name); e != 0 {
		return nil, e
	}
	return nil, d.fsys.errno("mknod", blob.Digest{}, errNotPermitted)
}

func (d *incDir) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return d.fsys.errno("setxattr", blob.Digest{}, errUnsupported)
}
