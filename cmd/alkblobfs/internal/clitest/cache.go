package clitest

import (
	"os"
	"path/filepath"
	"testing"
)

// DropPageCache makes the next read of a mounted file reach the daemon.
func DropPageCache(t *testing.T) {
	t.Helper()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("1\n"), 0o200); err != nil {
		t.Skipf("cannot drop the page cache: %v", err)
	}
}

// CachedFile is where the --cache directory cdir keeps its copy of blob d.
func CachedFile(cdir, d string) string { return filepath.Join(cdir, "blobs", d[:2], d) }
