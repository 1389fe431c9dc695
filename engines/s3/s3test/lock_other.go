//go:build !unix

package s3test

import "testing"

func lockFile(t testing.TB, path string) (unlock func()) {
	t.Skip("s3test: fault tests need flock (unix)")
	return nil
}
