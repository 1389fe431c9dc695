package fusefs

import (
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// timedFS wraps the node tree's raw filesystem and reports how long each
// request took to Config.Observe (the metrics' latency histogram). The
// requests a workload is made of are timed; the rest pass through the
// embedded filesystem untimed. Reads served by passthrough never reach the
// daemon and are not counted.
type timedFS struct {
	fuse.RawFileSystem
	observe func(op string, d time.Duration)
}

func (t *timedFS) done(op string, start time.Time) { t.observe(op, time.Since(start)) }

func (t *timedFS) Lookup(c <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	defer t.done("lookup", time.Now())
	return t.RawFileSystem.Lookup(c, h, name, out)
}

func (t *timedFS) GetAttr(c <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	defer t.done("getattr", time.Now())
	return t.RawFileSystem.GetAttr(c, in, out)
}

func (t *timedFS) SetAttr(c <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	defer t.done("setattr", time.Now())
	return t.RawFileSystem.SetAttr(c, in, out)
}

func (t *timedFS) Mkdir(c <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	defer t.done("mkdir", time.Now())
	return t.RawFileSystem.Mkdir(c, in, name, out)
}

func (t *timedFS) Unlink(c <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	defer t.done("unlink", time.Now())
	return t.RawFileSystem.Unlink(c, h, name)
}

func (t *timedFS) Rmdir(c <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	defer t.done("rmdir", time.Now())
	return t.RawFileSystem.Rmdir(c, h, name)
}

func (t *timedFS) Rename(c <-chan struct{}, in *fuse.RenameIn, from, to string) fuse.Status {
	defer t.done("rename", time.Now())
	return t.RawFileSystem.Rename(c, in, from, to)
}

func (t *timedFS) GetXAttr(c <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	defer t.done("getxattr", time.Now())
	return t.RawFileSystem.GetXAttr(c, h, attr, dest)
}

func (t *timedFS) Create(c <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	defer t.done("create", time.Now())
	return t.RawFileSystem.Create(c, in, name, out)
}

func (t *timedFS) Open(c <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	defer t.done("open", time.Now())
	return t.RawFileSystem.Open(c, in, out)
}

func (t *timedFS) Read(c <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	defer t.done("read", time.Now())
	return t.RawFileSystem.Read(c, in, buf)
}

func (t *timedFS) Write(c <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	defer t.done("write", time.Now())
	return t.RawFileSystem.Write(c, in, data)
}

// Writev is how go-fuse delivers writes first (Write only if it is
// ENOSYS); both are "write".
func (t *timedFS) Writev(c <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	defer t.done("write", time.Now())
	return t.RawFileSystem.Writev(c, in, data)
}

func (t *timedFS) Flush(c <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	defer t.done("flush", time.Now())
	return t.RawFileSystem.Flush(c, in)
}

func (t *timedFS) Fsync(c <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	defer t.done("fsync", time.Now())
	return t.RawFileSystem.Fsync(c, in)
}

func (t *timedFS) Release(c <-chan struct{}, in *fuse.ReleaseIn) {
	defer t.done("release", time.Now())
	t.RawFileSystem.Release(c, in)
}

func (t *timedFS) OpenDir(c <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	defer t.done("opendir", time.Now())
	return t.RawFileSystem.OpenDir(c, in, out)
}

func (t *timedFS) ReadDir(c <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	defer t.done("readdir", time.Now())
	return t.RawFileSystem.ReadDir(c, in, out)
}

func (t *timedFS) ReadDirPlus(c <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	defer t.done("readdirplus", time.Now())
	return t.RawFileSystem.ReadDirPlus(c, in, out)
}

func (t *timedFS) StatFs(c <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	defer t.done("statfs", time.Now())
	return t.RawFileSystem.StatFs(c, h, out)
}
