package fusefs

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/upkeep"
)

// ctlDir is /.alkblobfs: a fixed set of control files.
type ctlDir struct {
	node
}

var (
	_ = (fs.NodeGetattrer)((*ctlDir)(nil))
	_ = (fs.NodeCreater)((*ctlDir)(nil))
	_ = (fs.NodeMkdirer)((*ctlDir)(nil))
	_ = (fs.NodeUnlinker)((*ctlDir)(nil))
	_ = (fs.NodeRmdirer)((*ctlDir)(nil))
	_ = (fs.NodeRenamer)((*ctlDir)(nil))
	_ = (fs.NodeSymlinker)((*ctlDir)(nil))
	_ = (fs.NodeLinker)((*ctlDir)(nil))
	_ = (fs.NodeMknoder)((*ctlDir)(nil))
	_ = (fs.NodeStatfser)((*ctlDir)(nil))

	_ = (fs.NodeGetattrer)((*ctlFile)(nil))
	_ = (fs.NodeSetattrer)((*ctlFile)(nil))
	_ = (fs.NodeOpener)((*ctlFile)(nil))
	_ = (fs.FileReleaser)((*ctlHandle)(nil))
	_ = (fs.FileReader)((*ctlHandle)(nil))
	_ = (fs.FileWriter)((*ctlHandle)(nil))
)

type ctlKind int

const (
	ctlSweep ctlKind = iota
	ctlSweepTimer
	ctlStats
	ctlScrub
)

func (c *ctlDir) build(ctx context.Context) {
	for _, s := range []struct {
		name string
		kind ctlKind
		ino  uint64
	}{
		{"sweep", ctlSweep, inoSweep},
		{"sweep-timer", ctlSweepTimer, inoSweepTimer},
		{"stats", ctlStats, inoStats},
		{"scrub", ctlScrub, inoScrub},
	} {
		f := &ctlFile{node: node{fsys: c.fsys}, kind: s.kind}
		c.AddChild(s.name, c.NewPersistentInode(ctx, f, fs.StableAttr{Mode: syscall.S_IFREG, Ino: s.ino}), false)
	}
}

func (c *ctlDir) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	c.fsys.dirAttr(&out.Attr, 0o755, c.fsys.born)
	return 0
}

func (c *ctlDir) refuse(op string) syscall.Errno {
	return c.fsys.errno(op, blob.Digest{}, errNotPermitted)
}

func (c *ctlDir) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, c.refuse("create")
}
func (c *ctlDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, c.refuse("mkdir")
}
func (c *ctlDir) Unlink(ctx context.Context, name string) syscall.Errno { return c.refuse("unlink") }
func (c *ctlDir) Rmdir(ctx context.Context, name string) syscall.Errno  { return c.refuse("rmdir") }
func (c *ctlDir) Rename(ctx context.Context, name string, np fs.InodeEmbedder, nn string, flags uint32) syscall.Errno {
	return c.refuse("rename")
}
func (c *ctlDir) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, c.refuse("symlink")
}
func (c *ctlDir) Link(ctx context.Context, t fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, c.refuse("link")
}
func (c *ctlDir) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, c.refuse("mknod")
}

// ctlFile is one control file. Reads render the current state at the
// first read of a handle (direct I/O, so the size 0 in stat does not cut
// them short); an open takes one command, in one write (see Write).
type ctlFile struct {
	node
	kind ctlKind
}

func (c *ctlFile) writable() bool { return c.kind != ctlStats }

// name is the control file's name, for logs.
func (c *ctlFile) name() string {
	name, _ := c.Parent()
	return name
}

func (c *ctlFile) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	mode := uint32(0o444)
	if c.writable() {
		mode = 0o644
	}
	out.Mode = syscall.S_IFREG | mode
	out.Nlink = 1
	out.Uid, out.Gid = c.fsys.uid, c.fsys.gid
	setTimes(&out.Attr, c.fsys.born, c.fsys.born, c.fsys.born)
	out.SetTimeout(0)
	return 0
}

// Setattr accepts, and ignores, the truncation of `echo run > sweep` and
// the time updates the kernel sends around writes; mode and owner changes
// are EPERM.
func (c *ctlFile) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	const times = fuse.FATTR_ATIME | fuse.FATTR_ATIME_NOW | fuse.FATTR_MTIME | fuse.FATTR_MTIME_NOW | fuse.FATTR_CTIME
	if in.Valid&^(fuse.FATTR_SIZE|fuse.FATTR_FH|fuse.FATTR_LOCKOWNER|fuse.FATTR_KILL_SUIDGID|times) != 0 {
		return c.fsys.errno("setattr", blob.Digest{}, errNotPermitted)
	}
	if _, ok := in.GetSize(); ok && !c.writable() {
		return c.fsys.errno("setattr", blob.Digest{}, errReadOnly)
	}
	return c.Getattr(ctx, f, out)
}

