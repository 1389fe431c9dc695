package fusefs

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// incTree is the state one namespace's incoming/ tree shares: which files
// have an upload in flight (rmdir of the namespace waits for none, unmount
// discards them) and which owe a RELEASE that lookups wait for.
type incTree struct {
	ns *nsDir

	mu     sync.Mutex
	live   map[*fileNode]struct{} // files with an upload in flight
	closed bool
	// owed holds the files whose version is committed but linked only at
	// the RELEASE the kernel sends after the last close (see publish.go),
	// with the digest and when it was committed; changed is closed and
	// replaced whenever one is paid.
	owed    map[*fileNode]owedRelease
	changed chan struct{}
}

type owedRelease struct {
	d     blob.Digest
	since time.Time
	// releasing: the RELEASE arrived at this time and its link is being
	// committed.
	releasing time.Time
}

// releaseWait bounds how long a lookup or listing of the namespace waits
// for the RELEASE owed since a close: long enough for the kernel to
// deliver the RELEASE that follows a last close (microseconds; tens of
// milliseconds on a loaded machine, where 50 ms lost TestCloseThenStat
// its file once in a run of make test beside other builds), short enough that a descriptor kept open
// elsewhere (a forked child closed its copy; a shell still runs
// `cmd > f`) costs a lookup little. A close older than that is not waited
// for at all. Once the RELEASE has arrived, its link is waited for up to
// settleWait: it commits in the database, where it may queue behind a
// sweep for far longer than 50 ms (a stress test lost files that way).
const (
	releaseWait = 200 * time.Millisecond
	settleWait  = 10 * time.Second
)

func newIncTree(ns *nsDir) *incTree {
	return &incTree{ns: ns, live: make(map[*fileNode]struct{}), owed: make(map[*fileNode]owedRelease), changed: make(chan struct{})}
}

func (t *incTree) owe(n *fileNode, d blob.Digest) {
	t.mu.Lock()
	t.owed[n] = owedRelease{d: d, since: time.Now()}
	t.mu.Unlock()
}

// releasing marks n's owed RELEASE as arrived: its link is committing.
func (t *incTree) releasing(n *fileNode) {
	t.mu.Lock()
	if o, ok := t.owed[n]; ok {
		o.releasing = time.Now()
		t.owed[n] = o
	}
	t.mu.Unlock()
}

func (t *incTree) paid(n *fileNode) {
	t.mu.Lock()
	if _, ok := t.owed[n]; ok {
		delete(t.owed, n)
		close(t.changed)
		t.changed = make(chan struct{})
	}
	t.mu.Unlock()
}

// awaitRelease waits until no RELEASE of a recent close is owed for
// digest *d (any digest when d is nil), at most releaseWait after that
// close: so that `cp f incoming/ && stat ns/<digest>` finds the file.
// Closes after the call began are not waited for, so the wait is bounded
// however busy the writers are.
func (t *incTree) awaitRelease(ctx context.Context, d *blob.Digest) {
	start := time.Now()
	for {
		t.mu.Lock()
		now := time.Now()
		var until time.Time
		for _, o := range t.owed {
			if (d != nil && o.d != *d) || o.since.After(start) {
				continue
			}
			end := o.since.Add(releaseWait)
			if !o.releasing.IsZero() {
				end = o.releasing.Add(settleWait)
			}
			if end.After(now) && end.After(until) {
				until = end
			}
		}
		ch := t.changed
		t.mu.Unlock()
		if until.IsZero() {
			return
		}
		timer := time.NewTimer(until.Sub(now))
		select {
		case <-ch:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return
		}
		timer.Stop()
	}
}

func (t *incTree) addLive(n *fileNode) {
	t.mu.Lock()
	t.live[n] = struct{}{}
	t.mu.Unlock()
}

func (t *incTree) dropLive(n *fileNode) {
	t.mu.Lock()
	delete(t.live, n)
	t.mu.Unlock()
}

func (t *incTree) busy() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.live) > 0
}

func (t *incTree) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// close discards every upload in flight and stops receipts from expiring
// into a tree that is going away.
func (t *incTree) close() {
	t.mu.Lock()
	t.closed = true
	live := make([]*fileNode, 0, len(t.live))
	for n := range t.live {
		live = append(live, n)
	}
	t.mu.Unlock()
	for _, n := range live {
		n.discard()
	}
}

// meta is the POSIX attributes of an incoming/ entry, kept in memory so
// that chmod, chown and utimes by cp -a, tar and rsync stick.
type meta struct {
	mode                uint32 // permission bits
	uid, gid            uint32
	atime, mtime, ctime time.Time
}

