package mem

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// MaxStageSize bounds one stage. Memory is the medium, so a write at an
// absurd offset (a sparse file, a bad client) must fail, not take the
// process down.
const MaxStageSize = 4 << 30

var _ engines.RandomStage = (*stage)(nil)

// Stage implements engines.Large.
func (e *Engine) Stage(ctx context.Context) (engines.Stage, error) {
	if err := ctx.Err(); err != nil {
		return nil, blob.Wrap("stage", e.Name(), blob.Digest{}, err)
	}
	e.mu.RLock()
	closed := e.m == nil
	e.mu.RUnlock()
	if closed {
		return nil, blob.Wrap("stage", e.Name(), blob.Digest{}, blob.ErrClosed)
	}
	e.stages.Add(1)
	return &stage{e: e}, nil
}

// stage is an in-memory engines.RandomStage. Write appends at its own
// offset, like a file's; WriteAt does not move it.
type stage struct {
	e    *Engine
	mu   sync.Mutex
	buf  []byte
	off  int64
	done bool
}

func (s *stage) errf(op string, err error) error {
	return blob.Wrap(op, s.e.Name(), blob.Digest{}, err)
}

func (s *stage) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.writeAt(p, s.off)
	s.off += int64(n)
	return n, err
}

func (s *stage) WriteAt(p []byte, off int64) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writeAt(p, off)
}

func (s *stage) writeAt(p []byte, off int64) (int, error) {
	if s.done {
		return 0, s.errf("stage write", fs.ErrClosed)
	}
	if off < 0 {
		return 0, s.errf("stage write", errors.New("negative offset"))
	}
	if err := s.grow(off + int64(len(p))); err != nil {
		return 0, err
	}
	return copy(s.buf[off:], p), nil
}

// grow extends buf to n bytes, zero-filled, so holes read as zeros.
func (s *stage) grow(n int64) error {
	if n < 0 || n > MaxStageSize {
		return s.errf("stage write", fmt.Errorf("%w: stage of %d bytes exceeds the mem engine's %d", blob.ErrTooLarge, n, int64(MaxStageSize)))
	}
	if old := len(s.buf); int(n) > old {
		s.buf = slices.Grow(s.buf, int(n)-old)[:n]
		clear(s.buf[old:]) // capacity may hold bytes from before a Truncate
	}
	return nil
}

func (s *stage) ReadAt(p []byte, off int64) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return 0, s.errf("stage read", fs.ErrClosed)
	}
	return engines.BytesCursor(s.buf).ReadAt(p, off)
}

func (s *stage) Truncate(size int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return s.errf("stage truncate", fs.ErrClosed)
	}
	if size < 0 {
		return s.errf("stage truncate", errors.New("negative size"))
	}
	if size < int64(len(s.buf)) {
		s.buf = s.buf[:size]
		return nil
	}
	return s.grow(size)
}

func (s *stage) Size() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return 0, s.errf("stage size", fs.ErrClosed)
	}
	return int64(len(s.buf)), nil
}

// Commit implements engines.Stage. Whatever happens, the stage is over when
// it returns: a failed Commit has already discarded.
func (s *stage) Commit(ctx context.Context, d blob.Digest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return blob.Wrap("commit", s.e.Name(), d, fs.ErrClosed)
	}
	v := slices.Clip(s.buf)
	s.end()
	if err := ctx.Err(); err != nil {
		return blob.Wrap("commit", s.e.Name(), d, err)
	}
	_, err := s.e.insert("commit", d, v)
	return err
}

// Discard implements engines.Stage.
func (s *stage) Discard() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done {
		s.end()
	}
	return nil
}

func (s *stage) end() {
	s.done = true
	s.buf = nil
	s.e.stages.Add(-1)
}
