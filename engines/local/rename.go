package local

import (
	"errors"
	"io/fs"
	"os"
)

// linkUnlink is a no-replace rename from link(2), which fails with EEXIST
// rather than replace. Where hard links are not supported either, it falls
// back to check-then-rename: a concurrent equal commit may then replace
// the file, which is harmless to readers (same bytes, and the old inode
// stays readable) but no longer atomic.
func linkUnlink(oldpath, newpath string) error {
	err := os.Link(oldpath, newpath)
	switch {
	case err == nil:
		// Published. A stage link that fails to go is residue for the next
		// Open's sweep, not a failed publish.
		os.Remove(oldpath)
		return nil
	case errors.Is(err, fs.ErrExist):
		return err
	}
	if _, serr := os.Lstat(newpath); serr == nil {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: fs.ErrExist}
	}
	return os.Rename(oldpath, newpath)
}
