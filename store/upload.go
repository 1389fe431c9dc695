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
// program writes a file: the mount's incoming/ files are Uploads.
//
// Content stays in memory while it fits the kv tier (most files of a
// `cp -r` never touch a stage file). Past the threshold it moves to where
// it will be published when the large engine allows it
// (engines.RandomStage: the local engine's stage file, published by
// rename), else to a scratch file. Sequential writes from offset 0 are
// hashed as they arrive, on their own goroutine; any other pattern is
// re-read once at Commit. Sequential writes past the threshold are copied
// and written into the stage on their own goroutine too (stageWriter), so
// a write returns once its bytes are copied.
//
// An Upload is safe for concurrent use. Exactly one of Commit or Discard
// ends it; Discard after either is a no-op.
type Upload struct {
	s  *Store
	mu sync.Mutex
	// buf holds the content until it outgrows the kv tier; then st does.
	// Bytes from len(buf) to size are zeros that were never written (an
	// extending truncate): they take no memory until Commit.
	buf []byte
	// held is len(buf) as counted in the store's uploadMem.
	held int64
	st   engines.RandomStage
	// own is true when st is the large engine's stage (Commit publishes it
	// in place); false for a scratch file.
	own  bool
	size int64
	// seq: every write so far appended at the end, from offset 0.
	seq bool
	// h hashes sequential content once it lives in st: its sha256
	// through pipe, its chunk checksums where it is written (w, or here).
	h    *contentHash
	pipe *hashPipe
	// w writes the sequential appends into st while pipe hashes them;
	// nil when writes go to st directly. failed is the error of one of
	// its writes: the upload has lost content, and can only fail.
	w      *stageWriter
	failed error
	done   bool
	// base is the blob a Seed started from, read where it has not been
	// written (see upload_seed.go): below baseLen, a 64 KiB chunk whose
	// bit in mat is clear is still the base's. basePin keeps it.
	base    *Reader
	basePin *Pin
	baseLen int64
	mat     []uint64
}

// NewUpload starts an empty upload.
func (s *Store) NewUpload(ctx context.Context) (*Upload, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	if err := s.writable("upload"); err != nil {
		return nil, err
	}
	u := &Upload{s: s, seq: true}
	if s.kv == nil { // nothing stays in memory: stage at once
		if err := u.spill(ctx); err != nil {
			return nil, err
		}
	}
	return u, nil
}

// inMemory reports whether content of size n may stay in buf: it fits
// the kv tier, and the uploads of the whole store keep under their memory
// budget (Config.UploadMemory) with it.
func (u *Upload) inMemory(n int64) bool {
	if u.st != nil || u.s.kv == nil || n > u.s.threshold {
		return false
	}
	grow := max(n-int64(len(u.buf)), 0)
	return u.s.uploadMem.Load()+grow <= u.s.uploadCap
}

// account brings the store's count of upload memory up to date with
// len(buf).
func (u *Upload) account() {
	n := int64(len(u.buf))
	u.s.uploadMem.Add(n - u.held)
	u.held = n
}

// overLimit rejects content a kv-only store could never publish, at the
// write that makes it so.
func (u *Upload) overLimit(n int64) error {
	if u.s.kv != nil && u.s.large == nil && n > u.s.threshold {
		return fmt.Errorf("upload: %d bytes over the %s limit of %d bytes: %w", n, u.s.mode, u.s.threshold, ErrTooLarge)
	}
	return nil
}

// spill moves the content from memory into a stage.
func (u *Upload) spill(ctx context.Context) error {
	st, own, err := u.s.newStage(ctx)
	if err != nil {
		return err
	}
	// Zeros (an extending truncate, a seek past the end) stay holes.
	if err := writeSparse(st, u.buf, 0); err != nil {
		st.Discard()
		return err
	}
	if u.size > 0 {
		if err := st.Truncate(u.size); err != nil {
			st.Discard()
			return err
		}
	}
	u.st, u.own = st, own
	if u.seq && int64(len(u.buf)) == u.size {
		u.h = newContentHash()
		u.pipe = newHashPipe(shaOnly{u.h})
		u.pipe.Write(u.buf)
		u.h.writeSums(u.buf)
		u.w = newStageWriter(st, u.h)
	}
	u.buf = nil
	u.account()
	return nil
}

