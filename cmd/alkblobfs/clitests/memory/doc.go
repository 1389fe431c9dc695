// Package memory holds black-box tests of the memory alkblobfs uses:
// peak RSS of put and get, a mount's memory under load and while listing
// a large namespace. It has no code but its tests: they run the binary
// clitest builds.
package memory
