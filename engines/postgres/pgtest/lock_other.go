//go:build !unix

package pgtest

import "testing"

func lockFile(t testing.TB, path string) (unlock func()) {
	t.Skip("pgtest: fault tests need flock (unix)")
	return nil
}
