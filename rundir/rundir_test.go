package rundir

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestMake: a user's runtime directory (anything but System) is made
// 0700 and its mode left as its owner set it; one another user owns is
// refused (to all but root). Before, Make made every directory 0755 and
// set a private one back to 0755. (System's own 0755 and its repair are
// TestRuntimeDirReachable's, in cmd/alkblobfs: they need root and the
// real /run/alkblobfs.)
func TestMake(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "a", "alkblobfs")
	if err := Make(dir); err != nil {
		t.Fatal(err)
	}
	mode := func() os.FileMode {
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	if m := mode(); m != UserMode {
		t.Fatalf("a user's runtime directory made under umask 077: %04o, want %04o", m, UserMode)
	}
	syscall.Umask(0o022)
	dir2 := filepath.Join(t.TempDir(), "alkblobfs")
	if err := Make(dir2); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir2); err != nil || fi.Mode().Perm() != UserMode {
		t.Fatalf("a user's runtime directory made under umask 022: %v, %v; want %04o", fi.Mode(), err, UserMode)
	}
	for _, m := range []os.FileMode{0o700, 0o750} {
		if err := os.Chmod(dir, m); err != nil {
			t.Fatal(err)
		}
		if err := Make(dir); err != nil || mode() != m {
			t.Fatalf("a user's runtime directory at %04o: %v, now %04o; want it left", m, err, mode())
		}
	}
	if os.Geteuid() == 0 {
		// Root in a user's runtime directory (su keeps XDG_RUNTIME_DIR):
		// what it makes there is the user's, and one the user has is
		// used as it is.
		user := filepath.Join(t.TempDir(), "run-user")
		if err := os.Mkdir(user, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(user, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		mine := filepath.Join(user, "alkblobfs")
		if err := Make(mine); err != nil {
			t.Fatalf("root making a runtime directory in nobody's: %v", err)
		}
		fi, err := os.Stat(mine)
		if err != nil || fi.Sys().(*syscall.Stat_t).Uid != 65534 || fi.Mode().Perm() != UserMode {
			t.Fatalf("root's runtime directory in nobody's: %v, %v; want nobody's, %04o", fi, err, UserMode)
		}
		if err := Make(mine); err != nil {
			t.Fatalf("root using nobody's runtime directory: %v", err)
		}
	}
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o644)
	if err := Make(file); err == nil {
		t.Fatal("a file taken for the runtime directory")
	}
}
