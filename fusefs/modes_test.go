//go:build linux

package fusefs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
)

// Issue 35: the mode, owner and group the mount shows are those the store
// decides with, for every bit pattern, mode 0 included (go-fuse shows a
// mode with no permission bits as 0644/0755 unless told not to).

// shownAttr is what stat(2) shows of a node: type and permission bits,
// owner, group.
type shownAttr struct{ mode, uid, gid uint32 }

func (a shownAttr) String() string { return fmt.Sprintf("%07o %d:%d", a.mode, a.uid, a.gid) }

func lstatAttr(t *testing.T, path string) shownAttr {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatalf("lstat %s: %v", path, err)
	}
	return shownAttr{st.Mode, st.Uid, st.Gid}
}

// TestChmodZero is issue 35's reproduction: chmod 000 of a namespace by its
// owner closes it to everyone but root, mkdir -m 000 makes a closed
// namespace, and an incoming/ draft fchmod'ed to 0 is closed to other
// users while it is being written.
func TestChmodZero(t *testing.T) {
	requireFUSE(t)
	alice, bob := fusetest.NewUser(t), fusetest.NewUser(t)
	data := t.TempDir()
	e := mountOn(t, data, defaultSpec.open(t, data), func(c *Config) { c.AllowOther = true })
	fusetest.Reachable(t, e.mnt)
	m := e.mnt
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, src, []byte("put by alice"))
	fusetest.Reachable(t, src)

	sh(t, fmt.Sprintf("mkdir %[1]s/z && echo zz > %[1]s/z/incoming/f && chown %[2]d %[1]s/z", m, alice.UID))
	d := sum([]byte("zz\n"))
	alice.OK(t, "chmod 000 "+m+"/z")
	if p, ok, err := e.reg.Perm(t.Context(), "z"); err != nil || !ok || p.Mode != 0 {
		t.Fatalf("after chmod 000 the registry has %+v, %v, %v", p, ok, err)
	}
	for _, p := range []string{"z", "z/incoming"} {
		if got := lstatAttr(t, e.path(p)); got.mode != syscall.S_IFDIR || got.uid != alice.UID {
			t.Errorf("%s after chmod 000 shows %v; want %07o owned by %d", p, got, syscall.S_IFDIR, alice.UID)
		}
	}
	if out, err := bob.Sh("stat -c %a " + m + "/z"); err != nil || strings.TrimSpace(out) != "0" {
		t.Errorf("stat -c %%a of the namespace, as another user: %q, %v; want 0", out, err)
	}
	bob.Denied(t, "listing a 000 namespace", "ls "+m+"/z", "Permission denied")
	bob.Denied(t, "reading a blob of a 000 namespace", fmt.Sprintf("cat %s/z/%s", m, d), "Permission denied")
	alice.Denied(t, "the owner listing her 000 namespace", "ls "+m+"/z", "Permission denied")
	alice.Denied(t, "the owner putting into her 000 namespace", fmt.Sprintf("cp %s %s/z/incoming/g", src, m), "Permission denied")
	alice.Denied(t, "the owner reading from her 000 namespace", fmt.Sprintf("cat %s/z/%s", m, d), "Permission denied")
	// Root may do anything with any namespace (namespaces.Allowed).
	sh(t, fmt.Sprintf("ls %[1]s/z >/dev/null && test \"$(cat %[1]s/z/%[2]s)\" = zz && cp %[3]s %[1]s/z/incoming/root", m, d, src))
	// The owner may still change the mode back.
	alice.OK(t, "chmod 755 "+m+"/z")
	bob.OK(t, fmt.Sprintf("cat %s/z/%s >/dev/null", m, d))

	// mkdir -m 000 makes a namespace nobody but root may use.
	sh(t, fmt.Sprintf("mkdir -m 000 %[1]s/y && chown %[2]d:%[3]d %[1]s/y", m, alice.UID, alice.GID))
	if p, ok, err := e.reg.Perm(t.Context(), "y"); err != nil || !ok || p.Mode != 0 {
		t.Fatalf("after mkdir -m 000 the registry has %+v, %v, %v", p, ok, err)
	}
	if got := lstatAttr(t, e.path("y")); got.mode != syscall.S_IFDIR {
		t.Errorf("y made by mkdir -m 000 shows %v", got)
	}
	bob.Denied(t, "listing a namespace made by mkdir -m 000", "ls "+m+"/y", "Permission denied")
	alice.Denied(t, "putting into a namespace made by mkdir -m 000", fmt.Sprintf("cp %s %s/y/incoming/g", src, m), "Permission denied")

	// A draft in incoming/ created 0600 and fchmod'ed to 0 while open.
	sh(t, fmt.Sprintf("chmod 777 %s/z", m))
	draft := e.path("z", incomingName, "draft")
	f, err := os.OpenFile(draft, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("not for bob"); err != nil {
		t.Fatal(err)
	}
	if err := f.Chmod(0); err != nil { // fchmod(fd, 0)
		t.Fatal(err)
	}
	if got := lstatAttr(t, draft); got.mode != syscall.S_IFREG {
		t.Errorf("a draft fchmod'ed to 0 shows %v; want %07o", got, syscall.S_IFREG)
	}
	bob.Denied(t, "reading a draft fchmod'ed to 0", "cat "+draft, "Permission denied")
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Its receipt keeps the mode.
	if got := lstatAttr(t, draft); got.mode != syscall.S_IFREG {
		t.Errorf("the receipt of a draft fchmod'ed to 0 shows %v", got)
	}
	bob.Denied(t, "reading the receipt of a draft fchmod'ed to 0", "cat "+draft, "Permission denied")

	// Mode 0 is recorded, not taken for none: a new mount shows it.
	e.srv.Unmount()
	e2 := mountOn(t, data, defaultSpec.open(t, data), func(c *Config) { c.AllowOther = true })
	fusetest.Reachable(t, e2.mnt)
	if got := lstatAttr(t, e2.path("y")); got != (shownAttr{syscall.S_IFDIR, alice.UID, alice.GID}) {
		t.Errorf("y after a remount shows %v", got)
	}
	bob.Denied(t, "listing a 000 namespace after a remount", "ls "+e2.mnt+"/y", "Permission denied")
}

