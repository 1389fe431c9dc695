package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// Handing an upload in progress to another process: an upgrade
// (`alkblobfs upgrade`) carries the files being written into incoming/ to
// the new daemon. Export gives a descriptor of the content, passed by
// SCM_RIGHTS; ImportUpload goes on from it. No content is copied for a
// staged upload (the new process writes into the same file, which the old
// one's Discard only unlinks); content held in memory, or in a stage of
// no file of its own, is copied to an anonymous memory file. An upload
// seeded from a published blob and not yet copied in whole passes the
// blob's digest and which chunks were written since: the importer reads
// the rest from the blob, pinned by its own pin. The new upload re-reads
// its content once at Commit, as for any file written out of order.

// Exported describes an exported upload, beside its descriptor.
type Exported struct {
	Size int64
	// Mem: the descriptor is an anonymous memory file (the exporter
	// held the content in memory, or in a stage of no file of its own).
	Mem bool `json:",omitempty"`
	// Base is the blob a Seed started from, still read where Mat's bit
	// of a 64 KiB chunk below BaseLen is clear; empty: none.
	Base    string   `json:",omitempty"`
	BaseLen int64    `json:",omitempty"`
	Mat     []uint64 `json:",omitempty"`
}

// ErrNotCarried is what Export wraps for an upload it cannot hand over.
var ErrNotCarried = errors.New("upload cannot be handed to another process")

// Exportable is nil when Export would take the upload, else why not
// (ErrNotCarried, or the upload's failure).
func (u *Upload) Exportable() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.exportableLocked()
}

func (u *Upload) exportableLocked() error {
	switch {
	case u.done:
		return os.ErrClosed
	case u.failed != nil:
		return u.failed
	}
	return nil
}

// Export returns a descriptor of the upload's content and its
// description, for ImportUpload in another process. The upload stays
// this process's, unchanged: it goes on if the other process never
// takes it, and Discard ends it (the exported file lives on while the
// other holds it). A failed upload returns its failure.
func (u *Upload) Export() (*os.File, Exported, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	f, mem, err := u.exportLocked()
	if err != nil {
		return nil, Exported{}, err
	}
	e := Exported{Size: u.size, Mem: mem}
	if u.base != nil {
		// A truncate keeps the words of chunks it cut off the base
		// (Truncate): only those of the base left go across.
		n := min(matWords(u.baseLen), len(u.mat))
		e.Base, e.BaseLen, e.Mat = u.base.d.String(), u.baseLen, slices.Clone(u.mat[:n])
	}
	return f, e, nil
}

func (u *Upload) exportLocked() (f *os.File, mem bool, err error) {
	if err := u.exportableLocked(); err != nil {
		return nil, false, err
	}
	// The appends in flight reach the stage first; the stage writer
	// ends, and later appends (here, if the other process never takes
	// over) go on hashed in order without it.
	if err := u.endWrites(); err != nil {
		return nil, false, err
	}
	if u.st == nil {
		f, err := memFile(u.buf, u.size)
		return f, true, err
	}
	switch st := u.st.(type) {
	case *scratchFile:
		f = st.f
	case engines.FileStage:
		f = st.File()
	case interface{ LinkableFile() *os.File }: // the cache's scratch
		f = st.LinkableFile()
	}
	if f == nil {
		// A stage of no file of its own (the mem engine's): a copy.
		f, err := copyToMem(u.st, u.size)
		return f, true, err
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, false, fmt.Errorf("upload: duplicate the stage's descriptor: %w", err)
	}
	return os.NewFile(uintptr(fd), "upload"), false, nil
}

