//go:build !unix

package enginetest

import "testing"

func checkFd(t *testing.T, fd uintptr, want []byte) {
	t.Skip("descriptor reads are checked on unix only")
}
