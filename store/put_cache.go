package store

import (
	"context"
	"os"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/engines"
)

// Write-through to the large tier's local cache (engines/cache): a blob
// put through this host lands in the cache too, by a hard link of the
// file that already holds its verified bytes, never by a second copy.
//
// The file is an upload's scratch file (upload.go): a remote tier has no
// random-access stage, so an upload's content past the kv threshold is
// written to a scratch file and then streamed to the remote's stage,
// hashed on the way (putLarge). With a cache, scratch files are made in
// the cache's directory (its ScratchDir, overriding Config.ScratchDir),
// nameless with O_TMPFILE, so the link always works: once the remote
// commit has succeeded, the scratch file becomes the cached copy with the
// chunk checksums computed on the way. A streamed put (Store.Put: the
// CLI's and HTTP's) has no local file and does not fill the cache; nor
// does an upload seeded from another blob (its scratch file lacks the
// parts still read from the base), one whose scratch file is not linkable
// (a filesystem without O_TMPFILE), or one the cache has no room for:
// the put succeeds all the same, and the cache fills on the first read.

// adopter is a cache that can take a put's file as its copy
// (engines/cache.Engine).
type adopter interface {
	ScratchDir() string
	Adopt(ctx context.Context, d Digest, f *os.File, size int64, sidecar []byte) (bool, error)
}

func (s *Store) adopter() (adopter, bool) {
	a, ok := s.large.(adopter)
	return a, ok && s.large != nil
}

// scratchDir is where uploads make their scratch files.
func (s *Store) scratchDir() string {
	if a, ok := s.adopter(); ok {
		return a.ScratchDir()
	}
	return s.scratch
}

// writeThroughFile returns the upload's scratch file if the put may be
// adopted by the cache at commit, nil otherwise; it starts the file's
// writeback, so that the fsync of the adoption, after the remote put,
// finds little left to write.
func (u *Upload) writeThroughFile() *os.File {
	if _, has := u.s.adopter(); !has || u.base != nil {
		return nil
	}
	var f *os.File
	switch st := u.st.(type) {
	case *scratchFile:
		if st.linkable {
			f = st.f
		}
	case interface{ LinkableFile() *os.File }: // a scratchMaker's
		f = st.LinkableFile()
	}
	if f == nil {
		return nil
	}
	// Only a hint: the adoption's fsync is what makes the copy durable.
	_ = unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
	return f
}

// scratchMaker is a cache that makes uploads' scratch files itself
// (engines/cache.Engine.NewScratch): on its filesystem, so that Adopt can
// link them, and moved to fallback (the store's scratch directory) when
// its disk fills, so that a full cache disk never fails a put.
type scratchMaker interface {
	NewScratch(fallback string) (engines.RandomStage, error)
}

// writeThrough offers f, holding d's n verified bytes, to the cache, once
// the remote tier has committed d. A failure costs the cache its copy,
// never the put.
func (s *Store) writeThrough(ctx context.Context, d Digest, f *os.File, n int64, sidecar []byte) {
	a, ok := s.adopter()
	if !ok {
		return
	}
	adopted, err := a.Adopt(ctx, d, f, n, sidecar)
	switch {
	case err != nil:
		s.log.Info("a put's content was not linked into the cache; the first read will fill it", "digest", d.String(), "size", n, "err", err)
	case adopted:
		// The put hashed this file's bytes, read back from it, and no one
		// else holds it: it is known good as it is now, as after a read
		// that checked it whole, so the mount may pass it through at once.
		if id, err := engines.FileIDOf(f); err == nil {
			s.verdicts.record(d, id)
		}
		s.log.Debug("a put's content linked into the cache", "digest", d.String(), "size", n)
	}
}
