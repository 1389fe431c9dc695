//go:build linux

package fusefs

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// TestAccessTable: with --allow-other, what the kernel lets users do with
// a namespace through the mount, from the owner, group and mode the mount
// shows on its directory and incoming/, is what namespaces.Allowed decides
// for the same Perm and principal — for the owner, a member of the group
// by a supplementary group only, and anyone else, over modes that tell
// the classes and bits apart. The HTTP surface calls Allowed itself, so
// both surfaces keep one rule.
func TestAccessTable(t *testing.T) {
	requireFUSE(t)
	alice, carol, bob := fusetest.NewUser(t), fusetest.NewUser(t), fusetest.NewUser(t)
	// carol is in alice's group by a supplementary group alone.
	if out, err := exec.Command("usermod", "-a", "-G", alice.Name, carol.Name).CombinedOutput(); err != nil {
		t.Fatalf("usermod: %v: %s", err, out)
	}
	data := t.TempDir()
	e := mountOn(t, data, defaultSpec.open(t, data), func(c *Config) { c.AllowOther = true })
	fusetest.Reachable(t, e.mnt)
	m := e.mnt
	content, gone := randBytes(71, 3000), randBytes(72, 2000)
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, src, content)
	writeFile(t, src+"2", gone)
	fusetest.Reachable(t, src)
	fusetest.Reachable(t, src+"2")
	sh(t, fmt.Sprintf("mkdir %[1]s/a && chown %[2]d:%[3]d %[1]s/a && cp %[4]s %[1]s/a/incoming/f", m, alice.UID, alice.GID, src))
	d, dRm := sum(content), sum(gone)

	// What each use of a namespace needs (namespaces.Access), and a
	// script that prints 1 if the user could, else 0.
	uses := []struct {
		name   string
		need   namespaces.Access
		script string
	}{
		{"list", namespaces.Read, "ls %[1]s/a"},
		{"read a blob by digest", namespaces.Search, "cat %[1]s/a/%[2]s"},
		{"put into incoming/", namespaces.Write | namespaces.Search, "cp %[4]s %[1]s/a/incoming/$(id -u)"},
		{"rm", namespaces.Write | namespaces.Search, "rm %[1]s/a/%[3]s"},
	}
	var script strings.Builder
	for _, u := range uses {
		fmt.Fprintf(&script, "if %s >/dev/null 2>&1; then echo 1; else echo 0; fi\n", fmt.Sprintf(u.script, m, d, dRm, src))
	}
	users := []struct {
		name string
		u    fusetest.User
		p    namespaces.Principal
	}{
		{"owner", alice, namespaces.Principal{UID: alice.UID, GIDs: []uint32{alice.GID}}},
		{"supplementary member", carol, namespaces.Principal{UID: carol.UID, GIDs: []uint32{carol.GID, alice.GID}}},
		{"other", bob, namespaces.Principal{UID: bob.UID, GIDs: []uint32{bob.GID}}},
	}
	for _, mode := range []uint32{0o700, 0o750, 0o705, 0o711, 0o730, 0o370, 0o307, 0o777, 0o070} {
		sh(t, fmt.Sprintf("chmod %04o %s/a", mode, m))
		p := namespaces.Perm{Uid: alice.UID, Gid: alice.GID, Mode: mode}
		for _, u := range users {
			// The blob rm removes is there for every user.
			sh(t, fmt.Sprintf("cp %s2 %s/a/incoming/rm-%d", src, m, u.u.UID))
			out, _ := u.u.Sh(script.String())
			got := strings.Fields(out)
			if len(got) != len(uses) {
				t.Fatalf("mode %04o, %s: the script printed %q", mode, u.name, out)
			}
			for i, use := range uses {
				kernel := got[i] == "1"
				rule := namespaces.Allowed(p, u.p, use.need) == nil
				if kernel != rule {
					t.Errorf("mode %04o, %s, %s: through the mount %v, by namespaces.Allowed(%s) %v", mode, u.name, use.name, kernel, use.need, rule)
				}
			}
		}
	}
}

// TestChgrpToSupplementaryGroup: a namespace's owner may give it to a
// group it is in by a supplementary group alone: the daemon, which checks
// chgrp itself (namespaces.ChangePerm), learns the caller's groups from
// the kernel's view of the process, as the kernel's own check does. To a
// group it is not in, the answer is EPERM.
func TestChgrpToSupplementaryGroup(t *testing.T) {
	requireFUSE(t)
	alice, carol, bob := fusetest.NewUser(t), fusetest.NewUser(t), fusetest.NewUser(t)
	if out, err := exec.Command("usermod", "-a", "-G", carol.Name, alice.Name).CombinedOutput(); err != nil {
		t.Fatalf("usermod: %v: %s", err, out)
	}
	data := t.TempDir()
	e := mountOn(t, data, defaultSpec.open(t, data), func(c *Config) { c.AllowOther = true })
	fusetest.Reachable(t, e.mnt)
	m := e.mnt
	sh(t, fmt.Sprintf("mkdir %[1]s/a && chown %[2]d:%[3]d %[1]s/a", m, alice.UID, alice.GID))
	alice.OK(t, fmt.Sprintf("chgrp %d %s/a", carol.GID, m))
	alice.Denied(t, "chgrp to a group she is not in", fmt.Sprintf("chgrp %d %s/a", bob.GID, m), "Operation not permitted")
	p, ok, err := e.reg.Perm(t.Context(), "a")
	if err != nil || !ok || p.Gid != carol.GID || p.Uid != alice.UID {
		t.Fatalf("after the chgrp the registry has %+v, %v, %v; want group %d", p, ok, err, carol.GID)
	}
}
