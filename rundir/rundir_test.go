package rundir

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestMake: a missing directory is made 0755 whatever the umask; one of
// ours left 0700 is set back to 0755; one another user owns is refused.
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
	if m := mode(); m != Mode {
		t.Fatalf("made under umask 077: %04o, want %04o", m, Mode)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Make(dir); err != nil || mode() != Mode {
		t.Fatalf("a 0700 directory of ours: %v, %04o; want %04o", err, mode(), Mode)
	}
	if os.Geteuid() == 0 {
		other := filepath.Join(t.TempDir(), "other")
		if err := os.Mkdir(other, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := Make(other); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
			t.Fatalf("a directory nobody owns: %v; want it refused", err)
		}
	}
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o644)
	if err := Make(file); err == nil {
		t.Fatal("a file taken for the runtime directory")
	}
}