// TestModesShown: for bit patterns that go-fuse or the kernel might bend
// (0, each execute bit alone, sticky, setgid, setuid), every kind of node
// shows exactly the mode (type and permission bits), owner and group the
// mount decides with — the registry's Perm for a namespace and its
// incoming/, the in-memory meta of incoming/'s files, directories and
// symbolic links, the fixed attributes of blobs, the root and the control
// files — whether the kernel learns them from GETATTR, LOOKUP or
// READDIRPLUS.
func TestModesShown(t *testing.T) {
	e := mountStore(t, defaultSpec, func(c *Config) { c.AllowOther = true })
	f := e.srv.fs
	const uid, gid = 4242, 4343
	mount := func(mode uint32) shownAttr { return shownAttr{mode, f.uid, f.gid} }

	// Each node: its path, its inode and what it must show (asked anew
	// at each check: the store's record).
	type node struct {
		path string
		in   func() *fs.Inode
		want func() shownAttr
	}
	root := func() *fs.Inode { return &f.root.Inode }
	var nodes []node
	add := func(path string, in func() *fs.Inode, want func() shownAttr) {
		nodes = append(nodes, node{path, in, want})
	}
	add("", root, func() shownAttr { return mount(syscall.S_IFDIR | 0o755) })
	add(controlName, func() *fs.Inode { return root().GetChild(controlName) }, func() shownAttr { return mount(syscall.S_IFDIR | 0o755) })
	for _, c := range []struct {
		name string
		mode uint32
	}{{"sweep", 0o644}, {"sweep-timer", 0o644}, {"scrub", 0o644}, {"stats", 0o444}} {
		add(filepath.Join(controlName, c.name), func() *fs.Inode { return root().GetChild(controlName).GetChild(c.name) },
			func() shownAttr { return mount(syscall.S_IFREG | c.mode) })
	}

	patterns := []uint32{0, 0o1, 0o10, 0o100, 0o1777, 0o2775, 0o4755, 0o7777, 0o640}
	for i, mode := range patterns {
		ns := fmt.Sprintf("n%d", i)
		e.mkns(ns)
		blobName := e.put(ns, fmt.Appendf(nil, "blob of %s", ns)).String()
		inc := filepath.Join(ns, incomingName)
		open := e.path(inc, "open")
		fh, err := os.OpenFile(open, os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		// fchown and fchmod of a file open for writing (a chown clears
		// set-id bits: it comes first).
		if err := fh.Chown(uid, gid); err != nil {
			t.Fatal(err)
		}
		if err := fh.Chmod(os.FileMode(mode&0o777) | goModeBits(mode)); err != nil {
			t.Fatal(err)
		}
		sh(t, fmt.Sprintf(`cd %[1]s && printf x > receipt && mkdir sub && ln -s receipt link &&
chown %[2]d:%[3]d receipt sub .. && chown -h %[2]d:%[3]d link &&
chmod %04[4]o receipt sub ..`, e.path(inc), uid, gid, mode))

		d, _ := f.nsDirFor(ns)
		nsIn := func() *fs.Inode { return &d.Inode }
		perm := func() shownAttr {
			p, ok, err := e.reg.Perm(t.Context(), ns)
			if err != nil || !ok {
				t.Fatalf("%s: the registry's Perm: %v, %v", ns, ok, err)
			}
			if p.Mode != mode || p.Uid != uid || p.Gid != gid {
				t.Fatalf("%s: the registry records %+v; chmod %04o and chown %d:%d were asked", ns, p, mode, uid, gid)
			}
			return shownAttr{syscall.S_IFDIR | p.Mode, p.Uid, p.Gid}
		}
		add(ns, nsIn, perm)
		add(inc, func() *fs.Inode { return d.inc.EmbeddedInode() }, perm)
		add(filepath.Join(ns, blobName), func() *fs.Inode { return d.GetChild(blobName) }, func() shownAttr { return mount(syscall.S_IFREG | 0o444) })
		child := func(name string) func() *fs.Inode { return func() *fs.Inode { return d.inc.GetChild(name) } }
		metaOf := func(name string, typ uint32) func() shownAttr {
			return func() shownAttr {
				var m meta
				switch x := d.inc.GetChild(name).Operations().(type) {
				case *fileNode:
					x.mu.Lock()
					m = x.meta
					x.mu.Unlock()
				case *incDir:
					x.mu.Lock()
					m = x.meta
					x.mu.Unlock()
				case *symNode:
					x.mu.Lock()
					m = x.meta
					x.mu.Unlock()
				}
				return shownAttr{typ | m.mode, m.uid, m.gid}
			}
		}
		for _, c := range []struct {
			name string
			typ  uint32
			mode uint32 // what was asked
		}{{"open", syscall.S_IFREG, mode}, {"receipt", syscall.S_IFREG, mode}, {"sub", syscall.S_IFDIR, mode}, {"link", syscall.S_IFLNK, 0o777}} {
			want := metaOf(c.name, c.typ)
			if got := want(); got != (shownAttr{c.typ | c.mode, uid, gid}) {
				t.Fatalf("%s/%s: the meta holds %v; chmod %04o and chown %d:%d were asked", inc, c.name, got, c.mode, uid, gid)
			}
			add(filepath.Join(inc, c.name), child(c.name), want)
		}
	}
	check := func(how string, n node) {
		t.Helper()
		if got, want := lstatAttr(t, e.path(n.path)), n.want(); got != want {
			t.Errorf("/%s through %s shows %v; the mount decides with %v", n.path, how, got, want)
		}
	}
	for _, n := range nodes {
		// GETATTR: the kernel knows the node (a first stat looks it up)
		// and forgets its attributes.
		lstatAttr(t, e.path(n.path))
		if errno := n.in().NotifyContent(-1, 0); errno != 0 {
			t.Fatalf("invalidating the attributes of /%s: %v", n.path, errno)
		}
		check("GETATTR", n)
	}
	for _, n := range nodes {
		if n.path == "" {
			continue
		}
		// LOOKUP: the kernel forgets the name (known first: a node the
		// kernel forgot is gone from the tree).
		lstatAttr(t, e.path(n.path))
		name, parent := n.in().Parent()
		notifyEntry(parent, name)
		check("LOOKUP", n)
	}
	for _, n := range nodes {
		if n.path == "" {
			continue
		}
		// READDIRPLUS: the kernel forgets the name and lists its
		// directory, which brings the entry's attributes along.
		lstatAttr(t, e.path(n.path))
		name, parent := n.in().Parent()
		notifyEntry(parent, name)
		if _, err := os.ReadDir(filepath.Dir(e.path(n.path))); err != nil {
			t.Fatal(err)
		}
		check("READDIRPLUS", n)
	}
}

// goModeBits is the os.FileMode of mode's set-id and sticky bits.
func goModeBits(mode uint32) os.FileMode {
	var m os.FileMode
	if mode&syscall.S_ISUID != 0 {
		m |= os.ModeSetuid
	}
	if mode&syscall.S_ISGID != 0 {
		m |= os.ModeSetgid
	}
	if mode&syscall.S_ISVTX != 0 {
		m |= os.ModeSticky
	}
	return m
}
