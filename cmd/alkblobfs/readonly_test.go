//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
)

// TestReadOnlyDataDir: a data directory on a read-only filesystem (a
// read-only bind mount) serves reads — get, cat, ls, stat, verify and a
// --read-only mount — while every command that would change the store
// fails at once with a clear error, and nothing is written.
func TestReadOnlyDataDir(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "n")
	dir := t.TempDir()
	small, _, ds := clitest.WriteFile(t, dir, 100, 1)
	large, _, dl := clitest.WriteFile(t, dir, 2<<20, 2)
	c.OK("put", "--ns", "n", small, large)

	// As a store made before namespaces had permissions: no such columns.
	func() {
		e, err := sqlite.Open(t.Context(), filepath.Join(c.Data, "kv.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		for _, col := range []string{"uid", "gid", "mode"} {
			if _, err := e.DB().ExecContext(t.Context(), "ALTER TABLE ns DROP COLUMN "+col); err != nil {
				t.Fatal(err)
			}
		}
	}()

	ro := t.TempDir()
	if err := syscall.Mount(c.Data, ro, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(ro, syscall.MNT_DETACH) })
	if err := syscall.Mount("", ro, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	r := clitest.NewCLI(t)
	r.Data = ro
	before := tree(t, c.Data)

	if got := clitest.Sum([]byte(r.OK("cat", ds))); got != ds {
		t.Fatalf("cat of the small blob: %s", got)
	}
	out := filepath.Join(t.TempDir(), "out")
	r.OK("get", dl, "-o", out)
	if b, err := os.ReadFile(out); err != nil || clitest.Sum(b) != dl {
		t.Fatalf("get -o of the large blob: %v", err)
	}
	if ls := r.OK("ls", "n"); !strings.Contains(ls, ds) || !strings.Contains(ls, dl) {
		t.Fatalf("ls n: %q", ls)
	}
	r.OK("stat", dl)
	r.OK("verify")

	for _, args := range [][]string{
		{"put", small}, {"ns", "create", "m"}, {"ns", "rm", "n"}, {"link", "n", ds}, {"unlink", "n", ds}, {"rm", ds}, {"sweep"},
	} {
		r.Fail(1, "read-only", args...)
	}
	r.Fail(1, "--read-only", "mount", t.TempDir())

	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, ro, mnt, "--read-only")
	// Read through a child: the test process must not touch a mount it
	// does not serve when the daemon could die.
	if b, err := exec.Command("sh", "-c", "sha256sum < "+filepath.Join(mnt, "n", dl)).Output(); err != nil || !strings.HasPrefix(string(b), dl) {
		t.Fatalf("read through the --read-only mount: %v %q", err, b)
	}
	clitest.StopDaemon(t, dm)

	if after := tree(t, c.Data); after != before {
		t.Fatalf("the read-only data directory changed:\nbefore %s\nafter  %s", before, after)
	}
}

// tree lists the files under dir with their sizes, for comparing.
func tree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(&b, "%s:%d:%d ", rel, fi.Size(), fi.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