func newMeta(mode, uid, gid uint32) meta {
	now := time.Now()
	return meta{mode: mode & 0o7777, uid: uid, gid: gid, atime: now, mtime: now, ctime: now}
}

func (m *meta) fill(out *fuse.Attr, typ uint32) {
	out.Mode = typ | m.mode
	out.Uid, out.Gid = m.uid, m.gid
	setTimes(out, m.atime, m.mtime, m.ctime)
}

// set applies a SETATTR. A chown without a mode change clears a file's
// set-id bits (killPriv), as chown(2) does.
func (m *meta) set(in *fuse.SetAttrIn, file bool) {
	_, chown := in.GetUID()
	if _, ok := in.GetGID(); ok {
		chown = true
	}
	if v, ok := in.GetUID(); ok {
		m.uid = v
	}
	if v, ok := in.GetGID(); ok {
		m.gid = v
	}
	if v, ok := in.GetMode(); ok {
		m.mode = v & 0o7777
	} else if chown && file {
		m.killPriv()
	}
	if v, ok := in.GetATime(); ok {
		m.atime = v
	}
	if v, ok := in.GetMTime(); ok {
		m.mtime = v
	}
	m.ctime = time.Now()
}

// killPriv clears a regular file's set-user-ID bit, and its set-group-ID
// bit where the group may execute it: what the kernel does to a file that
// an unprivileged process writes or truncates (O_TRUNC included), and to
// any file chowned. The mount asks for FUSE_HANDLE_KILLPRIV_V2, which
// hands this job to the daemon (and saves a GETXATTR round trip before
// every WRITE). The kernel's flag saying that the writer lacks CAP_FSETID
// does not reach the nodes through go-fuse's fs API, so root's writes
// clear the bits too; on a nosuid mount whose blobs are published 0444
// they mean nothing anyway.
func (m *meta) killPriv() {
	m.mode &^= syscall.S_ISUID
	if m.mode&syscall.S_IXGRP != 0 {
		m.mode &^= syscall.S_ISGID
	}
}

// caller is the uid and gid of the process behind a request.
func caller(ctx context.Context, f *FS) (uint32, uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid
	}
	return f.uid, f.gid
}

// notice is a kernel dentry to invalidate once no lock is held.
type notice struct {
	parent *fs.Inode
	name   string
}

func send(ns []notice) {
	for _, n := range ns {
		notifyEntry(n.parent, n.name)
	}
}