// newStage returns the large engine's random-access stage if it has one,
// else a scratch file.
func (s *Store) newStage(ctx context.Context) (engines.RandomStage, bool, error) {
	if s.large != nil {
		st, err := s.large.Stage(ctx)
		if err != nil {
			return nil, false, blob.Wrap("stage", s.large.Name(), Digest{}, err)
		}
		if rs, ok := st.(engines.RandomStage); ok {
			return rs, true, nil
		}
		st.Discard()
	}
	if sm, ok := s.large.(scratchMaker); ok {
		st, err := sm.NewScratch(s.scratch) // the cache's (put_cache.go)
		return st, false, err
	}
	dir := s.scratchDir() // the cache's, with one (put_cache.go)
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, false, fmt.Errorf("upload: scratch directory: %w", err)
		}
	}
	// Nameless from the start: the descriptor is all an upload uses, and a
	// crash then leaves nothing behind in the scratch directory.
	f, linkable, err := engines.ScratchFile(dir)
	if err != nil {
		return nil, false, err
	}
	return &scratchFile{f: f, linkable: linkable}, false, nil
}

// WriteAt writes p at off.
func (u *Upload) WriteAt(p []byte, off int64) (int, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.writeAtLocked(p, off)
}

func (u *Upload) writeAtLocked(p []byte, off int64) (int, error) {
	if u.done {
		return 0, os.ErrClosed
	}
	if u.failed != nil {
		return 0, u.failed
	}
	if off < 0 {
		return 0, fmt.Errorf("upload: negative offset %d", off)
	}
	end := off + int64(len(p))
	if err := u.overLimit(end); err != nil {
		return 0, err
	}
	appending := u.seq && off == u.size
	if u.inMemory(end) {
		if end > int64(len(u.buf)) {
			u.buf = append(u.buf, make([]byte, end-int64(len(u.buf)))...)
			u.account()
		}
		copy(u.buf[off:], p)
		u.size = max(u.size, end)
		u.seq = appending
		return len(p), nil
	}
	if u.st == nil {
		if err := u.spill(context.Background()); err != nil {
			return 0, err
		}
	}
	if appending && u.w != nil && u.w.failed() == nil {
		u.w.append(p, off, u.pipe)
		u.size = end
		return len(p), nil
	}
	// Anything else waits for the appends in flight: it may overlap them.
	if err := u.endWrites(); err != nil {
		return 0, err
	}
	if u.base != nil && off < u.baseLen {
		if err := u.copyUp(off, end); err != nil {
			return 0, err
		}
	}
	n, err := u.st.WriteAt(p, off)
	if appending && u.pipe != nil {
		u.pipe.Write(p[:n])
		u.h.writeSums(p[:n]) // the stage writer has ended: in order
	} else {
		u.seq = false
		u.stopHash() // rewritten or sparse: re-read at Commit
	}
	u.size = max(u.size, off+int64(n))
	return n, err
}

// ReadAt reads back what has been written (holes read as zeros).
func (u *Upload) ReadAt(p []byte, off int64) (int, error) {
	u.mu.Lock()
	if u.done {
		u.mu.Unlock()
		return 0, os.ErrClosed
	}
	if u.st == nil {
		defer u.mu.Unlock()
		return readZeroTail(u.buf, u.size, p, off)
	}
	if u.w != nil {
		if err := u.w.wait(); err != nil {
			defer u.mu.Unlock()
			return 0, u.endWrites()
		}
	}
	if u.base != nil {
		defer u.mu.Unlock()
		return u.readLocked(p, off)
	}
	st := u.st
	u.mu.Unlock()
	return st.ReadAt(p, off)
}

