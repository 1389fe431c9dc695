//go:build linux

package fusetest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// User is an unprivileged system user made for one test.
type User struct {
	Name     string
	UID, GID uint32

	ns *MountNS // where its commands run; nil: here
}

// NewUser adds a system user with its own group (useradd; root only) and
// deletes it when the test ends.
func NewUser(t testing.TB) User {
	t.Helper()
	name := fmt.Sprintf("abfs%08x", rand.Uint32())
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--user-group", "--shell", "/bin/sh", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
	})
	u := User{Name: name}
	for _, f := range []struct {
		flag string
		dst  *uint32
	}{{"-u", &u.UID}, {"-g", &u.GID}} {
		out, err := exec.Command("id", f.flag, name).Output()
		if err != nil {
			t.Fatalf("id %s %s: %v", f.flag, name, err)
		}
		if _, err := fmt.Sscan(strings.TrimSpace(string(out)), f.dst); err != nil {
			t.Fatalf("id %s %s: %q", f.flag, name, out)
		}
	}
	return u
}

// In is the user with its commands run in the mount namespace ns.
func (u User) In(ns *MountNS) User {
	u.ns = ns
	return u
}

// Sh runs script as the user (setpriv); it returns the combined output.
func (u User) Sh(script string) (string, error) {
	args := []string{"--reuid=" + u.Name, "--regid=" + u.Name, "--init-groups", "--", "sh", "-c", script}
	cmd := exec.Command("setpriv", args...)
	if u.ns != nil {
		cmd = u.ns.Command("setpriv", args...)
	}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// OK runs script as the user and fails t if it fails.
func (u User) OK(t testing.TB, script string) {
	t.Helper()
	if out, err := u.Sh(script); err != nil {
		t.Fatalf("as %s: %s: %v\n%s", u.Name, script, err, out)
	}
}

// Denied checks that script fails with a message containing want.
func (u User) Denied(t testing.TB, what, script, want string) {
	t.Helper()
	out, err := u.Sh(script)
	if err == nil || !strings.Contains(out, want) {
		t.Errorf("as %s, %s (%s): %v %q; want a failure saying %q", u.Name, what, script, err, out, want)
	}
}

// Reachable makes path's parent directories searchable by everyone (test
// temporary directories are 0700), and path readable, so that other users
// can reach it.
func Reachable(t testing.TB, path string) {
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
