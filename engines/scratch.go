package engines

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ScratchFile makes a nameless scratch file in dir ("" for the system's
// temporary directory): by O_TMPFILE where the filesystem has it, so that
// the file can be linked into a directory later (linkable), else by
// create and unlink. The store's uploads and the cache's both use it.
func ScratchFile(dir string) (f *os.File, linkable bool, err error) {
	if dir == "" {
		dir = os.TempDir()
	}
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err == nil {
		return os.NewFile(uintptr(fd), dir+"/(scratch)"), true, nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EINVAL) {
		return nil, false, fmt.Errorf("upload: scratch file in %s: %w", dir, err)
	}
	f, err = os.CreateTemp(dir, "upload-*")
	if err != nil {
		return nil, false, fmt.Errorf("upload: scratch file: %w", err)
	}
	// A stage sweep of the directory (engines/local at open) may have
	// removed it first: nameless either way.
	if err := os.Remove(f.Name()); err != nil && !errors.Is(err, os.ErrNotExist) {
		f.Close()
		return nil, false, fmt.Errorf("upload: scratch file: %w", err)
	}
	return f, false, nil
}
