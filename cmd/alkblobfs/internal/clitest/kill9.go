//go:build linux

package clitest

import (
	"os/exec"
	"testing"
)

// AbortFUSE frees a hung mount with the product's own remedy, umount
// --force (fusectl abort, then detach), which reads mountinfo only and so
// cannot hang the test.
func AbortFUSE(t *testing.T, mnt string) {
	if out, err := exec.Command(Bin, "umount", "--force", mnt).CombinedOutput(); err != nil {
		t.Logf("umount --force %s: %v: %s", mnt, err, out)
	}
}
