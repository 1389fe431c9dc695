package fusefs

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

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
