// Package damage holds black-box tests of damaged, corrupt and lost
// blobs (in the local store and in the --cache of a remote tier) under
// every reader: no reader returns a wrong byte. It has no code but its
// tests: they run the binary clitest builds.
package damage