// removeName takes a persistent node out of its directory: for expiry and
// failed files, where no kernel request does it for us. It does not tell
// the kernel: incoming/ entries live one second in its cache, and a
// notification would wait behind any LOOKUP in the directory (see
// "Deadlocks" in the package doc).
func removeName(in *fs.Inode) {
	name, parent := in.Parent()
	if parent != nil && parent.GetChild(name) == in {
		parent.RmChild(name)
	}
	in.ForgetPersistent()
}

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
	_ = (fs.NodeStatfser)((*incDir)(nil))
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
		err := errCrossDevice
		if beingWritten(d.GetChild(name)) || (ok && flags&unix.RENAME_EXCHANGE != 0 && beingWritten(np.GetChild(newName))) {
			err = errBeingWritten
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

// version is one committed state of an incoming file.
type version struct {
	d    blob.Digest
	size int64
	// intent, while non-zero: committed at a close, linked into the
	// namespace only at the file's last RELEASE (see publish.go).
	intent namespaces.Intent
}

// fileNode is a file being written (an Upload) or, after publish, its
// receipt. The same type serves a verified put by path (tree nil, want
// set): it lives in the namespace directory until it publishes.
//
// What FLUSH, RELEASE, writes, unlinks and expiry do is decided in
// publish.go; the methods here gather the state and carry the steps out.
type fileNode struct {
	node
	tree *incTree // nil for a put by path
	ns   *nsDir
	want *blob.Digest // put by path: the name, which the content must hash to
	name string       // put by path: the digest name

	mu    sync.Mutex
	meta  meta
	up    *store.Upload // nil when the content is the published version
	dirty bool          // up differs from pub (or pub is nil)
	// owing: this file is in tree.owed (see incTree).
	owing bool
	// written: the content was written (or extended) since the file was
	// created or truncated to nothing (see publish.go).
	written  bool
	pub      *version // last committed version: the receipt
	failed   error    // a write or publish failed: nothing publishes; EIO/ENOSPC
	detached bool     // unlinked, replaced or expired
	writers  map[*fileHandle]struct{}
	handles  int
	seen     time.Time // a receipt's blob was last found in the store
	gen      uint64    // bumped by every publish and detach: stale expiry timers do nothing
	expiry   *time.Timer
	// stale: the kernel's page cache of this file may hold bytes it no
	// longer has (writes of an upload that failed or was dropped), so the
	// next open must not keep it (see Open).
	stale bool
}

var (
	_ = (fs.NodeGetattrer)((*fileNode)(nil))
	_ = (fs.NodeSetattrer)((*fileNode)(nil))
	_ = (fs.NodeOpener)((*fileNode)(nil))
	_ = (fs.NodeGetxattrer)((*fileNode)(nil))
	_ = (fs.NodeListxattrer)((*fileNode)(nil))
	_ = (fs.NodeSetxattrer)((*fileNode)(nil))
	_ = (fs.NodeRemovexattrer)((*fileNode)(nil))
	_ = (fs.NodeStatfser)((*fileNode)(nil))

	_ = (fs.FileReader)((*fileHandle)(nil))
	_ = (fs.FileWriter)((*fileHandle)(nil))
	_ = (fs.FileFlusher)((*fileHandle)(nil))
	_ = (fs.FileReleaser)((*fileHandle)(nil))
	_ = (fs.FileFsyncer)((*fileHandle)(nil))
	_ = (fs.FileAllocater)((*fileHandle)(nil))
)

func newFileNode(f *FS, t *incTree, ns *nsDir, mode, uid, gid uint32) *fileNode {
	return &fileNode{node: node{fsys: f}, tree: t, ns: ns, meta: newMeta(mode, uid, gid)}
}

// fileHandle is one open of an incoming file.
type fileHandle struct {
	n     *fileNode
	write bool
	idle  bool // flushed, and not written since
	wrote bool // written since its last flush

	rmu sync.Mutex
	rd  *store.Reader // reading a published version
	pin *gc.Pin
}

func (n *fileNode) newHandleLocked(flags uint32) *fileHandle {
	// idle: a descriptor that has not written has nothing unflushed.
	h := &fileHandle{n: n, write: flags&syscall.O_ACCMODE != syscall.O_RDONLY, idle: true}
	if h.write {
		if n.writers == nil {
			n.writers = make(map[*fileHandle]struct{})
		}
		n.writers[h] = struct{}{}
	}
	n.handles++
	n.fsys.stats.openHandles.Add(1)
	return h
}

func (n *fileNode) logName() string {
	if n.want != nil {
		return n.name
	}
	if name, _ := n.Parent(); name != "" {
		return incomingName + "/…/" + name
	}
	return "(unlinked)"
}

func (n *fileNode) getattr(out *fuse.Attr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.getattrLocked(out)
}

func (n *fileNode) getattrLocked(out *fuse.Attr) {
	n.meta.fill(out, syscall.S_IFREG)
	out.Nlink = 1
	var size int64
	switch {
	case n.up != nil:
		size = n.up.Size()
	case n.pub != nil:
		size = n.pub.size
	}
	setSize(out, size)
}

func (n *fileNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.getattr(&out.Attr)
	return 0
}

// stateLocked is the file's state as publish.go's decisions see it.
func (n *fileNode) stateLocked() fileState {
	return fileState{
		uploading: n.up != nil,
		dirty:     n.dirty,
		written:   n.written,
		pending:   n.pub != nil && n.pub.intent != 0,
		owing:     n.owing,
		failed:    n.failed != nil,
		detached:  n.detached,
		byPath:    n.want != nil,
	}
}

// Setattr keeps chmod, chown and utimes in memory (receipts included, so
// cp -a and rsync succeed), and truncates through the upload.
func (n *fileNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	h, _ := fh.(*fileHandle)
	var notes []notice
	var err error
	n.mu.Lock()
	if size, ok := in.GetSize(); ok {
		err = n.truncateLocked(ctx, h, int64(size))
		if err == nil && len(n.writers) == 0 && decide(n.stateLocked(), event{kind: evTruncatePath}).has(stepCommitLink) {
			notes, err = n.commitLocked(ctx, false)
		}
	}
	if err == nil {
		n.meta.set(in, true)
	}
	n.getattrLocked(&out.Attr)
	n.mu.Unlock()
	send(notes)
	return n.fsys.errno("setattr", n.digestForLog(), err)
}

func (n *fileNode) truncateLocked(ctx context.Context, h *fileHandle, size int64) error {
	n.meta.killPriv()
	if n.up == nil && n.failed == nil && n.pub != nil && n.pub.size == size {
		return nil // rsync --inplace and others truncate to the size it has
	}
	if err := n.prepareWriteLocked(ctx); err != nil {
		return err
	}
	if err := n.up.Truncate(size); err != nil {
		n.failLocked(err)
		return err
	}
	n.dirty, n.written = true, size > 0
	n.meta.mtime = time.Now()
	if h != nil {
		h.idle, h.wrote = false, true
	}
	return nil
}

// prepareWriteLocked makes the upload ready for a change: the file's
// failure, or a new upload seeded with the committed content.
func (n *fileNode) prepareWriteLocked(ctx context.Context) error {
	p := decide(n.stateLocked(), event{kind: evWrite})
	switch {
	case p.has(stepFail):
		return n.failed
	case p.has(stepReopen):
		return n.reopenLocked(ctx, true)
	}
	return nil
}

func (n *fileNode) digestForLog() blob.Digest {
	if n.want != nil {
		return *n.want
	}
	return blob.Digest{}
}

// Open of an incoming file for writing makes it an upload again: O_TRUNC
// starts empty, otherwise from the published content (rsync --inplace, dd
// conv=notrunc, >>). Reading serves the upload or the published blob.
func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	write := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	trunc := flags&syscall.O_TRUNC != 0
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.detached {
		return nil, 0, n.fsys.errno("open", n.digestForLog(), errGone)
	}
	// The kernel keeps what it cached of the file unless the content
	// changed behind it: every other change is a write or truncate it made
	// itself. Dropping a 1 GiB file's pages (a receipt just written with
	// cp) costs an open about 70 ms. --verify=strict keeps nothing across
	// opens.
	var fl uint32
	if !trunc && !n.stale && n.fsys.cfg.Verify != VerifyStrict {
		fl = fuse.FOPEN_KEEP_CACHE
	}
	if write {
		// A new writer starts over from the last committed version.
		n.failed = nil
		if n.up == nil {
			if err := n.reopenLocked(ctx, !trunc); err != nil {
				return nil, 0, n.fsys.errno("open", n.digestForLog(), err)
			}
		}
		if trunc {
			if err := n.up.Truncate(0); err != nil {
				n.failLocked(err)
				return nil, 0, n.fsys.errno("open", n.digestForLog(), err)
			}
			n.dirty, n.written = true, false
			n.meta.killPriv()
		}
	}
	if fl == 0 {
		n.stale = false // this open drops the kernel's pages
	}
	if write {
		fl |= writeOpen
	}
	return n.newHandleLocked(flags), fl, 0
}

