//go:build !linux

package local

import (
	"errors"
	"os"
)

func renameNoReplace(oldpath, newpath string) error { return linkUnlink(oldpath, newpath) }

// lock is a no-op here: without flock, Open treats every stage file as stale.
func lock(f *os.File) error { return nil }

func removeIfUnlocked(path string) (bool, error) {
	if err := os.Remove(path); err != nil {
		return false, err
	}
	return true, nil
}

// seekData: no SEEK_DATA here; callers treat the whole file as data.
func seekData(f *os.File, off int64) (start, end int64, err error) {
	return 0, 0, errors.ErrUnsupported
}

// startWriteback: no sync_file_range here; the fsync at Commit writes all.
func startWriteback(f *os.File, off, n int64) error { return nil }

var errNoTmpfile = errors.New("no O_TMPFILE")

func createLockedUnnamed(dir, pattern string) (*os.File, error) { return nil, errNoTmpfile }
