//go:build alkblobfs_testhooks

package main

// testHooks: this build reads the upgrade's test hooks (ALKBLOBFS_TEST_*,
// upgrade.go's hooks). Only the tests' binary is built with the tag
// alkblobfs_testhooks (TestMain); a production build has none.
const testHooks = true
