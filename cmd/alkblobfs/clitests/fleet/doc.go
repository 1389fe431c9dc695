// Package fleet holds black-box tests of stores shared by several hosts
// (--fleet on PostgreSQL): fleet mounts, kill -9 and resync, partitions and
// pin leases, propagation, clock skew and the settle cut, and the fleet
// acceptance test. It has no code but its tests: they run the binary
// clitest builds.
package fleet