// reopenLocked starts a new upload for a published (or failed) file,
// seeded with the published content when keep is set.
func (n *fileNode) reopenLocked(ctx context.Context, keep bool) error {
	f := n.fsys
	up, err := f.st.NewUpload(ctx)
	if err != nil {
		return err
	}
	if keep && n.pub != nil && n.pub.size > 0 {
		if err := f.seed(ctx, up, n.pub.d); err != nil {
			up.Discard()
			return err
		}
	}
	n.up = up
	n.dirty = !keep || n.pub == nil
	if n.tree != nil {
		n.tree.addLive(n)
	}
	f.stats.uploads.Add(1)
	return nil
}

// seed starts up from blob d's content. The upload reads the blob where
// it has not been written and copies the rest in at its commit
// (store.Upload.Seed), so that opening a large receipt for `>>`, dd
// conv=notrunc or rsync --inplace returns at once; it holds d pinned
// until it ends.
func (f *FS) seed(ctx context.Context, up *store.Upload, d blob.Digest) error {
	pin, err := f.st.Pin(ctx, d)
	if err != nil {
		return err
	}
	r, ok, err := f.st.Get(ctx, d)
	if err == nil && !ok {
		err = blob.Wrap("seed", "", d, blob.ErrMissing)
	}
	if err != nil {
		pin.Release()
		return err
	}
	if f.cfg.Verify == VerifyPublish {
		r.Trust()
	}
	return up.Seed(ctx, r, pin)
}

// failLocked ends the upload after a failed write or publish: nothing of
// it will be published, and every later close reports err.
func (n *fileNode) failLocked(err error) {
	n.failed = err
	n.stale = true
	if n.up != nil {
		n.up.Discard()
		n.up = nil
		if n.tree != nil {
			n.tree.dropLive(n)
		}
	}
	n.dirty = false
}

