package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

var (
	_ engines.RandomStage  = (*stage)(nil)
	_ engines.SidecarStage = (*stage)(nil)
)

// Stage implements engines.Large: a locked temporary file in the stage
// directory.
func (e *Engine) Stage(ctx context.Context) (engines.Stage, error) {
	if err := ctx.Err(); err != nil {
		return nil, e.wrap("stage", blob.Digest{}, err)
	}
	f, err := e.createLocked("stage-*")
	if err != nil {
		return nil, e.wrap("stage", blob.Digest{}, err)
	}
	return &stage{e: e, f: f}, nil
}

// createLocked creates and locks a file in the stage directory, named by
// pattern (os.CreateTemp's). Every file there is locked while it is in use
// — stage files, and sidecars on their way to sums/ — because Open removes
// every unlocked one as stale (removeStale). Between create and lock,
// another process's Open may take the unlocked file for stale: it holds
// the lock for a moment (and we start over) or it removes the file (it is
// then no longer the one at its path, and we start over).
func (e *Engine) createLocked(pattern string) (*os.File, error) {
	// Locked before it has a name, where the filesystem can: no window.
	if f, err := createLockedUnnamed(e.stageDir, pattern); !errors.Is(err, errNoTmpfile) {
		return f, err
	}
	for range 8 {
		f, err := os.CreateTemp(e.stageDir, pattern)
		if err != nil {
			return nil, err
		}
		if err := lock(f); errors.Is(err, unix.EWOULDBLOCK) {
			f.Close() // the sweep that holds it removes it
			continue
		} else if err != nil {
			f.Close()
			os.Remove(f.Name())
			return nil, err
		}
		mine, err := f.Stat()
		if err != nil {
			f.Close()
			os.Remove(f.Name())
			return nil, err
		}
		if there, err := os.Lstat(f.Name()); err == nil && os.SameFile(mine, there) {
			return f, nil
		}
		f.Close()
	}
	return nil, errors.New("stage file keeps being removed by a concurrent stale-stage sweep")
}

// stage is a put in progress. File I/O runs under the read lock, so
// parallel WriteAt/ReadAt calls proceed together; Commit and Discard take
// the write lock, so no I/O is in flight when the file goes away.
type stage struct {
	e       *Engine
	mu      sync.RWMutex
	f       *os.File // nil once the stage has ended
	sidecar []byte   // written beside the blob at Commit, if set
	// wb is the offset below which writeback has been started
	// (Engine.writeback); end is where the next sequential Write goes.
	wb  atomic.Int64
	end atomic.Int64
}

// writebackChunk is how much a stage lets the page cache hold dirty behind
// the furthest byte written before it asks the kernel to start writing it
// out. A large put otherwise leaves all its bytes dirty for the fsync at
// Commit, which then waits for the whole disk write (about 0.45 s per GiB
// on the bench's disk) after the last byte arrived; started as the content
// arrives, the disk writes while the rest is transferred and hashed, and
// the fsync waits for the last chunk or so (a 1 GiB cp into incoming/:
// its close took 0.47 s, now 15 ms). 8 MiB keeps the calls few
// (128 per GiB) and the disk's requests large, and leaves the pages of a
// small rewrite near the write head alone.
const writebackChunk = 8 << 20

// File is the stage file (engines.FileStage), nil once the stage ended.
func (s *stage) File() *os.File {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.f
}

func (s *stage) io(op string, fn func(f *os.File) (int, error)) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.f == nil {
		return 0, s.e.wrap(op, blob.Digest{}, fs.ErrClosed)
	}
	n, err := fn(s.f)
	if err != nil && err != io.EOF {
		err = s.e.wrap(op, blob.Digest{}, err)
	}
	return n, err
}

func (s *stage) Write(p []byte) (int, error) {
	return s.io("stage write", func(f *os.File) (int, error) {
		n, err := f.Write(p)
		s.wrote(f, s.end.Add(int64(n)))
		return n, err
	})
}

func (s *stage) WriteAt(p []byte, off int64) (int, error) {
	return s.io("stage write", func(f *os.File) (int, error) {
		n, err := f.WriteAt(p, off)
		s.wrote(f, off+int64(n))
		return n, err
	})
}

// wrote notes that bytes up to end were written, and starts writeback of
// the whole chunks below end that have not been started yet. Writeback is
// only a head start for the fsync at Commit, which alone makes the blob
// durable and reports write errors; so a failure here is ignored.
func (s *stage) wrote(f *os.File, end int64) {
	from := s.wb.Load()
	to := end &^ (writebackChunk - 1)
	if to <= from || !s.wb.CompareAndSwap(from, to) {
		return
	}
	s.e.writeback(f, from, to-from)
}

