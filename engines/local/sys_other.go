//go:build !linux

package local

import "os"

func renameNoReplace(oldpath, newpath string) error { return linkUnlink(oldpath, newpath) }

// lock is a no-op here: without flock, Open treats every stage file as stale.
func lock(f *os.File) error { return nil }

func removeIfUnlocked(path string) (bool, error) {
	if err := os.Remove(path); err != nil {
		return false, err
	}
	return true, nil
}
