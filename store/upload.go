package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// Upload is a put whose content arrives as random-access writes, the way a
// program writes a file: the mount's incoming/ files are Uploads. Content
// is staged where it will be published when the large engine allows it
// (engines.RandomStage: the local engine's stage file, published by
// rename), else in a scratch file. Sequential writes from offset 0 are
// hashed as they arrive; any other pattern is re-read once at Commit.
//
// An Upload is safe for concurrent use. Exactly one of Commit or Discard
// ends it; Discard after either is a no-op.
type Upload struct {
	s  *Store
	mu sync.Mutex
	st engines.RandomStage
	// own is true when st is the large engine's stage (Commit publishes it
	// in place); false for a scratch file.
	own  bool
	size int64
	// h hashes sequential writes as they arrive, through pipe; both are
	// nil once the writes stop being sequential.
	h    *contentHash
	pipe *hashPipe
	done bool
}

// NewUpload starts an empty upload.
func (s *Store) NewUpload(ctx context.Context) (*Upload, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	u := &Upload{s: s}
	u.startHash()
	if s.large != nil {
		st, err := s.large.Stage(ctx)
		if err != nil {
			return nil, blob.Wrap("stage", s.large.Name(), Digest{}, err)
		}
		if rs, ok := st.(engines.RandomStage); ok {
			u.st, u.own = rs, true
			return u, nil
		}
		st.Discard()
	}
	f, err := os.CreateTemp(s.scratch, "upload-*")
	if err != nil {
		return nil, fmt.Errorf("upload: scratch file: %w", err)
	}
	u.st = &scratchFile{f: f}
	return u, nil
}

// WriteAt writes p at off.
func (u *Upload) WriteAt(p []byte, off int64) (int, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.done {
		return 0, os.ErrClosed
	}
	if off < 0 {
		return 0, fmt.Errorf("upload: negative offset %d", off)
	}
	if u.s.kv != nil && u.s.large == nil && off+int64(len(p)) > u.s.threshold {
		return 0, fmt.Errorf("upload: %d bytes over the %s limit of %d bytes: %w", off+int64(len(p)), u.s.mode, u.s.threshold, ErrTooLarge)
	}
	n, err := u.st.WriteAt(p, off)
	if u.pipe != nil {
		if off == u.pipe.n && off == u.size {
			u.pipe.Write(p[:n])
		} else {
			u.stopHash() // rewritten or sparse: re-read at Commit
		}
	}
	u.size = max(u.size, off+int64(n))
	return n, err
}

// ReadAt reads back what has been written (holes read as zeros).
func (u *Upload) ReadAt(p []byte, off int64) (int, error) {
	u.mu.Lock()
	done := u.done
	u.mu.Unlock()
	if done {
		return 0, os.ErrClosed
	}
	return u.st.ReadAt(p, off)
}

// Truncate sets the size (O_TRUNC, ftruncate).
func (u *Upload) Truncate(size int64) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.done {
		return os.ErrClosed
	}
	if size < 0 {
		return fmt.Errorf("upload: negative size %d", size)
	}
	if u.s.kv != nil && u.s.large == nil && size > u.s.threshold {
		return fmt.Errorf("upload: %d bytes over the %s limit of %d bytes: %w", size, u.s.mode, u.s.threshold, ErrTooLarge)
	}
	if err := u.st.Truncate(size); err != nil {
		return err
	}
	switch {
	case size == 0 && (u.pipe == nil || u.pipe.n > 0):
		u.stopHash()
		u.startHash()
	case u.pipe != nil && size != u.pipe.n:
		u.stopHash()
	}
	u.size = size
	return nil
}

// Size is the current length.
func (u *Upload) Size() int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.size
}

// Commit publishes the content and returns its digest and a pin. With want
// non-nil it is a verified put: a mismatch returns ErrVerification and
// publishes nothing. Whatever the outcome, the upload is over.
func (u *Upload) Commit(ctx context.Context, want *Digest, opts ...PutOption) (Digest, *Pin, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.done {
		return Digest{}, nil, os.ErrClosed
	}
	u.done = true
	defer u.st.Discard()
	var h *contentHash
	if u.pipe != nil && u.pipe.n == u.size {
		u.pipe.wait()
		h = u.h
	}
	u.stopHash()
	s, o := u.s, applyOpts(opts)
	if s.kv != nil && u.size <= s.threshold {
		b := make([]byte, u.size)
		if _, err := io.ReadFull(io.NewSectionReader(u.st, 0, u.size), b); err != nil {
			return Digest{}, nil, fmt.Errorf("upload: read back: %w", err)
		}
		return s.putSmall(ctx, b, want, o)
	}
	if s.large == nil {
		return Digest{}, nil, fmt.Errorf("upload: %d bytes over the %s limit of %d bytes: %w", u.size, s.mode, s.threshold, ErrTooLarge)
	}
	if !u.own {
		return s.putLarge(ctx, nil, io.NewSectionReader(u.st, 0, u.size), u.size, want, o)
	}
	if h == nil {
		h = newContentHash()
		if err := s.copyInto(ctx, io.Discard, h, nil, io.NewSectionReader(u.st, 0, u.size), u.size); err != nil {
			return Digest{}, nil, err
		}
	}
	return s.commitLarge(ctx, u.st, h, want, o)
}

// Discard drops the upload.
func (u *Upload) Discard() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.done {
		return nil
	}
	u.done = true
	u.stopHash()
	return u.st.Discard()
}

func (u *Upload) startHash() {
	u.h = newContentHash()
	u.pipe = newHashPipe(u.h)
}

// stopHash ends the incremental hash, if any, without leaking its
// goroutine.
func (u *Upload) stopHash() {
	if u.pipe != nil {
		u.pipe.wait()
		u.h, u.pipe = nil, nil
	}
}

// scratchFile stages an upload outside the engines, for stores whose large
// engine has no random-access stage (or no large engine at all).
type scratchFile struct {
	f    *os.File
	once sync.Once
}

func (s *scratchFile) Write(p []byte) (int, error) {
	return 0, errors.New("scratch: sequential write unsupported")
}
func (s *scratchFile) WriteAt(p []byte, off int64) (int, error) { return s.f.WriteAt(p, off) }
func (s *scratchFile) ReadAt(p []byte, off int64) (int, error)  { return s.f.ReadAt(p, off) }
func (s *scratchFile) Truncate(n int64) error                   { return s.f.Truncate(n) }
func (s *scratchFile) Commit(context.Context, blob.Digest) error {
	return errors.New("scratch: not publishable")
}
func (s *scratchFile) Size() (int64, error) {
	fi, err := s.f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func (s *scratchFile) Discard() error {
	var err error
	s.once.Do(func() {
		err = errors.Join(s.f.Close(), os.Remove(s.f.Name()))
	})
	return err
}
