//go:build linux

package main

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
)

// TestFstabMountAll: mount -a over an fstab with alkblobfs lines mounts
// them, and a second mount -a finds them mounted (it compares each line's
// source and mountpoint with mountinfo's), exits 0 and changes nothing.
// The mount shows the line's source: the data directory (resolved, as
// mount(8) resolves it), or the label of a store that has none; umount by
// source finds it.
func TestFstabMountAll(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("mount(8) with an fstab line needs root")
	}
	installHelper(t)
	c := clitest.NewCLI(t)
	// Through a symlink: mount(8) resolves a path source before it
	// compares, so the mount must show the resolved one.
	link := filepath.Join(t.TempDir(), "blobs")
	if err := os.Symlink(c.Data, link); err != nil {
		t.Fatal(err)
	}
	mnt, memMnt := t.TempDir(), t.TempDir()
	memLog := filepath.Join(t.TempDir(), "mount.log")
	fstab := filepath.Join(t.TempDir(), "fstab")
	lines := fmt.Sprintf("%s %s fuse.alkblobfs defaults,receipt_ttl=1m 0 0\n", link, mnt) +
		fmt.Sprintf("scratch-blobs %s fuse.alkblobfs kv=mem:,large=mem:,log_file=%s 0 0\n", memMnt, memLog)
	if err := os.WriteFile(fstab, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Unmount(mnt, syscall.MNT_DETACH)
		syscall.Unmount(memMnt, syscall.MNT_DETACH)
	})
	for i := range 2 {
		if out, err := exec.Command("mount", "-a", "-T", fstab).CombinedOutput(); err != nil {
			t.Fatalf("mount -a -T %s (run %d): %v: %s", fstab, i+1, err, out)
		}
	}
	for _, m := range []struct{ dir, source string }{{mnt, c.Data}, {memMnt, "scratch-blobs"}} {
		if n := mountsOn(t, m.dir); n != 1 {
			t.Errorf("after two mount -a, %d mounts on %s; want 1", n, m.dir)
		}
		out, err := exec.Command("findmnt", "-n", "-o", "SOURCE,FSTYPE", m.dir).CombinedOutput()
		if got := strings.Join(strings.Fields(string(out)), " "); err != nil || got != m.source+" fuse.alkblobfs" {
			t.Errorf("findmnt %s: %q, %v; want %q", m.dir, got, err, m.source+" fuse.alkblobfs")
		}
	}
	servedAfterReturn(t, mnt)
	// umount by source, as for any filesystem: a path source with -c,
	// since umount(8) takes a directory for a mountpoint without looking
	// at mountinfo otherwise (as for a bind mount's source).
	for _, m := range []struct {
		args     []string
		dir, log string
	}{
		{[]string{"-c", c.Data}, mnt, filepath.Join(c.Data, "mount.log")},
		{[]string{"scratch-blobs"}, memMnt, memLog},
	} {
		if out, err := exec.Command("umount", m.args...).CombinedOutput(); err != nil {
			t.Fatalf("umount %s (the source): %v: %s", strings.Join(m.args, " "), err, out)
		}
		clitest.Eventually(t, 10*time.Second, "the daemon's exit", func() bool {
			b, _ := os.ReadFile(m.log)
			return strings.Contains(string(b), "msg=unmounted mountpoint="+m.dir) && !clitest.DaemonRunning(m.dir)
		})
		if n := mountsOn(t, m.dir); n != 0 {
			t.Errorf("umount %s left %d mounts on %s", strings.Join(m.args, " "), n, m.dir)
		}
	}
}

// TestHelperSource: the helper passes mount(8)'s SOURCE on as the mount's
// --source, whatever it is.
func TestHelperSource(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"/srv/blobs /mnt/b -o verify=strict":     "--data /srv/blobs mount --daemon --source=/srv/blobs --verify=strict /mnt/b",
		"alkblobfs /mnt/b -o kv=postgres://h/db": "--kv=postgres://h/db mount --daemon --source=alkblobfs /mnt/b",
	} {
		h, err := parseHelper(strings.Fields(in))
		if got := strings.Join(h.argv(), " "); err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", in, got, err, want)
		}
	}
}

// TestMountSource: a mount shows as its source its data directory, or for
// a store with no tier there its kv engine's name (PostgreSQL's in
// TestMountSourcePostgres), or --source.
func TestMountSource(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	data := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, data},
		{[]string{"--large", "mem:"}, data}, // the kv tier is there
		{[]string{"--kv", "mem:", "--large", "mem:"}, "mem"},
		{[]string{"--source", "my blobs"}, "my blobs"},
	} {
		mnt := t.TempDir()
		dm := clitest.StartDaemon(t, data, mnt, tc.args...)
		if got := findmntSource(t, mnt); got != tc.want {
			t.Errorf("mount %v: source %q, want %q", tc.args, got, tc.want)
		}
		clitest.StopDaemon(t, dm)
	}
	c := clitest.NewCLI(t)
	c.Fail(2, "--source is empty", "mount", "--source=", t.TempDir())
}

// findmntSource is findmnt's SOURCE of the mount on dir.
func findmntSource(t *testing.T, dir string) string {
	t.Helper()
	out, err := exec.Command("findmnt", "-n", "-o", "SOURCE", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("findmnt %s: %v: %s", dir, err, out)
	}
	return strings.TrimSuffix(string(out), "\n")
}

// mountsOn counts the mounts on dir in mountinfo.
func mountsOn(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == dir {
			n++
		}
	}
	return n
}

// TestMountSourcePostgres: a mount of a store with no tier in the data
// directory shows its PostgreSQL server and database as its source:
// user@host:port/database, never the password the URL holds.
func TestMountSourcePostgres(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	dsn := pgtest.DSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	want := "postgres://" + u.User.Username() + "@" + u.Host + u.Path
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, t.TempDir(), mnt, "--kv", dsn, "--large", "pglo")
	got := findmntSource(t, mnt)
	if got != want || pw == "" || strings.Contains(got, pw) {
		t.Errorf("source %q; want %q (and never the password)", got, want)
	}
	clitest.StopDaemon(t, dm)
}
