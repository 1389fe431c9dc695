//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// The first-ten-minutes friction of issue 29, each reproduced as a user
// meets it.

// TestLogLevelDefaultPerCommand: --help and the man page show the level
// each command logs at without --log-level: info for the daemons (mount,
// serve), warn for the rest.
func TestLogLevelDefaultPerCommand(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	man := t.TempDir()
	c.OK("man", man)
	for cmd, want := range map[string]string{"mount": "info", "serve": "info", "ls": "warn", "put": "warn", "": "warn"} {
		help := c.OK(append(strings.Fields(cmd), "--help")...)
		var line string
		for _, l := range clitest.Lines(help) {
			if strings.Contains(l, "--log-level") {
				line = l
			}
		}
		if !strings.HasSuffix(line, "(default "+want+")") {
			t.Errorf("alkblobfs %s --help: %q; want (default %s)", cmd, line, want)
		}
		page := "alkblobfs.1"
		if cmd != "" {
			page = "alkblobfs-" + cmd + ".1"
		}
		b, err := os.ReadFile(filepath.Join(man, page))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), `\fB--log-level\fP=`+want+"\n") {
			t.Errorf("%s: --log-level's default is not %s", page, want)
		}
	}
}

// TestMountLogNamesDataAndHandles: the mount logs at info by default, its
// "mounted" line names the data directory, and an unmount that a control
// file keeps busy says that a control file is open.
func TestMountLogNamesDataAndHandles(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	data, mnt := t.TempDir(), t.TempDir()
	real, err := filepath.EvalSymlinks(data)
	if err != nil {
		t.Fatal(err)
	}
	dm := clitest.StartDaemon(t, data, mnt)
	var mounted string
	for _, l := range clitest.Lines(dm.Stderr.String()) {
		if strings.Contains(l, "msg=mounted") {
			mounted = l
		}
	}
	if !strings.Contains(mounted, "level=INFO") || !strings.Contains(mounted, " data="+real+" ") {
		t.Fatalf("the mounted line %q does not name data=%s at INFO", mounted, real)
	}

	f, err := os.Open(filepath.Join(mnt, ".alkblobfs", "stats"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dm.Cmd.Process.Signal(syscall.SIGTERM)
	clitest.Eventually(t, 20*time.Second, "the lazy-detach warning", func() bool {
		return strings.Contains(dm.Stderr.String(), "detaching lazily")
	})
	f.Close()
	if code := dm.Wait(20 * time.Second); code != 0 {
		t.Fatalf("mount exit %d:\n%s", code, dm.Stderr.String())
	}
	for _, l := range clitest.Lines(dm.Stderr.String()) {
		if strings.Contains(l, "detaching lazily") && !strings.Contains(l, "open_control_files=1") {
			t.Fatalf("the warning does not count the open control file: %s", l)
		}
	}
}

// TestDataIsAFile: --data naming a regular file is "not a directory",
// as root too (whom access(2) tells EACCES), and creates nothing.
func TestDataIsAFile(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.Data = filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(c.Data, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.Fail(1, "data directory "+c.Data+" (set by --data): not a directory", "ls")
	if b, err := os.ReadFile(c.Data); err != nil || string(b) != "x" {
		t.Fatalf("the file changed: %q, %v", b, err)
	}
}

// TestNsRmMissing: removing a namespace that does not exist says so, with
// no hint to create it.
func TestNsRmMissing(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	r := c.Fail(1, `namespace "nosuch" does not exist (nothing to remove)`, "ns", "rm", "nosuch")
	if strings.Contains(r.Stderr, "create") {
		t.Fatalf("ns rm suggests creating: %q", r.Stderr)
	}
}
