//go:build !unix

package faultctl

import "testing"

func lockFile(t testing.TB, path string) (unlock func()) {
	t.Skip("faultctl: fault tests need flock (unix)")
	return nil
}
