// Package packaging holds black-box tests of how alkblobfs is built,
// installed and shipped: make build, make install, the .deb, releases and
// versions, the Prometheus rules and dashboard, and the promises the docs
// make. It has no code but its tests: they run the binary clitest builds,
// and make and dpkg in the repository's root.
package packaging