// memFile is an anonymous memory file holding buf, zero-extended to size.
func memFile(buf []byte, size int64) (*os.File, error) {
	fd, err := unix.MemfdCreate("alkblobfs-upload", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("upload: memory file: %w", err)
	}
	f := os.NewFile(uintptr(fd), "upload")
	if _, err := f.WriteAt(buf, 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("upload: memory file: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("upload: memory file: %w", err)
	}
	return f, nil
}

// copyToMem is memFile of the first size bytes of r.
func copyToMem(r io.ReaderAt, size int64) (*os.File, error) {
	f, err := memFile(nil, 0)
	if err != nil {
		return nil, err
	}
	if _, err := io.Copy(f, io.NewSectionReader(r, 0, size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("upload: copy the stage: %w", err)
	}
	return f, nil
}

// ImportUpload goes on with an upload another process exported: f holds
// its content as e describes it, and is the upload's from the call on
// (closed on an error). Content that fits the kv tier and the memory
// budget is read into memory; content of a memory file (e.Mem) that
// does not is copied into a stage, as a spill; anything else is written
// in place, in f, which Commit re-reads once and streams into the large
// tier. A seed blob is pinned and read here until the upload ends.
func (s *Store) ImportUpload(ctx context.Context, f *os.File, e Exported) (*Upload, error) {
	if s.closed.Load() {
		f.Close()
		return nil, ErrClosed
	}
	if err := s.writable("upload"); err != nil {
		f.Close()
		return nil, err
	}
	size := e.Size
	u := &Upload{s: s, size: size}
	if e.Base != "" {
		if err := u.importBase(ctx, e); err != nil {
			f.Close()
			return nil, err
		}
		u.st = &scratchFile{f: f}
		return u, nil
	}
	if u.inMemory(size) {
		defer f.Close()
		u.buf = make([]byte, size)
		if _, err := f.ReadAt(u.buf, 0); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("upload: read the handed-over content: %w", err)
		}
		u.account()
		// Content from 0 to size: appends hash on from it if it spills.
		u.seq = true
		return u, nil
	}
	if e.Mem {
		defer f.Close()
		if err := u.stageFrom(ctx, f, size); err != nil {
			return nil, err
		}
		return u, nil
	}
	u.st = &scratchFile{f: f}
	return u, nil
}

// stageFrom copies the first size bytes of f, a memory file, into a new
// stage of the store's (as a spill does), for content that does not fit
// the upload memory budget here: written on in place, the memory file
// would grow RAM that no budget counts. Commit re-reads it once, as a
// stage written out of order.
func (u *Upload) stageFrom(ctx context.Context, f *os.File, size int64) error {
	st, own, err := u.s.newStage(ctx)
	if err != nil {
		return err
	}
	if _, err := io.Copy(io.NewOffsetWriter(st, 0), io.NewSectionReader(f, 0, size)); err != nil {
		st.Discard()
		return fmt.Errorf("upload: stage the handed-over content: %w", err)
	}
	if err := st.Truncate(size); err != nil {
		st.Discard()
		return fmt.Errorf("upload: stage the handed-over content: %w", err)
	}
	u.st, u.own = st, own
	return nil
}

// matWords is how many words of Mat (a bit per chunk) a base of n bytes
// has.
func matWords(n int64) int {
	return int((n + 64*chunkSize - 1) / (64 * chunkSize))
}

// importBase takes up an exported upload's seed: its own pin and reader
// of the blob, and which chunks were written since.
func (u *Upload) importBase(ctx context.Context, e Exported) error {
	d, err := blob.Parse(e.Base)
	if err != nil {
		return fmt.Errorf("upload: seed: %w", err)
	}
	if len(e.Mat) != matWords(e.BaseLen) || e.BaseLen > e.Size {
		return fmt.Errorf("upload: seed of %d bytes with %d words of written chunks", e.BaseLen, len(e.Mat))
	}
	pin, err := u.s.Pin(ctx, d)
	if err != nil {
		return err
	}
	r, ok, err := u.s.Get(ctx, d)
	if err == nil && !ok {
		err = blob.Wrap("seed", "", d, blob.ErrMissing)
	}
	if err != nil {
		pin.Release()
		return err
	}
	u.base, u.basePin, u.baseLen, u.mat = r, pin, e.BaseLen, e.Mat
	return nil
}