// commitLocked commits the upload: with an intent (link at the last
// RELEASE) or linked now, replacing the intent of the version before.
func (n *fileNode) commitLocked(ctx context.Context, intent bool) ([]notice, error) {
	f := n.fsys
	up := n.up
	n.up, n.dirty = nil, false
	if n.tree != nil {
		n.tree.dropLive(n)
	}
	size := up.Size()
	var prev namespaces.Intent
	if n.pub != nil {
		prev = n.pub.intent
	}
	var rec namespaces.Intent
	var hook store.LinkFunc
	if intent {
		hook = f.svc.PendFunc(n.ns.name, f.intents.pending(prev), &rec)
	} else {
		hook = f.svc.SettleFunc(n.ns.name, f.intents.pending(prev))
	}
	// A close waits for its publish: the client's signals must not cancel
	// half of it (nor can the Go runtime's own SIGURG, for Go clients).
	pctx := context.WithoutCancel(ctx)
	d, pin, err := up.Commit(pctx, n.want, store.WithLink(hook))
	if err != nil {
		n.failed = err
		n.stale = true
		f.stats.publishFailures.Add(1)
		if n.want != nil && errors.Is(err, blob.ErrVerification) {
			f.log.Warn("verified put by path failed: content does not hash to the file name; nothing published",
				"namespace", n.ns.name, "name", n.name, "err", err)
		} else {
			f.log.Error("publish failed; nothing published", "namespace", n.ns.name, "name", n.logName(), "err", err)
		}
		if prev != 0 {
			n.cancelLocked(pctx)
		}
		if n.want != nil {
			n.ns.dropPending(n.name, n)
			return []notice{{&n.ns.Inode, n.name}}, err
		}
		return nil, err
	}
	pin.Release() // the intent or the namespace reference keeps it now
	if prev != 0 {
		f.intents.dropped()
		if n.pub.d != d {
			f.stats.superseded.Add(1)
		}
	}
	if intent {
		f.intents.recorded()
	} else {
		f.stats.publishes.Add(1)
	}
	f.log.Debug("committed", "namespace", n.ns.name, "name", n.logName(), "digest", d.String(), "size", size, "linked", !intent)
	// No notification for the new name: the namespace directory answers
	// ENOENT uncached (no negative entries), so nothing stale can hide
	// it. Announcing names on this hot path would park the thread in the
	// kernel behind any LOOKUP of the directory, and a daemon killed
	// there cannot exit (see "Deadlocks" in the package doc). A put by
	// path's own name was handed to the kernel by CREATE and must be
	// renewed: that rarer path still notifies.
	first := n.pub == nil
	n.pub = &version{d: d, size: size, intent: rec}
	if n.want != nil {
		n.ns.dropPending(n.name, n)
		return []notice{{&n.ns.Inode, n.name}}, nil
	}
	if n.detached {
		return nil, nil // unlinked while open: published, but no receipt
	}
	if first {
		f.stats.receipts.Add(1)
	}
	f.noteReceipt(n) // under n.mu: the list's lock is a leaf
	n.scheduleExpiryLocked()
	return nil, nil
}

// settleLocked links the pending version (the last RELEASE). Like
// cancelLocked, it takes the intent off the version first: whatever the
// database answers, this process is done with it (a failure is retried
// by the intents loop).
func (n *fileNode) settleLocked(ctx context.Context) {
	f := n.fsys
	i := n.pub.intent
	n.pub.intent = 0
	linked, err := f.intents.settle(context.WithoutCancel(ctx), i)
	if err != nil {
		f.log.Error("could not link a closed file into its namespace; retrying", "namespace", n.ns.name, "name", n.logName(),
			"digest", n.pub.d.String(), "err", err)
		return
	}
	f.stats.publishes.Add(1)
	f.log.Debug("published", "namespace", n.ns.name, "name", n.logName(), "digest", n.pub.d.String(), "new_ref", linked)
}

// cancelLocked drops the pending version unseen: the file failed.
func (n *fileNode) cancelLocked(ctx context.Context) {
	f := n.fsys
	i := n.pub.intent
	n.pub.intent = 0
	f.stats.superseded.Add(1)
	if err := f.intents.cancel(context.WithoutCancel(ctx), i); err != nil {
		f.log.Warn("could not drop an unfinished version's intent; retrying", "namespace", n.ns.name, "name", n.logName(), "err", err)
	}
}

// scheduleExpiryLocked (re)arms the receipt's expiry.
func (n *fileNode) scheduleExpiryLocked() {
	if n.tree == nil {
		return
	}
	n.gen++
	if n.expiry != nil {
		n.expiry.Stop()
	}
	g := n.gen
	n.expiry = time.AfterFunc(n.fsys.cfg.ReceiptTTL, func() { n.expire(g) })
}

func (n *fileNode) expire(g uint64) {
	n.mu.Lock()
	if n.gen != g || n.pub == nil || n.tree.isClosed() {
		n.mu.Unlock()
		return
	}
	p := decide(n.stateLocked(), event{kind: evExpire, inUse: n.handles > 0 || n.up != nil})
	if p.has(stepRearm) {
		n.expiry = time.AfterFunc(n.fsys.cfg.ReceiptTTL, func() { n.expire(g) })
	}
	if p.has(stepDetach) {
		n.detachLocked()
	}
	n.mu.Unlock()
	if p.has(stepDetach) {
		removeName(&n.Inode)
	}
}

