//go:build linux

package fusefs

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestAccessControl: with --allow-other, two unprivileged users get
// exactly what a namespace's mode grants them (EACCES for the rest), the
// root and the control files are the mounting user's, and a namespace's
// owner and mode survive a remount.
func TestAccessControl(t *testing.T) {
	requireFUSE(t)
	alice, bob := newUser(t), newUser(t)

	// Without --allow-other nobody but the mounting user gets in.
	private := mountStore(t, memSpec)
	reachable(t, private.mnt)
	bob.denied(t, "listing a mount without --allow-other", "ls "+private.mnt, "Permission denied")

	data := t.TempDir()
	cfg := defaultSpec.open(t, data)
	e := mountOn(t, data, cfg, func(c *Config) { c.AllowOther = true })
	reachable(t, e.mnt)
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, src, randBytes(61, 5000))
	reachable(t, src)
	d := sum(randBytes(61, 5000))
	m := e.mnt

	// Namespaces are made at the root by root (or the mounting user),
	// with mkdir's mode, and given away with chown.
	sh(t, fmt.Sprintf("umask 027; mkdir %[1]s/a && chown %[2]d:%[3]d %[1]s/a", m, alice.uid, alice.gid))
	fi, err := os.Stat(e.path("a"))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != 0o750 || st.Uid != alice.uid || st.Gid != alice.gid {
		t.Fatalf("namespace made with umask 027 and given to alice: mode %v uid %d gid %d", fi.Mode(), st.Uid, st.Gid)
	}
	alice.ok(t, fmt.Sprintf("cp %s %s/a/incoming/f && chgrp %d %s/a", src, m, alice.gid, m))

	// A namespace made without the mount (alkblobfs ns create) is the
	// mounting user's, 0755.
	if err := e.reg.Create(t.Context(), "cli"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(e.path("cli")); err != nil || fi.Mode().Perm() != 0o755 || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Getuid()) {
		t.Fatalf("namespace made by the CLI: %v, %v", fi.Mode(), err)
	}
	alice.ok(t, fmt.Sprintf("cmp %s %s/a/%s && ls %s/a", src, m, d, m))

	// Mode 0750: bob is neither owner nor in alice's group.
	denied := map[string]string{
		"list":              "ls %[1]s/a",
		"read":              "cat %[1]s/a/%[2]s",
		"write to incoming": "cp %[3]s %[1]s/a/incoming/g",
		"rm":                "rm -f %[1]s/a/%[2]s",
		"mkdir at the root": "mkdir %[1]s/b",
		"run a sweep":       "echo run > %[1]s/.alkblobfs/sweep",
		"set the timer":     "echo 1s > %[1]s/.alkblobfs/sweep-timer",
		"run a scrub":       "echo run > %[1]s/.alkblobfs/scrub",
	}
	for what, script := range denied {
		bob.denied(t, what, fmt.Sprintf(script, m, d, src), "Permission denied")
	}
	bob.denied(t, "chmod of alice's namespace", "chmod 777 "+m+"/a", "Operation not permitted")
	alice.denied(t, "chown of her namespace to bob", fmt.Sprintf("chown %d %s/a", bob.uid, m), "Operation not permitted")
	bob.ok(t, "cat "+m+"/.alkblobfs/stats >/dev/null")

	// 0755: bob may list and read, not write or remove.
	alice.ok(t, "chmod 755 "+m+"/a")
	bob.ok(t, fmt.Sprintf("ls %[1]s/a && cmp %[3]s %[1]s/a/%[2]s", m, d, src))
	bob.denied(t, "write to incoming of a 0755 namespace", fmt.Sprintf("cp %s %s/a/incoming/g", src, m), "Permission denied")
	bob.denied(t, "rm in a 0755 namespace", fmt.Sprintf("rm -f %s/a/%s", m, d), "Permission denied")

	// 0777: and write and remove.
	alice.ok(t, "chmod 777 "+m+"/a")
	other := randBytes(62, 3000)
	src2 := filepath.Join(filepath.Dir(src), "src2")
	writeFile(t, src2, other)
	reachable(t, src2)
	bob.ok(t, fmt.Sprintf("cp %s %s/a/incoming/g && test -f %s/a/%s && rm %s/a/%s", src2, m, m, sum(other), m, d))

	// The owner and mode persist: a new mount of the same store shows them.
	e.srv.Unmount()
	e2 := mountOn(t, data, defaultSpec.open(t, data), func(c *Config) { c.AllowOther = true })
	fi, err = os.Stat(e2.path("a"))
	if err != nil {
		t.Fatal(err)
	}
	st = fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != 0o777 || st.Uid != alice.uid {
		t.Fatalf("after a remount: mode %v uid %d", fi.Mode(), st.Uid)
	}
	fi, err = os.Stat(e2.path("a", incomingName))
	if err != nil || fi.Mode().Perm() != 0o777 || fi.Sys().(*syscall.Stat_t).Uid != alice.uid {
		t.Fatalf("incoming/ after a remount: %v, %v", fi, err)
	}
}

// testUser is an unprivileged user made for one test.
type testUser struct {
	name     string
	uid, gid uint32
}

// newUser adds a system user with its own group (useradd; root only) and
// deletes it when the test ends.
func newUser(t *testing.T) testUser {
	t.Helper()
	name := fmt.Sprintf("abfs%08x", rand.Uint32())
	run(t, "", "useradd", "--system", "--no-create-home", "--user-group", "--shell", "/bin/sh", name)
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
	})
	var u testUser
	u.name = name
	for _, f := range []struct {
		flag string
		dst  *uint32
	}{{"-u", &u.uid}, {"-g", &u.gid}} {
		out := strings.TrimSpace(run(t, "", "id", f.flag, name))
		if _, err := fmt.Sscan(out, f.dst); err != nil {
			t.Fatalf("id %s %s: %q", f.flag, name, out)
		}
	}
	return u
}

// sh runs script as the user; it returns the combined output.
func (u testUser) sh(script string) (string, error) {
	cmd := exec.Command("setpriv", "--reuid="+u.name, "--regid="+u.name, "--init-groups", "--", "sh", "-c", script)
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (u testUser) ok(t *testing.T, script string) {
	t.Helper()
	if out, err := u.sh(script); err != nil {
		t.Fatalf("as %s: %s: %v\n%s", u.name, script, err, out)
	}
}

// denied checks that script fails with a message containing want.
func (u testUser) denied(t *testing.T, what, script, want string) {
	t.Helper()
	out, err := u.sh(script)
	if err == nil || !strings.Contains(out, want) {
		t.Errorf("as %s, %s (%s): %v %q; want a failure saying %q", u.name, what, script, err, out, want)
	}
}

// reachable makes path's parent directories searchable by everyone (test
// temporary directories are 0700), so that other users can reach path.
func reachable(t *testing.T, path string) {
	t.Helper()
	for dir := filepath.Dir(path); dir != "/"; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o005 != 0o005 {
			if err := os.Chmod(dir, fi.Mode().Perm()|0o005); err != nil {
				t.Fatal(err)
			}
		}
	}
	if fi, err := os.Stat(path); err == nil && !fi.IsDir() {
		os.Chmod(path, fi.Mode().Perm()|0o004)
	}
}
