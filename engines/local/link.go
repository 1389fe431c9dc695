package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
)

var (
	// ErrNotLinkable: Link was given a nameless file not made with
	// O_TMPFILE (or a system without /proc/self/fd).
	ErrNotLinkable = errors.New("the file has no name to link and was not made with O_TMPFILE")
	// ErrOtherFilesystem: Link was given a file on another filesystem.
	ErrOtherFilesystem = errors.New("the file is on another filesystem than the blobs")
)

// Link publishes f, an open file on this engine's filesystem that holds
// d's content, as d by a hard link: no byte is copied (a cache adopting a
// put's scratch file, engines/cache). f may be nameless if it was made
// with O_TMPFILE (a file unlinked after its creation cannot be linked
// again: ENOENT). As Commit, the sidecar (if not nil) is written first and
// the file is made read-only and fsynced before it becomes visible, and a
// d already present is left alone: linked is false then. f stays open and
// the caller's.
func (e *Engine) Link(ctx context.Context, d blob.Digest, f *os.File, sidecar []byte) (linked bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, e.wrap("link", d, err)
	}
	final := e.path(d)
	switch _, err := os.Lstat(final); {
	case err == nil:
		return false, nil
	case !errors.Is(err, fs.ErrNotExist):
		return false, e.wrap("link", d, err)
	}
	if err := f.Chmod(0o444); err != nil {
		return false, e.wrap("link", d, err)
	}
	if err := f.Sync(); err != nil {
		return false, e.wrap("link", d, fmt.Errorf("fsync: %w", err))
	}
	if sidecar != nil {
		if err := e.writeSidecar(d, sidecar); err != nil {
			return false, e.wrap("link", d, fmt.Errorf("write sidecar: %w", err))
		}
	}
	if err := e.ensureShard(d); err != nil {
		return false, e.wrap("link", d, err)
	}
	// The descriptor's /proc link, followed, names f's inode even when it
	// has no name (the form open(2) documents for O_TMPFILE); linkat
	// never replaces an existing name.
	src := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	err = unix.Linkat(unix.AT_FDCWD, src, unix.AT_FDCWD, final, unix.AT_SYMLINK_FOLLOW)
	if err != nil && sidecar != nil && !errors.Is(err, unix.EEXIST) {
		e.removeSidecar(d)
	}
	switch {
	case errors.Is(err, unix.EEXIST):
		return false, nil // a concurrent publish of d won
	case errors.Is(err, unix.ENOENT):
		return false, blob.Wrap("link", e.Name(), d, ErrNotLinkable)
	case errors.Is(err, unix.EXDEV):
		return false, blob.Wrap("link", e.Name(), d, ErrOtherFilesystem)
	case err != nil:
		return false, e.wrap("link", d, &os.LinkError{Op: "linkat", Old: src, New: final, Err: err})
	}
	if err := syncDir(e.shardDir(d)); err != nil {
		return true, e.wrap("link", d, fmt.Errorf("fsync shard directory: %w", err))
	}
	return true, nil
}
