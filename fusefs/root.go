package fusefs

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// controlName is the control directory at the root. Namespace names cannot
// start with '.', so it never shadows one.
const controlName = ".alkblobfs"

// rootDir is the mount's root: one directory per namespace (the registry
// is the truth; lookups ask it) plus the control directory.
type rootDir struct {
	node
}

var (
	_ = (fs.NodeOnAdder)((*rootDir)(nil))
	_ = (fs.NodeGetattrer)((*rootDir)(nil))
	_ = (fs.NodeSetattrer)((*rootDir)(nil))
	_ = (fs.NodeLookuper)((*rootDir)(nil))
	_ = (fs.NodeOpendirHandler)((*rootDir)(nil))
	_ = (fs.NodeMkdirer)((*rootDir)(nil))
	_ = (fs.NodeRmdirer)((*rootDir)(nil))
	_ = (fs.NodeCreater)((*rootDir)(nil))
	_ = (fs.NodeUnlinker)((*rootDir)(nil))
	_ = (fs.NodeRenamer)((*rootDir)(nil))
	_ = (fs.NodeSymlinker)((*rootDir)(nil))
	_ = (fs.NodeMknoder)((*rootDir)(nil))
	_ = (fs.NodeLinker)((*rootDir)(nil))
	_ = (fs.NodeStatfser)((*rootDir)(nil))
)

// OnAdd builds the static control directory.
func (r *rootDir) OnAdd(ctx context.Context) {
	ctl := &ctlDir{node: node{fsys: r.fsys}}
	ch := r.NewPersistentInode(ctx, ctl, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: inoControl})
	r.AddChild(controlName, ch, false)
	ctl.build(ctx)
}

func (r *rootDir) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	r.fsys.dirAttr(&out.Attr, 0o755, r.fsys.born)
	return 0
}

// Setattr accepts and ignores attribute changes, so that rsync and cp -a
// finishing a copy into the mount do not fail on the directories they
// pass through.
func (r *rootDir) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return r.Getattr(ctx, f, out)
}

func (r *rootDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := tooLong(name); e != 0 {
		return nil, e
	}
	if name == controlName {
		r.fsys.dirAttr(&out.Attr, 0o755, r.fsys.born)
		return r.GetChild(controlName), 0
	}
	if namespaces.ValidName(name) != nil {
		return nil, syscall.ENOENT
	}
	ok, err := r.fsys.reg.Exists(ctx, name)
	if err != nil {
		return nil, r.fsys.errno("lookup", blob.Digest{}, err)
	}
	if !ok {
		// Removed behind the mount's back (another process): forget our
		// side of it unless puts are in flight there.
		r.fsys.forgetNS(name)
		return nil, syscall.ENOENT
	}
	d, _ := r.fsys.nsDirFor(name)
	if err := d.attr(ctx, &out.Attr); err != nil {
		return nil, r.fsys.errno("lookup", blob.Digest{}, err)
	}
	return d.inode(ctx, &r.Inode), 0
}

// OpendirHandle lists the control directory and the namespaces, streamed
// (see rootStream): a million namespaces list in constant memory.
func (r *rootDir) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return &rootStream{r: r}, 0, 0
}

// rootStream lists the root a page at a time: ".alkblobfs", then every
// namespace in byte order, each page a fresh Names call from the last name
// seen, holding no registry state between READDIR requests.
type rootStream struct {
	r *rootDir

	mu    sync.Mutex
	off   uint64
	page  []string
	i     int
	after string
	eof   bool
	last  string
}

var (
	_ = (fs.FileReaddirenter)((*rootStream)(nil))
	_ = (fs.FileLookuper)((*rootStream)(nil))
	_ = (fs.FileSeekdirer)((*rootStream)(nil))
	_ = (fs.FileReleasedirer)((*rootStream)(nil))
)

func (s *rootStream) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.next()
}

func (s *rootStream) next() (*fuse.DirEntry, syscall.Errno) {
	if s.off == 0 {
		s.off = 1
		return &fuse.DirEntry{Name: controlName, Mode: syscall.S_IFDIR, Ino: inoControl, Off: 1}, 0
	}
	if s.i >= len(s.page) {
		if s.eof {
			return nil, 0
		}
		f := s.r.fsys
		page := s.page[:0]
		for name, err := range f.reg.Names(f.ctx, s.after) {
			if err != nil {
				return nil, f.errno("readdir", blob.Digest{}, err)
			}
			page = append(page, name)
			if len(page) == streamPage {
				break
			}
		}
		s.page, s.i, s.eof = page, 0, len(page) < streamPage
		if len(page) == 0 {
			return nil, 0
		}
		s.after = page[len(page)-1]
	}
	name := s.page[s.i]
	s.i++
	s.off++
	s.last = name
	return &fuse.DirEntry{Name: name, Mode: syscall.S_IFDIR, Ino: nameIno(name), Off: s.off}, 0
}