// receiptDigest returns the digest of a receipt at rest: published, not
// being written, not open.
func (n *fileNode) receiptDigest() (blob.Digest, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.receiptDigestLocked()
}

// receiptToCheck is receiptDigest for a lookup: false also when the blob
// was seen in the store within the last second (a READDIRPLUS looks up
// every name it just listed).
func (n *fileNode) receiptToCheck() (blob.Digest, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	d, ok := n.receiptDigestLocked()
	return d, ok && time.Since(n.seen) > time.Second
}

func (n *fileNode) markSeen(d blob.Digest) {
	n.mu.Lock()
	if n.pub != nil && n.pub.d == d {
		n.seen = time.Now()
	}
	n.mu.Unlock()
}

// dropIfGone removes a receipt whose blob d the store no longer holds (a
// sweep took it after its namespace let go of it), if it is still that
// receipt at rest. It sends the kernel no notification: it runs inside a
// request on the directory, whose lock the kernel holds; the name's
// dentry lapses within the directory's one-second timeout.
func (n *fileNode) dropIfGone(d blob.Digest) bool {
	n.mu.Lock()
	if got, ok := n.receiptDigestLocked(); !ok || got != d {
		n.mu.Unlock()
		return false
	}
	n.detachLocked()
	n.mu.Unlock()
	n.fsys.log.Info("receipt removed: its blob is no longer in the store", "namespace", n.ns.name, "digest", d.String())
	name, parent := n.Inode.Parent()
	if parent != nil && parent.GetChild(name) == &n.Inode {
		parent.RmChild(name)
	}
	n.ForgetPersistent()
	return true
}

func (n *fileNode) receiptDigestLocked() (blob.Digest, bool) {
	if n.tree == nil || n.pub == nil || n.up != nil || n.handles > 0 || n.detached {
		return blob.Digest{}, false
	}
	return n.pub.d, true
}

// detach takes the file out of the tree: unlink, rename over it, expiry.
func (n *fileNode) detach() {
	n.mu.Lock()
	n.detachLocked()
	n.mu.Unlock()
	if n.tree != nil {
		n.ForgetPersistent()
	}
}

func (n *fileNode) detachLocked() {
	if n.detached {
		return
	}
	p := decide(n.stateLocked(), event{kind: evUnlink, noWriters: len(n.writers) == 0})
	n.detached = true
	n.gen++
	if n.expiry != nil {
		n.expiry.Stop()
	}
	if n.pub != nil && n.tree != nil {
		n.fsys.stats.receipts.Add(-1)
		n.fsys.receipts.remove(n)
	}
	if p.has(stepDiscard) {
		n.discardUploadLocked()
	}
}

func (n *fileNode) discardUploadLocked() {
	if n.up == nil {
		return
	}
	if n.dirty {
		n.stale = true // its writes are dropped
	}
	n.up.Discard()
	n.up = nil
	n.dirty = false
	if n.tree != nil {
		n.tree.dropLive(n)
	}
}

// discard drops an in-flight upload at unmount or namespace removal.
func (n *fileNode) discard() {
	n.mu.Lock()
	n.detachLocked()
	n.discardUploadLocked()
	n.mu.Unlock()
}

func (n *fileNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if attr != xattrDigest {
		return n.node.Getxattr(ctx, attr, dest)
	}
	n.mu.Lock()
	pub, staging := n.pub, n.up != nil
	n.mu.Unlock()
	if pub == nil || staging {
		return 0, n.fsys.errno("getxattr", blob.Digest{}, errNoAttr)
	}
	return xattrValue(n.fsys, dest, pub.d.String())
}

func (n *fileNode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	n.mu.Lock()
	pub, staging := n.pub, n.up != nil
	n.mu.Unlock()
	if pub == nil || staging {
		return 0, 0
	}
	return xattrValue(n.fsys, dest, xattrDigest+"\x00")
}

// Setxattr: incoming files keep no extended attributes of their own (cp -a
// and tar take ENOTSUP as "not preserved" and go on).
func (n *fileNode) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return n.fsys.errno("setxattr", blob.Digest{}, errUnsupported)
}

func (n *fileNode) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return n.fsys.errno("removexattr", blob.Digest{}, errNoAttr)
}

func (h *fileHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.prepareWriteLocked(ctx); err != nil {
		return 0, n.fsys.errno("write", n.digestForLog(), err)
	}
	k, err := n.up.WriteAt(data, off)
	if err != nil {
		// ENOSPC and friends: nothing of this file will be published.
		n.failLocked(err)
		return 0, n.fsys.errno("write", n.digestForLog(), err)
	}
	n.dirty, n.written, h.idle, h.wrote = true, true, false, true
	n.meta.mtime = time.Now()
	n.meta.ctime = n.meta.mtime
	n.meta.killPriv()
	n.fsys.stats.writes.Add(1)
	n.fsys.stats.bytesWritten.Add(int64(k))
	return uint32(k), 0
}

