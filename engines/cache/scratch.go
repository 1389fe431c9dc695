package cache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// A put's scratch file. An upload to a remote tier past the kv threshold
// is written to a scratch file first (store/upload.go); with a cache it
// is made on the cache's filesystem so that the put's commit can link it
// in (Adopt). The cache's disk is sized for the cache, not for the
// largest put, so a put must not depend on it: when it fills while an
// upload is written, the scratch moves to the store's own scratch
// directory with what it holds and the upload goes on there, without the
// write-through.

// Scratch is an upload's scratch file made by NewScratch: an
// engines.RandomStage that the store streams to the remote tier.
type Scratch struct {
	e        *Engine
	fallback string

	mu       sync.RWMutex // I/O shared; the move exclusive
	f        *os.File
	linkable bool // made with O_TMPFILE on the cache's filesystem, not moved
	ended    bool
}

var _ engines.RandomStage = (*Scratch)(nil)

// NewScratch makes a nameless scratch file for an upload: in ScratchDir
// (O_TMPFILE, so that Adopt can link it), else, when the cache's disk has
// no room even for that, in fallback (the store's scratch directory; ""
// for the system's temporary directory). If the cache's disk fills while
// the upload is written (ENOSPC, EDQUOT), WriteAt moves the file to
// fallback, with what was written so far, and writes there: the put goes
// on, logged and counted (fill error "put_nospace"), and is not written
// through (LinkableFile is nil); its first read fills the cache.
func (e *Engine) NewScratch(fallback string) (engines.RandomStage, error) {
	s := &Scratch{e: e, fallback: fallback}
	f, linkable, err := createScratch(e.ScratchDir())
	if err != nil && isNoSpace(err) {
		e.count(func(c *counters) { c.fillError("put_nospace") })
		e.log.Warn("cache: its disk is full; an upload's scratch file goes to the scratch directory, and the put is not written through",
			"dir", e.dir, "scratch", scratchName(fallback), "err", err)
		f, _, err = createScratch(fallback)
		linkable = false
	}
	if err != nil {
		return nil, err
	}
	s.f, s.linkable = f, linkable
	return s, nil
}

func scratchName(dir string) string {
	if dir == "" {
		return os.TempDir()
	}
	return dir
}

// createScratch makes a nameless file in dir's scratch directory
// (engines.ScratchFile).
func createScratch(dir string) (f *os.File, linkable bool, err error) {
	dir = scratchName(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("upload: scratch directory: %w", err)
	}
	return engines.ScratchFile(dir)
}

// LinkableFile is the file Adopt may link as the put's copy, or nil: the
// scratch moved off the cache's filesystem, or was not made with
// O_TMPFILE.
func (s *Scratch) LinkableFile() *os.File {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if !s.linkable || s.ended {
		return nil
	}
	return s.f
}

func (s *Scratch) Write([]byte) (int, error) {
	return 0, errors.New("scratch: sequential write unsupported")
}

// WriteAt writes p at off; on a full cache disk it moves the scratch to
// the fallback directory and writes there.
func (s *Scratch) WriteAt(p []byte, off int64) (int, error) {
	s.mu.RLock()
	f := s.f
	n, err := f.WriteAt(p, off)
	s.mu.RUnlock()
	if err == nil || !isNoSpace(err) {
		return n, err
	}
	if merr := s.move(f, err); merr != nil {
		return n, merr
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.f.WriteAt(p, off)
}

// move copies the scratch, written from f, to a new file in the fallback
// directory, unless another write moved it already; cause is the write's
// failure, returned if moving does not help.
func (s *Scratch) move(f *os.File, cause error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f != f {
		return nil // moved by a concurrent write
	}
	if s.ended {
		return cause
	}
	var here, there unix.Stat_t
	if unix.Fstat(int(f.Fd()), &here) != nil {
		return cause
	}
	if unix.Stat(scratchName(s.fallback), &there) == nil && there.Dev == here.Dev {
		return cause // the scratch directory is on the cache's full disk too
	}
	nf, _, err := createScratch(s.fallback)
	if err != nil {
		return errors.Join(cause, err)
	}
	if err := copyData(nf, f, here.Size); err != nil {
		nf.Close()
		return errors.Join(cause, fmt.Errorf("move the scratch file to %s: %w", scratchName(s.fallback), err))
	}
	s.f, s.linkable = nf, false
	f.Close()
	s.e.count(func(c *counters) { c.fillError("put_nospace") })
	s.e.log.Warn("cache: its disk filled during an upload; the upload's scratch file moved to the scratch directory, and the put is not written through",
		"dir", s.e.dir, "scratch", scratchName(s.fallback), "moved", here.Size, "err", cause)
	return nil
}

// copyData copies the size bytes of src to dst, leaving holes holes.
func copyData(dst, src *os.File, size int64) error {
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; {
		start, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			start = off // no SEEK_DATA: copy everything
		}
		end, err := unix.Seek(int(src.Fd()), start, unix.SEEK_HOLE)
		if err != nil {
			end = size
		}
		end = min(end, size)
		for p := start; p < end; {
			n, rerr := src.ReadAt(buf[:min(int64(len(buf)), end-p)], p)
			if n > 0 {
				if _, werr := dst.WriteAt(buf[:n], p); werr != nil {
					return werr
				}
				p += int64(n)
			}
			if rerr != nil && !(errors.Is(rerr, io.EOF) && n > 0) {
				return rerr
			}
		}
		off = end
	}
	return dst.Truncate(size)
}

func (s *Scratch) ReadAt(p []byte, off int64) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.f.ReadAt(p, off)
}

// Truncate sets the size (no disk space: a hole).
func (s *Scratch) Truncate(n int64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.f.Truncate(n)
}

func (s *Scratch) Size() (int64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	fi, err := s.f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// Commit implements engines.Stage: a scratch is never published itself
// (the store streams it to the remote tier, and Adopt links it).
func (s *Scratch) Commit(context.Context, blob.Digest) error {
	return errors.New("scratch: not publishable")
}

// Discard closes the file (nameless: its space is freed).
func (s *Scratch) Discard() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil
	}
	s.ended = true
	return s.f.Close()
}
