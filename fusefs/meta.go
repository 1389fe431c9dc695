package fusefs

import (
	"context"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

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
