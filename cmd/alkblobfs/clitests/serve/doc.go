// Package serve holds black-box tests of the HTTP surface (alkblobfs
// serve, mount --listen): access modes and tokens, upkeep over HTTP, and
// quotas on every surface. It has no code but its tests: they run the
// binary clitest builds.
package serve
