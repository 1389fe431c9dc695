// Command fusefloor is the bench's "go-fuse floor": the least a daemon on
// alkblobfs's go-fuse version and mount options can do for a copy into
// incoming/, so that scripts/bench.sh can say how much of alkblobfs's
// daemon CPU per file is go-fuse's and the kernel's, and how much its own.
//
//	fusefloor [-debug] MOUNTPOINT
//
// It serves bench/incoming/ (the path a namespace's incoming/ has under a
// mount) and lets anything be made under it: mkdir, create, write, flush,
// release, setattr (size, mode, owner, times), rename, unlink, rmdir,
// getattr, lookup and readdir, enough for cp -r, tar -x and rsync -a to
// finish and exit 0. It keeps no content: a write only moves the file's
// size, and a read finds nothing (EOPNOTSUPP). It logs "msg=mounted" once
// it serves, like `alkblobfs mount`, and unmounts on SIGTERM or SIGINT.
//
// The mount options and capabilities are those of fusefs/mount.go, and a
// file opened for writing is opened as fusefs's writeOpen opens it
// (FOPEN_DIRECT_IO). This program may not import fusefs (it must stay a
// floor, nothing of the product in it), so they are written out here and
// TestFloorMatchesMount compares what the kernel is told by each.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// As fusefs/mount.go has them.
const (
	maxWrite     = 1 << 20
	maxReadAhead = 1 << 20
	timeout      = time.Second // fusefs's defaultTimeout
	// writeOpen: fusefs/incdir.go's, for a descriptor open for writing.
	writeOpen = fuse.FOPEN_DIRECT_IO
)

func main() {
	debug := flag.Bool("debug", false, "log every FUSE request")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: fusefloor [-debug] MOUNTPOINT")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	lg := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(flag.Arg(0), *debug, lg); err != nil {
		lg.Error("fusefloor", "err", err)
		os.Exit(1)
	}
}

func run(dir string, debug bool, lg *slog.Logger) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	sec := timeout
	opts := &gofs.Options{
		EntryTimeout: &sec,
		AttrTimeout:  &sec,
		MountOptions: fuse.MountOptions{
			MaxWrite:          maxWrite,
			MaxReadAhead:      maxReadAhead,
			MaxBackground:     64,
			FsName:            "fusefloor",
			Name:              "fusefloor",
			DirectMount:       os.Geteuid() == 0,
			Debug:             debug,
			ExtraCapabilities: fuse.CAP_ATOMIC_O_TRUNC | fuse.CAP_READDIRPLUS_AUTO | fuse.CAP_HANDLE_KILLPRIV_V2 | fuse.CAP_DIRECT_IO_ALLOW_MMAP,
			// ExplicitDataCacheControl as fusefs has it.
			ExplicitDataCacheControl: true,
		},
		RootStableAttr: &gofs.StableAttr{Ino: 1},
	}
	if debug {
		opts.Logger = log.New(os.Stderr, "", 0)
		opts.MountOptions.Logger = opts.Logger
	}
	root := newDir(0o755, 0, 0)
	server, err := gofs.Mount(abs, root, opts)
	if err != nil {
		return fmt.Errorf("mount %s: %w", abs, err)
	}
	// fusefs raises the mount's readahead the same way (raiseReadahead).
	var st unix.Stat_t
	if err := unix.Stat(abs, &st); err == nil {
		p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
		_ = os.WriteFile(p, []byte(strconv.Itoa(maxReadAhead>>10)), 0)
	}
	lg.Info("mounted", "mountpoint", abs)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		if err := server.Unmount(); err != nil {
			// busy: detach, and serve the open files until closed
			_ = unix.Unmount(abs, unix.MNT_DETACH)
		}
	}()
	server.Wait()
	lg.Info("unmounted", "mountpoint", abs)
	return nil
}

// meta is what getattr answers: no content, only its size.
type meta struct {
	mu                  sync.Mutex
	mode, uid, gid      uint32
	size                uint64
	atime, mtime, ctime time.Time
}

func newMeta(mode, uid, gid uint32) meta {
	now := time.Now()
	return meta{mode: mode &^ syscall.S_IFMT, uid: uid, gid: gid, atime: now, mtime: now, ctime: now}
}

func (m *meta) fill(in *gofs.Inode, out *fuse.Attr) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out.Ino = in.StableAttr().Ino
	out.Mode = in.StableAttr().Mode | m.mode
	out.Uid, out.Gid = m.uid, m.gid
	out.SetTimes(&m.atime, &m.mtime, &m.ctime)
	if in.StableAttr().Mode == syscall.S_IFDIR {
		out.Nlink = 2
		return
	}
	// fusefs's setSize: cp sizes its buffers from st_blksize.
	out.Nlink = 1
	out.Size = m.size
	out.Blksize = 1 << 20
	out.Blocks = (m.size + 4095) / 4096 * 8
}

func (m *meta) set(in *fuse.SetAttrIn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if sz, ok := in.GetSize(); ok {
		m.size, m.mtime = sz, now
	}
	if mode, ok := in.GetMode(); ok {
		m.mode = mode &^ syscall.S_IFMT
	}
	if uid, ok := in.GetUID(); ok {
		m.uid = uid
	}
	if gid, ok := in.GetGID(); ok {
		m.gid = gid
	}
	if t, ok := in.GetATime(); ok {
		m.atime = t
	}
	if t, ok := in.GetMTime(); ok {
		m.mtime = t
	}
	m.ctime = now
}

