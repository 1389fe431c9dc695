//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
)

// TestHelperArgs: mount(8)'s call of the helper becomes alkblobfs's own
// arguments.
func TestHelperArgs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want string
		fake bool
		err  string
	}{
		{in: "/srv/blobs /mnt/b -o rw,defaults,_netdev,x-systemd.after=network.target,verify=strict,sweep_every=1h,allow_other,ro",
			want: "--data /srv/blobs mount --daemon --verify=strict --sweep-every=1h --allow-other --read-only /mnt/b"},
		{in: "alkblobfs /mnt/b -n -o kv=postgres://h/db,large=pglo,fleet,scrub_every=24h",
			want: "--kv=postgres://h/db --large=pglo --fleet mount --daemon --scrub-every=24h /mnt/b"},
		{in: "/d /m -f -o nonempty", want: "--data /d mount --daemon --nonempty /m", fake: true},
		{in: "/d /m -s -o bogus,passthrough=false", want: "--data /d mount --daemon --passthrough=false /m"},
		{in: "/d /m -o bogus", err: `unknown option "bogus"`},
		{in: "/d", err: "want SOURCE MOUNTPOINT"},
		{in: "/d /m -x", err: "unknown flag -x"},
	} {
		out, fake, err := helperArgs(strings.Fields(tc.in))
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error saying %q", tc.in, err, tc.err)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case strings.Join(out, " ") != tc.want || fake != tc.fake:
			t.Errorf("%q:\n got %q (fake %v)\nwant %q (fake %v)", tc.in, strings.Join(out, " "), fake, tc.want, tc.fake)
		}
	}
}

// TestMountDaemon: mount --daemon returns once the mount serves (a stat
// right after it returns sees the mount), the daemon exits on umount, and
// a daemon that cannot mount makes the command fail with its reason.
func TestMountDaemon(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	mnt := t.TempDir()
	log := filepath.Join(t.TempDir(), "mount.log")
	c.OK("mount", "--daemon", "--log-file", log, mnt)
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	servedAfterReturn(t, mnt)
	clitest.UnmountAndWait(t, mnt, log)

	c.Fail(1, "does not exist", "mount", "--daemon", "--log-file", log, filepath.Join(mnt, "nope"))
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "x"), nil, 0o600)
	c.Fail(1, "not empty", "mount", "--daemon", "--log-file", log, full)
	c.OK("mount", "--daemon", "--nonempty", "--log-file", log, full)
	t.Cleanup(func() { syscall.Unmount(full, syscall.MNT_DETACH) })
	servedAfterReturn(t, full)
	clitest.UnmountAndWait(t, full, log)
	if _, err := os.Stat(filepath.Join(full, "x")); err != nil {
		t.Fatalf("the file under the mountpoint after umount: %v", err)
	}
}

// TestFstabMount: an fstab line of type fuse.alkblobfs mounts with
// mount(8) (util-linux's -T names an alternative fstab) through the
// mount.fuse.alkblobfs helper, with its options; reads and writes work;
// umount unmounts and the daemon exits.
func TestFstabMount(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("mount(8) with an fstab line needs root")
	}
	installHelper(t)
	c := clitest.NewCLI(t)
	mnt := t.TempDir()
	fstab := filepath.Join(t.TempDir(), "fstab")
	line := fmt.Sprintf("%s %s fuse.alkblobfs defaults,_netdev,verify=strict,sweep_every=1h,receipt_ttl=1m,x-systemd.requires=network-online.target 0 0\n", c.Data, mnt)
	if err := os.WriteFile(fstab, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-T", fstab, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount -T %s %s: %v: %s", fstab, mnt, err, out)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	servedAfterReturn(t, mnt)
	stats, err := os.ReadFile(filepath.Join(mnt, ".alkblobfs", "stats"))
	if err != nil || !strings.Contains(string(stats), `"verify": "strict"`) || !strings.Contains(string(stats), `"sweep_timer": "1h0m0s"`) {
		t.Fatalf("stats of the fstab mount (options verify=strict, sweep_every=1h): %v %s", err, stats)
	}
	src, _, d := clitest.WriteFile(t, t.TempDir(), 200<<10, 5)
	sh := fmt.Sprintf("mkdir %[1]s/ns && cp %[2]s %[1]s/ns/incoming/f && cmp %[2]s %[1]s/ns/%[3]s", mnt, src, d)
	if out, err := exec.Command("sh", "-c", sh).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", sh, err, out)
	}
	clitest.UnmountAndWait(t, mnt, filepath.Join(c.Data, "mount.log"))
	if !slices.Contains(clitest.Lines(c.OK("ls", "ns")), d) {
		t.Fatal("the file written through the fstab mount is not in the store")
	}

	// A bad option: mount fails and says why.
	bad := fmt.Sprintf("%s %s fuse.alkblobfs verify=fast 0 0\n", c.Data, mnt)
	os.WriteFile(fstab, []byte(bad), 0o644)
	out, err := exec.Command("mount", "-T", fstab, mnt).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "verify mode") {
		t.Fatalf("mount with verify=fast: %v: %s", err, out)
	}
}

