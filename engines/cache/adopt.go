package cache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
)

// Write-through: a put on this host leaves its content in a file that the
// store has hashed and verified (an upload's scratch file, store/upload.go).
// Adopt makes that file the blob's cached copy by a hard link, so a put
// costs the cache no second write of its bytes. The store makes its
// scratch files nameless with O_TMPFILE in ScratchDir, on the cache's
// filesystem, so the link is always possible.

// ScratchDir is where a store sharing this cache should make the nameless
// scratch files of its uploads: on the cache's filesystem, so that Adopt
// can link them. No file there ever has a name (O_TMPFILE), so the stage
// sweep at open never sees one.
func (e *Engine) ScratchDir() string { return filepath.Join(e.dir, "stage") }

// Adopt makes f, an open file holding exactly size bytes whose content
// hashes to d and whose chunk checksums are sidecar, d's cached copy by a
// hard link (engines/local's Link): it evicts to fit size under the limit
// (the bytes are on the disk already), links, and adds the copy to the
// index. f stays the caller's and must not be written again. It reports
// whether it adopted f; a d already cached is not adopted, and is no
// error. It fails, changing nothing, when f is on another filesystem, has
// no name and was not made with O_TMPFILE, or does not fit.
func (e *Engine) Adopt(ctx context.Context, d blob.Digest, f *os.File, size int64, sidecar []byte) (bool, error) {
	if size <= 0 || size > e.limit {
		return false, fmt.Errorf("%d bytes: empty or over the cache's limit of %d", size, e.limit)
	}
	var st, dir unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false, err
	}
	if err := unix.Stat(e.dir, &dir); err != nil {
		return false, err
	}
	if st.Size != size {
		return false, fmt.Errorf("the file has %d bytes, not the blob's %d", st.Size, size)
	}
	if st.Dev != dir.Dev {
		return false, fmt.Errorf("the file is on another filesystem than the cache %s", e.dir)
	}
	if _, err := os.Lstat(e.loc.Path(d)); err == nil {
		return false, nil
	}
	if err := e.makeRoom(ctx, size, 0, ""); err != nil {
		if errors.Is(err, errFull) {
			e.count(func(c *counters) { c.fillError("full") })
		}
		return false, err
	}
	unlock, err := e.lock(unix.LOCK_SH)
	if err != nil {
		return false, err
	}
	defer unlock()
	linked, err := e.loc.Link(ctx, d, f, sidecar)
	if linked {
		// Indexed even if the directory's fsync failed: the name is there.
		if ierr := e.idx.add(ctx, d, size); ierr != nil {
			err = errors.Join(err, ierr)
		}
		e.count(func(c *counters) { c.adopted.Add(1) })
	}
	return linked, err
}
