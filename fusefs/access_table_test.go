//go:build linux

package fusefs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// principalOf is u as namespaces.Allowed sees it, with extra groups.
func principalOf(u fusetest.User, extra ...uint32) namespaces.Principal {
	return namespaces.Principal{UID: u.UID, GIDs: append([]uint32{u.GID}, extra...)}
}

// TestAccessTable: for every mode from 0000 to 0777, what the kernel
// lets the owner, a member of the group (by a supplementary group), anyone
// else and root do with a directory of that mode — read, write, search —
// is what namespaces.Allowed decides for a namespace of that mode: the
// rule the kernel applies to the mount's directories (default_permissions)
// is the one the HTTP surface applies itself. Then, for a sample of modes
// (each bit alone, none, all, and mixes), each use of a namespace through
// the mount gives the same answer as Allowed (and ChangePerm for chmod).
func TestAccessTable(t *testing.T) {
	requireFUSE(t)
	alice, carol, bob := fusetest.NewUser(t), fusetest.NewUser(t), fusetest.NewUser(t)
	// carol is in alice's group by a supplementary group alone.
	if out, err := exec.Command("usermod", "-a", "-G", alice.Name, carol.Name).CombinedOutput(); err != nil {
		t.Fatalf("usermod: %v: %s", err, out)
	}
	type who struct {
		name string
		sh   func(string) (string, error)
		p    namespaces.Principal
	}
	asRoot := func(s string) (string, error) {
		out, err := exec.Command("sh", "-c", s).CombinedOutput()
		return string(out), err
	}
	users := []who{
		{"owner", alice.Sh, principalOf(alice)},
		{"supplementary member", carol.Sh, principalOf(carol, alice.GID)},
		{"other", bob.Sh, principalOf(bob)},
		{"root", asRoot, namespaces.Root},
	}

	// Every mode, on a local directory.
	dirs := filepath.Join(t.TempDir(), "modes")
	if err := os.Mkdir(dirs, 0o755); err != nil {
		t.Fatal(err)
	}
	fusetest.Reachable(t, dirs)
	for mode := range uint32(0o1000) {
		d := filepath.Join(dirs, fmt.Sprintf("%04o", mode))
		if err := os.Mkdir(d, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, int(alice.UID), int(alice.GID)); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, os.FileMode(mode)); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range users {
		out, err := u.sh(`cd ` + dirs + ` && for d in *; do r=0 w=0 x=0; [ -r $d ] && r=1; [ -w $d ] && w=1; [ -x $d ] && x=1; echo $d $r$w$x; done`)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if err != nil || len(lines) != 0o1000 {
			t.Fatalf("%s: %v: %d lines", u.name, err, len(lines))
		}
		for _, l := range lines {
			var mode uint32
			var rwx string
			if _, err := fmt.Sscanf(l, "%o %s", &mode, &rwx); err != nil || len(rwx) != 3 {
				t.Fatalf("%s: %q", u.name, l)
			}
			p := namespaces.Perm{Uid: alice.UID, Gid: alice.GID, Mode: mode}
			for i, a := range []namespaces.Access{namespaces.Read, namespaces.Write, namespaces.Search} {
				kernel := rwx[i] == '1'
				if rule := namespaces.Allowed(p, u.p, a) == nil; kernel != rule {
					t.Errorf("mode %04o, %s, %s: the kernel says %v, namespaces.Allowed %v", mode, u.name, a, kernel, rule)
				}
			}
		}
	}

	// A sample through the mount: one mount, one namespace.
	data := t.TempDir()
	e := mountOn(t, data, defaultSpec.open(t, data), func(c *Config) { c.AllowOther = true })
	fusetest.Reachable(t, e.mnt)
	m := e.mnt
	sh(t, fmt.Sprintf("mkdir %[1]s/a && chown %[2]d:%[3]d %[1]s/a", m, alice.UID, alice.GID))
	d := e.put("a", []byte("read by every cell")).String()
	uses := []struct {
		name string
		// need is what Allowed must grant; 0: only the owner and root
		// (ChangePerm).
		need   namespaces.Access
		script string // %[1]s mountpoint, %[2]s blob read, %[3]s blob removed, %[4]s unique name, %[5]s mode
	}{
		{"list", namespaces.Read, "ls %[1]s/a"},
		{"read a blob", namespaces.Search, "cat %[1]s/a/%[2]s"},
		{"stat a blob", namespaces.Search, "stat %[1]s/a/%[2]s"},
		{"put", namespaces.Write | namespaces.Search, "printf %%s %[4]s > %[1]s/a/incoming/%[4]s"},
		{"rm", namespaces.Remove, "rm %[1]s/a/%[3]s"},
		{"chmod", 0, "chmod %04[5]o %[1]s/a"},
	}
	// With the sticky bit, the kernel lets only the directory's owner
	// (or the file's, the mount's user) remove a blob.
	sample := []uint32{0, 0o777, 0o700, 0o750, 0o755, 0o711, 0o705, 0o730, 0o370, 0o307, 0o070, 0o007, 0o333, 0o555, 0o666, 0o124, 0o421, 0o173, 0o356,
		0o1777, 0o1770, 0o1733, 0o1300}
	for bit := range 9 {
		sample = append(sample, 1<<bit)
	}
	for _, mode := range sample {
		if err := os.Chmod(e.path("a"), os.FileMode(mode&0o777)|goModeBits(mode)); err != nil {
			t.Fatal(err)
		}
		p := namespaces.Perm{Uid: alice.UID, Gid: alice.GID, Mode: mode}
		for _, u := range users {
			rm := e.put("a", fmt.Appendf(nil, "removed by %s at %04o", u.name, mode)).String()
			var script strings.Builder
			for _, use := range uses {
				line := fmt.Sprintf(use.script, m, d, rm, fmt.Sprintf("m%04o-%s", mode, strings.ReplaceAll(u.name, " ", "-")), mode)
				fmt.Fprintf(&script, "if ( %s ) >/dev/null 2>&1; then echo 1; else echo 0; fi\n", line)
			}
			out, _ := u.sh(script.String())
			got := strings.Fields(out)
			if len(got) != len(uses) {
				t.Fatalf("mode %04o, %s: the script printed %q", mode, u.name, out)
			}
			for i, use := range uses {
				var err error
				if use.need == 0 {
					_, err = namespaces.ChangePerm(p, u.p, namespaces.PermChange{Mode: mode, SetMode: true})
				} else {
					err = namespaces.Allowed(p, u.p, use.need)
				}
				if mount, rule := got[i] == "1", err == nil; mount != rule {
					t.Errorf("mode %04o, %s, %s: through the mount %v, by the rule %v", mode, u.name, use.name, mount, rule)
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