func (s *stage) ReadAt(p []byte, off int64) (int, error) {
	return s.io("stage read", func(f *os.File) (int, error) { return f.ReadAt(p, off) })
}

func (s *stage) Truncate(size int64) error {
	_, err := s.io("stage truncate", func(f *os.File) (int, error) { return 0, f.Truncate(size) })
	return err
}

// SeekData returns the first region of data at or after off, [start,
// end), or io.EOF when only a hole follows: the store hashes a sparse
// upload without reading its holes, and keeps them holes. It moves the
// file's offset, so it does not mix with Write (uploads use WriteAt).
func (s *stage) SeekData(off int64) (start, end int64, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.f == nil {
		return 0, 0, s.e.wrap("stage seek", blob.Digest{}, fs.ErrClosed)
	}
	start, end, err = seekData(s.f, off)
	if err != nil && err != io.EOF {
		err = s.e.wrap("stage seek", blob.Digest{}, err)
	}
	return start, end, err
}

func (s *stage) Size() (int64, error) {
	var size int64
	_, err := s.io("stage size", func(f *os.File) (int, error) {
		fi, err := f.Stat()
		if err == nil {
			size = fi.Size()
		}
		return 0, err
	})
	return size, err
}

// Commit implements engines.Stage. The stage ends here whatever happens:
// on failure the stage file is already gone.
func (s *stage) Commit(ctx context.Context, d blob.Digest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return s.e.wrap("commit", d, fs.ErrClosed)
	}
	f := s.f
	s.f = nil
	if s.sidecar != nil {
		// Before the blob is visible, so a reader never finds a blob whose
		// sidecar is still being written.
		if err := s.e.writeSidecar(d, s.sidecar); err != nil {
			s.e.drop(f)
			return s.e.wrap("commit", d, fmt.Errorf("write sidecar: %w", err))
		}
	}
	if err := s.e.publish(ctx, f, d); err != nil {
		return s.e.wrap("commit", d, err)
	}
	return nil
}

// Discard implements engines.Stage; after the stage ended it is a no-op.
func (s *stage) Discard() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	f := s.f
	s.f = nil
	if err := s.e.drop(f); err != nil {
		return s.e.wrap("discard", blob.Digest{}, err)
	}
	return nil
}

// drop closes and removes a stage file.
func (e *Engine) drop(f *os.File) error {
	cerr := f.Close()
	if err := os.Remove(f.Name()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return cerr
}

// publish moves the stage file f to d's path, or drops it if d exists. f is
// closed and the stage path is empty when it returns.
func (e *Engine) publish(ctx context.Context, f *os.File, d blob.Digest) (err error) {
	published := false
	defer func() {
		if published {
			// The blob is in place and durable; the descriptor only holds
			// the stage lock now.
			f.Close()
			return
		}
		if derr := e.drop(f); derr != nil {
			if err == nil {
				// The entry exists (dedup) but the stage file stayed; the
				// next Open removes it. Not a failed commit.
				e.log.Warn("could not remove stage file", "path", f.Name(), "err", derr)
			}
		}
	}()
	if err := ctx.Err(); err != nil {
		return err
	}
	final := e.path(d)
	switch _, err := os.Lstat(final); {
	case err == nil:
		return nil // dedup: drop the stage
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if err := f.Chmod(0o444); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync stage file: %w", err)
	}
	if err := e.ensureShard(d); err != nil {
		return err
	}
	switch err := renameNoReplace(f.Name(), final); {
	case errors.Is(err, fs.ErrExist):
		return nil // a concurrent Commit of d won: dedup
	case err != nil:
		return err
	}
	published = true
	if err := syncDir(e.shardDir(d)); err != nil {
		// Visible but maybe not durable: report it. The blob stays, since
		// a concurrent dedup Commit may already rely on it.
		return fmt.Errorf("fsync shard directory: %w", err)
	}
	return nil
}

// ensureShard creates d's shard directory if needed, durably.
func (e *Engine) ensureShard(d blob.Digest) error {
	switch err := os.Mkdir(e.shardDir(d), 0o700); {
	case err == nil:
		if err := syncDir(e.blobDir); err != nil {
			return fmt.Errorf("fsync blob directory: %w", err)
		}
	case !errors.Is(err, fs.ErrExist):
		return err
	}
	return nil
}
