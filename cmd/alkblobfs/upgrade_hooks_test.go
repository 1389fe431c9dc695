package main

import (
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/fusefs"
)

// TestTestHooksNotInProduction: this test's package is built without the
// tag alkblobfs_testhooks, as a production binary is: an environment
// that sets every hook changes nothing, and nothing is passed on. (The
// tests' own binary has the hooks: TestUpgradeFailuresLeaveOldServing
// uses them.)
func TestTestHooksNotInProduction(t *testing.T) {
	if testHooks {
		t.Skip("built with -tags alkblobfs_testhooks")
	}
	env := []string{envTestDieAt + "=2", envTestHangAt + "=6", envTestStateVersion + "=9", envTestServingTimeout + "=1s", envTestPendFail + "=1", "HOME=/root"}
	want := hooks{stateVersion: fusefs.HandoverVersion, servingTimeout: servingTimeout}
	if got := hooksFrom(env); got != want {
		t.Errorf("hooks of a production build: %+v, want %+v", got, want)
	}
	if got := testEnv(env); got != nil {
		t.Errorf("a production build passes on %q", got)
	}
	if servingTimeout < 10*time.Second {
		t.Errorf("servingTimeout %s", servingTimeout)
	}
}