func (h *fileHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, f := h.n, h.n.fsys
	f.stats.reads.Add(1)
	n.mu.Lock()
	if n.up != nil {
		k, err := n.up.ReadAt(dest, off)
		n.mu.Unlock()
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, f.errno("read", n.digestForLog(), err)
		}
		f.stats.bytesRead.Add(int64(k))
		return fuse.ReadResultData(dest[:k]), 0
	}
	pub, failed := n.pub, n.failed
	n.mu.Unlock()
	if failed != nil {
		return nil, f.errno("read", n.digestForLog(), errPublishFailed)
	}
	if pub == nil || off >= pub.size {
		return fuse.ReadResultData(nil), 0
	}
	rd, err := h.reader(ctx, pub.d)
	if err != nil {
		return nil, f.errno("read", pub.d, err)
	}
	k, err := rd.ReadAt(dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		if errors.Is(err, blob.ErrVerification) {
			f.stats.verifyFailures.Add(1)
			f.log.Error("blob fails verification; refusing to serve it", "digest", pub.d.String(), "offset", off, "err", err)
		}
		return nil, f.errno("read", pub.d, err)
	}
	f.stats.bytesRead.Add(int64(k))
	return fuse.ReadResultData(dest[:k]), 0
}

// reader opens (once per published version) a pinned store reader.
func (h *fileHandle) reader(ctx context.Context, d blob.Digest) (*store.Reader, error) {
	h.rmu.Lock()
	defer h.rmu.Unlock()
	if h.rd != nil && h.rd.Digest() == d {
		return h.rd, nil
	}
	h.closeReaderLocked()
	f := h.n.fsys
	pin, err := f.st.Pin(ctx, d)
	if err != nil {
		return nil, err
	}
	r, ok, err := f.st.Get(ctx, d)
	if err == nil && !ok {
		err = blob.Wrap("open", "", d, blob.ErrMissing)
	}
	if err != nil {
		pin.Release()
		return nil, err
	}
	if f.cfg.Verify == VerifyPublish {
		r.Trust()
	}
	f.refs.add(d)
	h.rd, h.pin = r, pin
	return r, nil
}

func (h *fileHandle) closeReaderLocked() {
	if h.rd == nil {
		return
	}
	d := h.rd.Digest()
	h.rd.Close()
	h.pin.Release()
	h.n.fsys.refs.drop(d)
	h.rd, h.pin = nil, nil
}

// Flush is close(2): this is where a publish's error reaches the program.
func (h *fileHandle) Flush(ctx context.Context) syscall.Errno {
	n := h.n
	n.mu.Lock()
	wrote := h.wrote
	if h.write {
		h.idle, h.wrote = true, false
	}
	p := decide(n.stateLocked(), event{kind: evFlush, writer: h.write, wrote: wrote,
		othersBusy: n.othersBusyLocked(h), emptyMismatch: n.want != nil && *n.want != blob.Sum(nil)})
	notes, err := n.carryOutLocked(ctx, p)
	n.mu.Unlock()
	send(notes)
	return n.fsys.errno("close", n.digestForLog(), err)
}

// Fsync commits what was written so far, as a close would, and returns
// once that commit is durable (store.Store.Sync): after a crash or a power
// loss, the next mount publishes it unless a later close superseded it.
// fdatasync is the same: a commit has no metadata to leave out.
func (h *fileHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	n, f := h.n, h.n.fsys
	n.mu.Lock()
	p := decide(n.stateLocked(), event{kind: evFsync})
	notes, err := n.carryOutLocked(ctx, p)
	n.mu.Unlock()
	send(notes)
	if err == nil {
		// Not under n.mu: a sync waits for the disk, and reads of the
		// file need not wait with it.
		err = f.st.Sync(context.WithoutCancel(ctx))
	}
	return f.errno("fsync", n.digestForLog(), err)
}