func (c *ctlFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY && !c.writable() {
		return nil, 0, c.fsys.errno("open", blob.Digest{}, errReadOnly)
	}
	c.fsys.stats.controlHandles.Add(1)
	return &ctlHandle{c: c}, fuse.FOPEN_DIRECT_IO, 0
}

// Release: the lazy-detach warning counts the open control files.
func (h *ctlHandle) Release(ctx context.Context) syscall.Errno {
	h.c.fsys.stats.controlHandles.Add(-1)
	return 0
}

type ctlHandle struct {
	c *ctlFile

	mu      sync.Mutex
	content []byte
	wrote   bool   // a command came through this handle and did not fail
	undo    func() // takes the timer back to before that command
}

func (h *ctlHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.content == nil || off == 0 {
		b, err := h.c.render(ctx)
		if err != nil {
			return nil, h.c.fsys.errno("read", blob.Digest{}, err)
		}
		h.content = b
	}
	if off >= int64(len(h.content)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(h.content[off:min(int64(len(h.content)), off+int64(len(dest)))]), 0
}

// Write runs one command, parsed by upkeep's grammar (upkeep.Command and
// its parsers); bad input is EINVAL and changes nothing. A sweep's write
// returns when the sweep has ended.
//
// A command is written at offset 0: a pwrite elsewhere is a piece of
// something, not a command, and is EINVAL. An open takes one command, in
// one write: a shell writes `printf
// '1h\n2h'` or `{ echo 1h; echo 2h; }` as two writes, and the second is
// refused, and for the timer undoes the first, so that the command as a
// whole changes nothing rather than leave whichever line came last. An
// empty write is no command (the open with O_TRUNC of `: > file`, and a
// truncate, are none either: see Setattr).
func (h *ctlHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	f := h.c.fsys
	if len(data) == 0 {
		return 0, 0
	}
	h.mu.Lock()
	again, undo := h.wrote, h.undo
	if !again && off != 0 {
		h.mu.Unlock()
		f.log.Warn("a control file takes its command at offset 0: refused a write elsewhere", "file", h.c.name(), "offset", off,
			"input", upkeep.Clip(string(data)))
		return 0, f.errno("control", blob.Digest{}, fmt.Errorf("%w: %s: a write at offset %d, not 0", errBadInput, h.c.name(), off))
	}
	h.wrote, h.undo = true, nil
	h.mu.Unlock()
	if again {
		if undo != nil {
			undo()
		}
		f.log.Warn("a control file takes one command per open, in one write: refused the rest", "file", h.c.name(),
			"input", upkeep.Clip(string(data)), "first_undone", undo != nil)
		return 0, f.errno("control", blob.Digest{}, fmt.Errorf("%w: %s: more than one write in one open", errBadInput, h.c.name()))
	}
	cmd := upkeep.Command(data)
	var err error
	switch h.c.kind {
	case ctlSweep, ctlScrub:
		if err = upkeep.CheckRun(cmd); err != nil {
			f.log.Warn("bad command; write run", "file", h.c.name(), "input", upkeep.Clip(cmd))
			err = fmt.Errorf("%s: %w", h.c.name(), err)
			break
		}
		if h.c.kind == ctlSweep {
			_, err = f.upkeep.Sweeper.Run(ctx, "control file")
		} else {
			_, err = f.upkeep.Scrubber.Run(ctx, "control file")
		}
	case ctlSweepTimer:
		if undo, err = f.upkeep.Sweeper.Set(cmd); err != nil {
			f.log.Warn("bad sweep-timer command; write off, on or a duration of at least 1s like 15m", "input", upkeep.Clip(cmd))
			break
		}
		h.mu.Lock()
		h.undo = undo
		h.mu.Unlock()
	default:
		err = errReadOnly
	}
	if err != nil {
		// A command that failed did nothing: the same open may send one
		// again (a write interrupted by a signal is EINTR, and retried).
		h.mu.Lock()
		h.wrote = false
		h.mu.Unlock()
		return 0, f.errno("control", blob.Digest{}, err)
	}
	return uint32(len(data)), 0
}

// render is the file's content for the reader behind ctx: reports name
// digests and operators' details only to root and the mounting user
// (Stats.ForReader), counts to everyone.
func (c *ctlFile) render(ctx context.Context) ([]byte, error) {
	f := c.fsys
	priv := f.privileged(ctx)
	switch c.kind {
	case ctlSweep:
		rep, ok := f.upkeep.Sweeper.LastReport()
		if !ok {
			return []byte("{}\n"), nil
		}
		if !priv {
			rep = *redactSweep(&rep)
		}
		return marshal(rep)
	case ctlSweepTimer:
		return []byte(f.upkeep.Sweeper.String() + "\n"), nil
	case ctlScrub:
		rep, ok := f.upkeep.Scrubber.LastReport()
		if !ok {
			return []byte("{}\n"), nil
		}
		if !priv {
			rep = *redactScrub(&rep)
		}
		return marshal(rep)
	default:
		return marshal(f.Stats(ctx).ForReader(priv))
	}
}

func marshal(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
