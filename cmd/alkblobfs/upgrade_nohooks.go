//go:build !alkblobfs_testhooks

package main

// testHooks: a production build ignores the upgrade's test hooks
// (upgrade_hooks.go has the tests' build).
const testHooks = false
