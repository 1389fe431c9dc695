// Package clitest holds what alkblobfs's black-box tests share: they test
// the CLI as a user runs it. Main builds the binary once per test binary
// and every test execs it against its own t.TempDir() store, through CLI
// (commands), StartDaemon (mounts) and StartServe (HTTP servers).
//
// Tests run in parallel (t.Parallel; make test gives -parallel 6): a
// command's or daemon's environment goes in CLI.Env or StartDaemonEnv,
// never t.Setenv. A test stays serial, saying why, when it changes this
// process (GOGC), bounds a time, or holds files open on a mount whose every
// close counts: another test's fork and exec closes copies of them, and
// each close of a file in incoming/ is a FLUSH that commits. Each package
// of tests is its own process, so only its own tests can do that.
package clitest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Bin is the alkblobfs binary Main built; BuildErr is why there is none
// (NewCLI fails every test with it).
var (
	Bin      string
	BuildErr error
)

// Main is a test package's TestMain: it builds the binary into a temporary
// directory, runs the tests and removes the directory. A TestMain that
// returns exits with m.Run's status.
func Main(m *testing.M) {
	dir, err := os.MkdirTemp("", "alkblobfs-cli-test-")
	if err != nil {
		BuildErr = err
	} else {
		defer os.RemoveAll(dir)
		Bin = filepath.Join(dir, "alkblobfs")
		// Position-independent, as make build and make deb build it:
		// the tests that run make then find every package compiled. With
		// the upgrade's test hooks (cmd/alkblobfs/upgrade_hooks.go), which
		// a production build does not have.
		cmd := exec.Command("go", "build", "-buildmode=pie", "-tags", "alkblobfs_testhooks", "-o", Bin, pkgPath)
		if out, err := cmd.CombinedOutput(); err != nil {
			BuildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	}
	m.Run()
}

// pkgPath is the command's package: go build finds it from any directory
// of the module, whichever package's tests run.
const pkgPath = "github.com/alkblobfs/alkblobfs/cmd/alkblobfs"
