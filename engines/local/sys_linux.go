package local

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// renameNoReplace renames oldpath to newpath unless newpath exists, in which
// case it returns an error matching fs.ErrExist and leaves both alone. It
// never replaces newpath, so a blob a reader has just opened is never swapped
// under it.
func renameNoReplace(oldpath, newpath string) error {
	err := unix.Renameat2(unix.AT_FDCWD, oldpath, unix.AT_FDCWD, newpath, unix.RENAME_NOREPLACE)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.ENOTSUP) {
		return &os.LinkError{Op: "renameat2", Old: oldpath, New: newpath, Err: err}
	}
	// The filesystem has no RENAME_NOREPLACE (older kernels, some network
	// and FUSE filesystems).
	return linkUnlink(oldpath, newpath)
}

// lock takes the stage lock on a new stage file.
func lock(f *os.File) error {
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
}

// removeIfUnlocked removes a stage file unless a live stage holds its lock.
// A file that its writer renamed away (a committed stage, a sidecar) while
// we waited for its lock is no longer the one at path: it is left alone.
func removeIfUnlocked(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	switch err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); {
	case errors.Is(err, unix.EWOULDBLOCK):
		return false, nil
	case err != nil:
		return false, err
	}
	mine, err := f.Stat()
	if err != nil {
		return false, err
	}
	if there, err := os.Lstat(path); err != nil || !os.SameFile(mine, there) {
		return false, nil // moved on
	}
	switch err := os.Remove(path); {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil // another sweep took it
	case err != nil:
		return false, err
	}
	return true, nil
}

// seekData returns the first region of data at or after off in f,
// [start, end), by SEEK_DATA and SEEK_HOLE; io.EOF when only a hole (or
// nothing) follows off. It moves f's offset: callers use pread/pwrite.
func seekData(f *os.File, off int64) (start, end int64, err error) {
	fd := int(f.Fd())
	start, err = unix.Seek(fd, off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return 0, 0, io.EOF
	}
	if err != nil {
		return 0, 0, &os.PathError{Op: "lseek SEEK_DATA", Path: f.Name(), Err: err}
	}
	end, err = unix.Seek(fd, start, unix.SEEK_HOLE)
	if err != nil {
		return 0, 0, &os.PathError{Op: "lseek SEEK_HOLE", Path: f.Name(), Err: err}
	}
	return start, end, nil
}

// startWriteback asks the kernel to start writing out the dirty pages of
// [off, off+n) of f, without waiting for them (SYNC_FILE_RANGE_WRITE: no
// metadata, no flush; not a durability point).
func startWriteback(f *os.File, off, n int64) error {
	return unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}

// errNoTmpfile: the stage directory's filesystem cannot make an unnamed
// file (O_TMPFILE); createLocked then names the file first.
var errNoTmpfile = errors.New("no O_TMPFILE")

// createLockedUnnamed makes a file in dir that is locked before it has a
// name: an unnamed one (O_TMPFILE), locked, then linked under a name
// from pattern (os.CreateTemp's). No other process's stale-stage sweep
// can find it unlocked.
func createLockedUnnamed(dir, pattern string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EINVAL) {
		return nil, errNoTmpfile
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "flock", Path: dir, Err: err}
	}
	prefix, suffix, _ := strings.Cut(pattern, "*")
	for range 16 {
		path := filepath.Join(dir, prefix+strconv.FormatUint(rand.Uint64(), 36)+suffix)
		err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, path, unix.AT_SYMLINK_FOLLOW)
		if err == nil {
			return os.NewFile(uintptr(fd), path), nil
		}
		if !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return nil, &os.LinkError{Op: "link", Old: "O_TMPFILE", New: path, Err: err}
		}
	}
	unix.Close(fd)
	return nil, fmt.Errorf("name a stage file in %s: every name tried exists", dir)
}
