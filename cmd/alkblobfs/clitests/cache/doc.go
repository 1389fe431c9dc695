// Package cache holds black-box tests of alkblobfs's local cache of a
// remote large tier (cache_*_test.go), and of damaged or corrupt blobs
// under every reader (cachedamage_test.go, corrupt_test.go). It has no code
// but its tests: they run the binary clitest builds.
package cache