// Lookup serves READDIRPLUS: the namespace just listed exists.
func (s *rootStream) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	s.mu.Lock()
	last := s.last
	s.mu.Unlock()
	if name != "" && name == last {
		d, _ := s.r.fsys.nsDirFor(name)
		if err := d.attr(ctx, &out.Attr); err != nil {
			return nil, s.r.fsys.errno("lookup", blob.Digest{}, err)
		}
		return d.inode(ctx, &s.r.Inode), 0
	}
	return s.r.Lookup(ctx, name, out)
}

// Seekdir re-lists from the start and skips (offsets are ordinals).
func (s *rootStream) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	s.mu.Lock()
	defer s.mu.Unlock()
	return seekOrdinal(s.off, off, func() {
		s.off, s.page, s.i, s.after, s.eof, s.last = 0, s.page[:0], 0, "", false, ""
	}, s.next)
}

func (s *rootStream) Releasedir(ctx context.Context, releaseFlags uint32) {}

// nameIno is the d_ino a plain READDIR reports for a namespace whose
// directory inode the kernel has not looked up yet: any stable non-zero
// number does (glibc and tools skip d_ino 0); stat reports the real one.
func nameIno(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64() | 1<<63
}

// Mkdir creates a namespace.
func (r *rootDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := tooLong(name); e != 0 {
		return nil, e
	}
	if name == controlName {
		return nil, r.fsys.errno("mkdir", blob.Digest{}, errExists)
	}
	// The namespace is the caller's, with the mode mkdir asked for (the
	// kernel has applied the umask).
	uid, gid := caller(ctx, r.fsys)
	p := namespaces.Perm{Uid: uid, Gid: gid, Mode: mode & 0o7777}
	if err := r.fsys.reg.CreatePerm(uninterrupted(ctx), name, p); err != nil {
		return nil, r.fsys.errno("mkdir", blob.Digest{}, err)
	}
	r.fsys.log.Info("namespace created", "namespace", name, "uid", uid, "gid", gid, "mode", fmt.Sprintf("%04o", p.Mode))
	d, _ := r.fsys.nsDirFor(name)
	d.cachePerm(p)
	if err := d.attr(ctx, &out.Attr); err != nil {
		return nil, r.fsys.errno("mkdir", blob.Digest{}, err)
	}
	return d.inode(ctx, &r.Inode), 0
}

// Rmdir removes an empty namespace: ENOTEMPTY while it references any
// blob, or while its incoming/ has puts in flight. Receipts do not keep it.
func (r *rootDir) Rmdir(ctx context.Context, name string) syscall.Errno {
	if name == controlName {
		return r.fsys.errno("rmdir", blob.Digest{}, errNotPermitted)
	}
	d, _ := r.fsys.nsDirFor(name)
	if d.busy() {
		return r.fsys.errno("rmdir", blob.Digest{}, errDirNotEmpty)
	}
	if err := r.fsys.reg.Remove(uninterrupted(ctx), name); err != nil {
		return r.fsys.errno("rmdir", blob.Digest{}, err)
	}
	r.fsys.log.Info("namespace removed", "namespace", name)
	r.fsys.dropNSDir(name, d)
	d.teardown()
	return 0
}

// forgetNS drops the node state of a namespace that no longer exists,
// unless puts are still in flight in it.
func (f *FS) forgetNS(name string) {
	f.nsMu.Lock()
	d, ok := f.ns[name]
	f.nsMu.Unlock()
	if !ok || d.busy() {
		return
	}
	f.dropNSDir(name, d)
	if p := d.EmbeddedInode(); p != nil && d.inited.Load() {
		if _, parent := p.Parent(); parent != nil {
			parent.RmChild(name)
		}
	}
	d.teardown()
}

func (r *rootDir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	r.fsys.log.Info("files cannot be created at the root; mkdir a namespace and copy into <namespace>/incoming/", "name", name)
	return nil, nil, 0, r.fsys.errno("create", blob.Digest{}, errNotPermitted)
}

func (r *rootDir) Unlink(ctx context.Context, name string) syscall.Errno {
	return r.fsys.errno("unlink", blob.Digest{}, errNotPermitted)
}

func (r *rootDir) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return r.fsys.errno("rename", blob.Digest{}, errNotPermitted)
}

func (r *rootDir) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, r.fsys.errno("symlink", blob.Digest{}, errNotPermitted)
}

func (r *rootDir) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, r.fsys.errno("mknod", blob.Digest{}, errNotPermitted)
}

func (r *rootDir) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, r.fsys.errno("link", blob.Digest{}, errNotPermitted)
}