// Truncate sets the size (O_TRUNC, ftruncate).
func (u *Upload) Truncate(size int64) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.done {
		return os.ErrClosed
	}
	if err := u.endWrites(); err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("upload: negative size %d", size)
	}
	if err := u.overLimit(size); err != nil {
		return err
	}
	switch {
	case size == 0:
		u.seq = true
	case size != u.size:
		u.seq = false
	}
	if u.inMemory(size) {
		if size <= int64(len(u.buf)) {
			clear(u.buf[size:])
			u.buf = u.buf[:size]
			u.account()
		}
		// Growing: the new bytes are zeros past len(buf), not allocated.
		u.size = size
		return nil
	}
	if u.st == nil {
		u.size = size // spill writes buf and extends to size
		return u.spill(context.Background())
	}
	if err := u.st.Truncate(size); err != nil {
		return err
	}
	if size < u.baseLen {
		// What is cut off the base is gone; growing again adds zeros.
		u.baseLen = size
		if size == 0 {
			u.dropBase()
		}
	}
	if size != u.size || size == 0 {
		u.stopHash()
	}
	if size == 0 {
		u.h = newContentHash()
		u.pipe = newHashPipe(shaOnly{u.h})
	}
	if u.pipe != nil {
		u.w = newStageWriter(u.st, u.h) // appends go on from here
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
	s, o := u.s, applyOpts(opts)
	if u.st == nil {
		b := u.buf
		if int64(len(b)) < u.size {
			b = append(b, make([]byte, u.size-int64(len(b)))...)
		}
		u.buf = nil
		u.account()
		return s.putSmall(ctx, b, want, o)
	}
	defer u.st.Discard()
	defer u.dropBase()
	if err := u.endWrites(); err != nil {
		u.stopHash()
		return Digest{}, nil, err
	}
	var h *contentHash
	if u.pipe != nil && u.pipe.n == u.size {
		u.pipe.wait()
		h = u.h
	}
	u.stopHash()
	content := io.NewSectionReader(lockedReader{u}, 0, u.size)
	if s.kv != nil && u.size <= s.threshold {
		b := make([]byte, u.size)
		if _, err := io.ReadFull(content, b); err != nil {
			return Digest{}, nil, fmt.Errorf("upload: read back: %w", err)
		}
		return s.putSmall(ctx, b, want, o)
	}
	if s.large == nil {
		return Digest{}, nil, fmt.Errorf("upload: %d bytes over the %s limit of %d bytes: %w", u.size, s.mode, s.threshold, ErrTooLarge)
	}
	if !u.own {
		o.local = u.writeThroughFile() // the cache may adopt it (put_cache.go)
		return s.putLarge(ctx, nil, content, u.size, want, o)
	}
	if h == nil {
		// Rewritten, sparse or seeded: one pass copies in what is still
		// in the base and hashes, skipping holes.
		var err error
		if h, err = u.settle(ctx, true); err != nil {
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
	u.buf = nil
	u.account()
	u.stopHash()
	u.dropBase()
	if u.st == nil {
		return nil
	}
	return u.st.Discard()
}

// endWrites waits for the appends in flight to reach the stage and ends
// the stage writer, if any. It returns the upload's failure: a failed
// append fails the upload for good.
func (u *Upload) endWrites() error {
	if u.w != nil {
		if err := u.w.stop(); err != nil && u.failed == nil {
			u.failed = err
		}
		u.w = nil
	}
	return u.failed
}

// stopHash ends the incremental hash, if any, and the stage writer that
// goes with it, without leaking their goroutines.
func (u *Upload) stopHash() {
	u.endWrites()
	if u.pipe != nil {
		u.pipe.wait()
		u.h, u.pipe = nil, nil
	}
}

// scratchFile stages an upload outside the engines, for stores whose large
// engine has no random-access stage (or no large engine at all).
type scratchFile struct {
	f        *os.File
	linkable bool // made with O_TMPFILE (put_cache.go)
	once     sync.Once
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
		err = s.f.Close() // nameless already (newStage)
	})
	return err
}

// readZeroTail reads from content of size bytes whose first len(buf) are
// buf and the rest zeros, following io.ReaderAt.
func readZeroTail(buf []byte, size int64, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("upload: negative offset %d", off)
	}
	if off >= size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), size-off))
	k := 0
	if off < int64(len(buf)) {
		k = copy(p[:n], buf[off:])
	}
	clear(p[k:n])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