// carryOutLocked does what a FLUSH or an fsync decided: report the file's
// failure, or commit, and make lookups wait for the RELEASE.
func (n *fileNode) carryOutLocked(ctx context.Context, p step) ([]notice, error) {
	var notes []notice
	var err error
	switch {
	case p.has(stepFail):
		err = n.failed
	case p.has(stepRefuse):
		// The name goes now, not at the RELEASE: nobody may read it back
		// as an empty file meanwhile. A descriptor still open can still
		// complete the put, which then shows under the name as the blob.
		err = blob.Wrap("put", "", *n.want, blob.ErrVerification)
		n.fsys.log.Warn("verified put by path closed empty: the empty content does not hash to the file name",
			"namespace", n.ns.name, "name", n.name)
		n.ns.dropPending(n.name, n)
		notes = []notice{{&n.ns.Inode, n.name}}
	case p.has(stepCommitIntent):
		notes, err = n.commitLocked(ctx, true)
	case p.has(stepCommitLink):
		notes, err = n.commitLocked(ctx, false)
	}
	if p.has(stepOwe) && err == nil {
		d := blob.Sum(nil) // an empty file publishes at its RELEASE
		if n.pub != nil && n.pub.intent != 0 {
			d = n.pub.d
		}
		n.owing = true
		n.tree.owe(n, d)
	}
	return notes, err
}

// othersBusyLocked reports whether a writer handle other than h has
// writes it has not flushed.
func (n *fileNode) othersBusyLocked(h *fileHandle) bool {
	for o := range n.writers {
		if o != h && !o.idle {
			return true
		}
	}
	return false
}

// Release: when the last writer goes, the pending version is linked (or
// what is still uncommitted is committed and linked; its error can only be
// logged), and a file that failed disappears with its last handle.
func (h *fileHandle) Release(ctx context.Context) syscall.Errno {
	n, f := h.n, h.n.fsys
	var notes []notice
	n.mu.Lock()
	n.handles--
	f.stats.openHandles.Add(-1)
	if h.write {
		delete(n.writers, h)
		if len(n.writers) == 0 {
			n.writers = nil // a receipt keeps no empty map
		}
	}
	p := decide(n.stateLocked(), event{kind: evRelease, lastWriter: len(n.writers) == 0, lastHandle: n.handles == 0})
	if p.has(stepDiscard) {
		n.discardUploadLocked()
	}
	if n.owing && (p.has(stepCommitLink) || p.has(stepSettle)) {
		n.tree.releasing(n)
	}
	if p.has(stepCommitLink) {
		notes, _ = n.commitLocked(ctx, false)
	}
	if p.has(stepSettle) {
		n.settleLocked(ctx)
	}
	if p.has(stepCancel) {
		n.cancelLocked(ctx)
	}
	if p.has(stepPay) {
		n.owing = false
		n.tree.paid(n)
	}
	gone := p.has(stepGone)
	if gone {
		n.detachLocked()
	}
	n.mu.Unlock()
	h.rmu.Lock()
	h.closeReaderLocked()
	h.rmu.Unlock()
	send(notes)
	if gone {
		if n.want != nil {
			n.ns.dropPending(n.name, n)
			notifyEntry(&n.ns.Inode, n.name)
		} else {
			removeName(&n.Inode)
		}
	}
	return 0
}

func (h *fileHandle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	return h.n.fsys.errno("fallocate", blob.Digest{}, errUnsupported)
}

// symNode is a symbolic link under incoming/ (see incDir.Symlink).
type symNode struct {
	node
	tree   *incTree
	target string

	mu       sync.Mutex
	meta     meta
	detached bool
	gen      uint64
	expiry   *time.Timer
}

var (
	_ = (fs.NodeReadlinker)((*symNode)(nil))
	_ = (fs.NodeGetattrer)((*symNode)(nil))
	_ = (fs.NodeSetattrer)((*symNode)(nil))
)

func (s *symNode) getattr(out *fuse.Attr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.meta.fill(out, syscall.S_IFLNK)
	out.Nlink = 1
	setSize(out, int64(len(s.target)))
}

func (s *symNode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	return []byte(s.target), 0
}

func (s *symNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	s.getattr(&out.Attr)
	return 0
}

func (s *symNode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	s.mu.Lock()
	m := in.Valid
	in.Valid &^= fuse.FATTR_MODE // a link's mode is fixed
	s.meta.set(in, false)
	in.Valid = m
	s.mu.Unlock()
	s.getattr(&out.Attr)
	return 0
}

func (s *symNode) scheduleExpiryLocked() {
	s.gen++
	g := s.gen
	s.expiry = time.AfterFunc(s.fsys.cfg.ReceiptTTL, func() {
		s.mu.Lock()
		stale := s.gen != g || s.detached || s.tree.isClosed()
		if !stale {
			s.detached = true
		}
		s.mu.Unlock()
		if !stale {
			removeName(&s.Inode)
		}
	})
}

func (s *symNode) detach() {
	s.mu.Lock()
	s.detached = true
	if s.expiry != nil {
		s.expiry.Stop()
	}
	s.mu.Unlock()
	s.ForgetPersistent()
}