func (m *meta) touch() {
	m.mu.Lock()
	m.mtime = time.Now()
	m.ctime = m.mtime
	m.mu.Unlock()
}

// caller is the uid and gid a new node gets, as in fusefs.
func caller(ctx context.Context) (uint32, uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid
	}
	return 0, 0
}

// dir is every directory: the root, bench, incoming/ and what is made
// under it. Its children live in go-fuse's inode tree, which does the
// default lookup and readdir and moves names on rename and unlink.
type dir struct {
	gofs.Inode
	m meta
}

var (
	_ gofs.NodeOnAdder    = (*dir)(nil)
	_ gofs.NodeGetattrer  = (*dir)(nil)
	_ gofs.NodeSetattrer  = (*dir)(nil)
	_ gofs.NodeMkdirer    = (*dir)(nil)
	_ gofs.NodeCreater    = (*dir)(nil)
	_ gofs.NodeRenamer    = (*dir)(nil)
	_ gofs.NodeUnlinker   = (*dir)(nil)
	_ gofs.NodeRmdirer    = (*dir)(nil)
	_ gofs.NodeGetxattrer = (*dir)(nil)
)

func newDir(mode, uid, gid uint32) *dir { return &dir{m: newMeta(mode, uid, gid)} }

// OnAdd gives the root bench/incoming/.
func (d *dir) OnAdd(ctx context.Context) {
	if !d.IsRoot() {
		return
	}
	ns := d.NewPersistentInode(ctx, newDir(0o755, 0, 0), gofs.StableAttr{Mode: syscall.S_IFDIR})
	d.AddChild("bench", ns, false)
	inc := ns.NewPersistentInode(ctx, newDir(0o777, 0, 0), gofs.StableAttr{Mode: syscall.S_IFDIR})
	ns.AddChild("incoming", inc, false)
}

func (d *dir) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.m.fill(&d.Inode, &out.Attr)
	return 0
}

func (d *dir) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	d.m.set(in)
	d.m.fill(&d.Inode, &out.Attr)
	return 0
}

func (d *dir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	uid, gid := caller(ctx)
	sub := newDir(mode, uid, gid)
	in := d.NewPersistentInode(ctx, sub, gofs.StableAttr{Mode: syscall.S_IFDIR})
	sub.m.fill(in, &out.Attr)
	d.m.touch()
	return in, 0
}

func (d *dir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	uid, gid := caller(ctx)
	f := &file{m: newMeta(mode, uid, gid)}
	in := d.NewPersistentInode(ctx, f, gofs.StableAttr{Mode: syscall.S_IFREG})
	f.m.fill(in, &out.Attr)
	d.m.touch()
	return in, &handle{f: f}, writeOpen, 0
}

// Rename: go-fuse moves the name in the tree once this returns 0.
func (d *dir) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if flags&unix.RENAME_NOREPLACE != 0 && newParent.EmbeddedInode().GetChild(newName) != nil {
		return syscall.EEXIST
	}
	d.m.touch()
	return 0
}

func (d *dir) Unlink(ctx context.Context, name string) syscall.Errno {
	d.m.touch()
	return 0
}

func (d *dir) Rmdir(ctx context.Context, name string) syscall.Errno {
	if ch := d.GetChild(name); ch != nil && len(ch.Children()) > 0 {
		return syscall.ENOTEMPTY
	}
	d.m.touch()
	return 0
}

// Getxattr answers as fusefs's nodes do for names they do not keep.
func (d *dir) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	return xattr(attr)
}

func xattr(attr string) (uint32, syscall.Errno) {
	if len(attr) < 5 || attr[:5] != "user." {
		return 0, syscall.EOPNOTSUPP
	}
	return 0, syscall.ENODATA
}

// file keeps its attributes and size, not its bytes.
type file struct {
	gofs.Inode
	m meta
}

var (
	_ gofs.NodeGetattrer  = (*file)(nil)
	_ gofs.NodeSetattrer  = (*file)(nil)
	_ gofs.NodeOpener     = (*file)(nil)
	_ gofs.NodeGetxattrer = (*file)(nil)
)

func (f *file) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.m.fill(&f.Inode, &out.Attr)
	return 0
}

func (f *file) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	f.m.set(in)
	f.m.fill(&f.Inode, &out.Attr)
	return 0
}

func (f *file) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE == syscall.O_RDONLY {
		return &handle{f: f}, 0, 0
	}
	if flags&syscall.O_TRUNC != 0 {
		f.m.mu.Lock()
		f.m.size = 0
		f.m.mu.Unlock()
	}
	return &handle{f: f}, writeOpen, 0
}

func (f *file) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	return xattr(attr)
}

// handle is an open file: a write moves the size, and nothing is kept.
type handle struct{ f *file }

var (
	_ gofs.FileWriter   = (*handle)(nil)
	_ gofs.FileFlusher  = (*handle)(nil)
	_ gofs.FileReleaser = (*handle)(nil)
	_ gofs.FileFsyncer  = (*handle)(nil)
)

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	m := &h.f.m
	m.mu.Lock()
	if end := uint64(off) + uint64(len(data)); end > m.size {
		m.size = end
	}
	m.mtime = time.Now()
	m.ctime = m.mtime
	m.mu.Unlock()
	return uint32(len(data)), 0
}

func (h *handle) Flush(ctx context.Context) syscall.Errno               { return 0 }
func (h *handle) Release(ctx context.Context) syscall.Errno             { return 0 }
func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno { return 0 }
