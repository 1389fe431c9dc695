//go:build unix

package faultctl

import (
	"os"
	"syscall"
	"testing"
)

// lockFile takes an exclusive flock on path, waiting for other processes.
func lockFile(t testing.TB, path string) (unlock func()) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatalf("faultctl: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("faultctl: lock %s: %v", path, err)
	}
	return func() { f.Close() } // closing releases the lock
}
