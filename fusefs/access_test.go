//go:build linux

package fusefs

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
)

// TestAccessControl: with --allow-other, two unprivileged users get
// exactly what a namespace's mode grants them (EACCES for the rest), the
// root and the control files are the mounting user's, and a namespace's
// owner and mode survive a remount.
func TestAccessControl(t *testing.T) {
	requireFUSE(t)
	alice, bob := fusetest.NewUser(t), fusetest.NewUser(t)

	// Without --allow-other nobody but the mounting user gets in.
	private := mountStore(t, memSpec)
	fusetest.Reachable(t, private.mnt)
	bob.Denied(t, "listing a mount without --allow-other", "ls "+private.mnt, "Permission denied")

	data := t.TempDir()
	cfg := defaultSpec.open(t, data)
	e := mountOn(t, data, cfg, func(c *Config) { c.AllowOther = true })
	fusetest.Reachable(t, e.mnt)
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, src, randBytes(61, 5000))
	fusetest.Reachable(t, src)
	d := sum(randBytes(61, 5000))
	m := e.mnt

	// Namespaces are made at the root by root (or the mounting user),
	// with mkdir's mode, and given away with chown.
	sh(t, fmt.Sprintf("umask 027; mkdir %[1]s/a && chown %[2]d:%[3]d %[1]s/a", m, alice.UID, alice.GID))
	fi, err := os.Stat(e.path("a"))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != 0o750 || st.Uid != alice.UID || st.Gid != alice.GID {
		t.Fatalf("namespace made with umask 027 and given to alice: mode %v uid %d gid %d", fi.Mode(), st.Uid, st.Gid)
	}
	alice.OK(t, fmt.Sprintf("cp %s %s/a/incoming/f && chgrp %d %s/a", src, m, alice.GID, m))

	// A namespace made without the mount (alkblobfs ns create) is the
	// mounting user's, 0755.
	if err := e.reg.Create(t.Context(), "cli"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(e.path("cli")); err != nil || fi.Mode().Perm() != 0o755 || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Getuid()) {
		t.Fatalf("namespace made by the CLI: %v, %v", fi.Mode(), err)
	}
	alice.OK(t, fmt.Sprintf("cmp %s %s/a/%s && ls %s/a", src, m, d, m))

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
		bob.Denied(t, what, fmt.Sprintf(script, m, d, src), "Permission denied")
	}
	bob.Denied(t, "chmod of alice's namespace", "chmod 777 "+m+"/a", "Operation not permitted")
	alice.Denied(t, "chown of her namespace to bob", fmt.Sprintf("chown %d %s/a", bob.UID, m), "Operation not permitted")
	bob.OK(t, "cat "+m+"/.alkblobfs/stats >/dev/null")

	// 0755: bob may list and read, not write or remove.
	alice.OK(t, "chmod 755 "+m+"/a")
	bob.OK(t, fmt.Sprintf("ls %[1]s/a && cmp %[3]s %[1]s/a/%[2]s", m, d, src))
	bob.Denied(t, "write to incoming of a 0755 namespace", fmt.Sprintf("cp %s %s/a/incoming/g", src, m), "Permission denied")
	bob.Denied(t, "rm in a 0755 namespace", fmt.Sprintf("rm -f %s/a/%s", m, d), "Permission denied")

	// 0777: and write and remove.
	alice.OK(t, "chmod 777 "+m+"/a")
	other := randBytes(62, 3000)
	src2 := filepath.Join(filepath.Dir(src), "src2")
	writeFile(t, src2, other)
	fusetest.Reachable(t, src2)
	bob.OK(t, fmt.Sprintf("cp %s %s/a/incoming/g && test -f %s/a/%s && rm %s/a/%s", src2, m, m, sum(other), m, d))

	// The owner and mode persist: a new mount of the same store shows them.
	e.srv.Unmount()
	e2 := mountOn(t, data, defaultSpec.open(t, data), func(c *Config) { c.AllowOther = true })
	fi, err = os.Stat(e2.path("a"))
	if err != nil {
		t.Fatal(err)
	}
	st = fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != 0o777 || st.Uid != alice.UID {
		t.Fatalf("after a remount: mode %v uid %d", fi.Mode(), st.Uid)
	}
	fi, err = os.Stat(e2.path("a", incomingName))
	if err != nil || fi.Mode().Perm() != 0o777 || fi.Sys().(*syscall.Stat_t).Uid != alice.UID {
		t.Fatalf("incoming/ after a remount: %v, %v", fi, err)
	}
}
