//go:build linux

package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
)

// TestDiskFull: with a store on a full filesystem, a copy into incoming/
// fails with ENOSPC — a small file at its close (the kv tier is full), a
// large one at its writes or close (the large tier) — publishes nothing,
// and works again, without a restart, once space is freed. Both default
// tiers (SQLite and local on a 4 MiB tmpfs) and both PostgreSQL tiers
// (postgres kv and pglo, in a database whose tablespace is on a 48 MiB
// tmpfs; the server's WAL stays on its own disk).
func TestDiskFull(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	t.Run("sqlite+local", func(t *testing.T) {
		fsdir := smallFS(t, "4m")
		data := filepath.Join(fsdir, "data")
		if err := os.Mkdir(data, 0o700); err != nil {
			t.Fatal(err)
		}
		c := clitest.NewCLI(t)
		c.Data = data
		diskFull(t, c, fsdir)
	})
	t.Run("postgres+pglo", func(t *testing.T) {
		fsdir := smallFS(t, "48m")
		space := filepath.Join(fsdir, "space")
		if err := os.Mkdir(space, 0o700); err != nil {
			t.Fatal(err)
		}
		for dir := fsdir; dir != "/"; dir = filepath.Dir(dir) {
			os.Chmod(dir, 0o755) // the server's user reaches the tablespace
		}
		c := clitest.NewCLI(t)
		c.Flags = []string{"--kv", pgtest.TablespaceDSN(t, space), "--large", "pglo"}
		diskFull(t, c, fsdir)
	})
}

// smallFS mounts a tmpfs of size on a temporary directory.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	fsdir := t.TempDir()
	if err := syscall.Mount("tmpfs", fsdir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatalf("mount a small tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(fsdir, syscall.MNT_DETACH) })
	return fsdir
}

// diskFull fills fsdir, which holds c's store, and copies files in
// through a mount of it.
func diskFull(t *testing.T, c *clitest.CLI, fsdir string) {
	c.OK("ns", "create", "ns")
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt, c.Flags...)
	src := t.TempDir()
	small, _, smallD := clitest.WriteFile(t, src, 100<<10, 1)
	large, _, largeD := clitest.WriteFile(t, src, 600<<10, 2)

	// Fill the filesystem.
	filler := filepath.Join(fsdir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()

	for _, p := range []string{small, large} {
		out, err := exec.Command("cp", p, filepath.Join(mnt, "ns", "incoming", filepath.Base(p))).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "No space left on device") {
			t.Fatalf("cp of %s into a full store: %v: %s; want ENOSPC", filepath.Base(p), err, out)
		}
	}
	if got := clitest.Lines(c.OK("ls", "ns")); len(got) != 0 {
		t.Fatalf("a failed copy published %v", got)
	}
	// The CLI's error names the put once (issue 29: "put sqlite:… D: put
	// sqlite:… D: no space left in the store").
	r := c.Run(nil, "put", small)
	if r.Code != 1 || strings.Count(r.Stderr, smallD) != 1 || strings.Count(r.Stderr, "put ") != 1 || !strings.Contains(r.Stderr, "no space left") {
		t.Fatalf("put into a full store: exit %d, stderr %q; want exit 1 naming the put of %s once", r.Code, r.Stderr, smallD)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{small, large} {
		if out, err := exec.Command("cp", p, filepath.Join(mnt, "ns", "incoming", filepath.Base(p)+".again")).CombinedOutput(); err != nil {
			t.Fatalf("cp once space is freed: %v: %s", err, out)
		}
	}
	got := clitest.Lines(c.OK("ls", "ns"))
	if !slices.Contains(got, smallD) || !slices.Contains(got, largeD) {
		t.Fatalf("after freeing space the namespace lists %v; want both blobs", got)
	}
	clitest.StopDaemon(t, dm)
}
