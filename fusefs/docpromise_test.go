package fusefs

import (
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestIncomingErrnoRows: the rows of docs/errors.md that only TestToErrno
// held as data, made to happen through system calls on a real mount:
// renameat2(RENAME_NOREPLACE) onto a name is EEXIST, a directory renamed
// onto a file ENOTDIR and a file onto a directory EISDIR, rmdir of a
// non-empty directory ENOTEMPTY (all in incoming/, as on ext4), and a
// blob's getxattr with a buffer too small ERANGE. (The kernel's VFS
// itself answers the three renames once it has looked the target up, so
// only rmdir and getxattr rest on this package alone; the renames are
// checked as what a user sees.)
func TestIncomingErrnoRows(t *testing.T) {
	e := mountStore(t, defaultSpec)
	e.mkns("p")
	inc := func(name ...string) string { return e.path(append([]string{"p", "incoming"}, name...)...) }
	content := randBytes(52, 2000)
	for _, name := range []string{"a", "b", "dir/x"} {
		if name == "dir/x" {
			if err := os.Mkdir(inc("dir"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(inc(name), append(content, name...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(inc("empty"), 0o755); err != nil {
		t.Fatal(err)
	}

	err := unix.Renameat2(unix.AT_FDCWD, inc("a"), unix.AT_FDCWD, inc("b"), unix.RENAME_NOREPLACE)
	wantErrno(t, "renameat2(incoming/a, incoming/b, RENAME_NOREPLACE)", err, syscall.EEXIST)
	wantErrno(t, "rename(incoming/empty, incoming/a)", unix.Rename(inc("empty"), inc("a")), syscall.ENOTDIR)
	wantErrno(t, "rename(incoming/a, incoming/empty)", unix.Rename(inc("a"), inc("empty")), syscall.EISDIR)
	wantErrno(t, "rmdir(incoming/dir) holding a file", syscall.Rmdir(inc("dir")), syscall.ENOTEMPTY)
	// Each refusal changed nothing.
	for _, name := range []string{"a", "b", "dir/x"} {
		if b, err := os.ReadFile(inc(name)); err != nil || string(b) != string(content)+name {
			t.Errorf("incoming/%s after the refusals: %v", name, err)
		}
	}

	blobPath := e.path("p", sum(append(content, 'a')))
	n, err := unix.Getxattr(blobPath, xattrDigest, make([]byte, 4))
	wantErrno(t, "getxattr(blob, user.alkblobfs.digest) into 4 bytes", err, syscall.ERANGE)
	if n, err = unix.Getxattr(blobPath, xattrDigest, nil); err != nil || n != 64 {
		t.Errorf("getxattr(blob, user.alkblobfs.digest) asking its size: %d, %v; want 64", n, err)
	}
}