// installHelper links /sbin/mount.fuse.alkblobfs to the binary under test
// for the test's duration (mount(8) looks for helpers only in /sbin).
func installHelper(t *testing.T) {
	t.Helper()
	clitest.HelperLock(t) // not while TestDebPackage has installed the package's
	link := "/sbin/" + helperName
	if target, err := os.Readlink(link); err == nil && target != clitest.Bin {
		t.Fatalf("%s exists (-> %s): not replacing an installed helper", link, target)
	} else if err == nil {
		os.Remove(link)
	} else if _, serr := os.Lstat(link); serr == nil {
		t.Fatalf("%s exists: not replacing an installed helper", link)
	}
	if err := os.Symlink(clitest.Bin, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(link) })
}

// servedAfterReturn checks, right after a mount command returned, that the
// directory is the mount and serves.
func servedAfterReturn(t *testing.T, mnt string) {
	t.Helper()
	var st, parent syscall.Stat_t
	if err := syscall.Stat(mnt, &st); err != nil {
		t.Fatalf("stat right after mount returned: %v", err)
	}
	if err := syscall.Stat(filepath.Dir(mnt), &parent); err != nil {
		t.Fatal(err)
	}
	if st.Dev == parent.Dev {
		t.Fatal("right after mount returned, the mountpoint is not a mount")
	}
	if _, err := os.Stat(filepath.Join(mnt, ".alkblobfs", "stats")); err != nil {
		t.Fatalf("right after mount returned: %v", err)
	}
}

// TestUnprivilegedMountErrors: a mount by a user other than root that
// cannot open /dev/fuse, or that asks for --allow-other without
// user_allow_other in /etc/fuse.conf, fails in one line that says how to
// fix it (not "fusermount exited with code 256").
//
// The user runs in a mount namespace of the test's own, whose /dev/fuse
// is a node of the test's own: the test changes its mode, never the
// machine's (a killed run left that changed), and the mount it makes
// stays in the namespace.
func TestUnprivilegedMountErrors(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("making a user needs root")
	}
	host := fusetest.HostDevFUSE(t)
	t.Cleanup(func() {
		if now := fusetest.HostDevFUSE(t); now != host {
			t.Errorf("the host's /dev/fuse changed: %v, was %v", now, host)
		}
	})
	u := fusetest.NewUser(t)
	// After the user: its cleanup, which waits for the user's daemon to
	// exit, then runs before userdel.
	ns := fusetest.PrivateDevFUSE(t, 0o600)
	u = u.In(ns)
	fusetest.Reachable(t, clitest.Bin)
	dir := t.TempDir()
	data, mnt := filepath.Join(dir, "data"), filepath.Join(dir, "mnt")
	for _, d := range []string{data, mnt} {
		os.Mkdir(d, 0o700)
		os.Chown(d, int(u.UID), int(u.GID))
	}
	fusetest.Reachable(t, data)
	mount := fmt.Sprintf("%s --data %s mount --daemon --log-file %s/log %s", clitest.Bin, data, data, mnt)

	u.Denied(t, "a mount without access to /dev/fuse", mount, "cannot open /dev/fuse as user "+u.Name+": permission denied (make it usable by this user: chmod 0666 /dev/fuse")

	ns.Chmod(t, 0o666)
	if conf, _ := os.ReadFile("/etc/fuse.conf"); slices.Contains(strings.Split(string(conf), "\n"), "user_allow_other") {
		t.Log("/etc/fuse.conf allows allow_other to users here: that case is not exercised")
	} else {
		u.Denied(t, "--allow-other without user_allow_other", strings.Replace(mount, " mount ", " mount --allow-other ", 1),
			"--allow-other as user "+u.Name+" needs user_allow_other in /etc/fuse.conf (uncomment it there), or mount as root")
	}
	out, err := u.Sh(mount)
	if err != nil {
		t.Fatalf("a mount by %s once /dev/fuse is usable: %v: %s", u.Name, err, out)
	}
	u.OK(t, fmt.Sprintf("mkdir %[1]s/ns && echo hi > %[1]s/ns/incoming/f && ls %[1]s/ns | grep -q incoming && fusermount3 -u %[1]s", mnt))
	clitest.Eventually(t, 10*time.Second, "the daemon's exit", func() bool { return !clitest.DaemonRunning(mnt) })
}
