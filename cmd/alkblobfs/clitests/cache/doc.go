// Package cache holds black-box tests of alkblobfs's local cache of a
// remote large tier (--cache): fills, room, kill -9 mid-fill, writes
// through. It has no code but its tests: they run the binary clitest
// builds.
package cache
