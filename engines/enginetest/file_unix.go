//go:build unix

package enginetest

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

// checkFd preads the descriptor (leaving its offset alone) and compares.
func checkFd(t *testing.T, fd uintptr, want []byte) {
	t.Helper()
	for _, off := range []int{0, 1, len(want) / 2, len(want) - 10} {
		p := make([]byte, len(want)-off+10)
		n, err := unix.Pread(int(fd), p, int64(off))
		if err != nil || n != len(want)-off || !bytes.Equal(p[:n], want[off:]) {
			t.Fatalf("pread(fd %d, off %d) = %d, %v (equal %v); want %d bytes of the blob",
				fd, off, n, err, bytes.Equal(p[:n], want[off:]), len(want)-off)
		}
	}
}
