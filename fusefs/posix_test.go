//go:build linux

package fusefs

import (
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPosixPromises checks docs/posix.md's table where no other test
// does: O_TMPFILE in incoming/ is EOPNOTSUPP, a hard link in incoming/ of
// a published file is a second receipt of the same blob, and a file still
// being written cannot be linked.
func TestPosixPromises(t *testing.T) {
	e := mountStore(t, defaultSpec)
	e.mkns("p")
	inc := e.path("p", "incoming")

	fd, err := unix.Open(inc, unix.O_TMPFILE|unix.O_RDWR, 0o644)
	if err == nil {
		unix.Close(fd)
	}
	wantErrno(t, "open(incoming/, O_TMPFILE)", err, syscall.EOPNOTSUPP)

	content := randBytes(51, 3000)
	if err := os.WriteFile(e.path("p", "incoming", "a"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	e.expectNS(t, "p", []string{sum(content)})
	if err := os.Link(e.path("p", "incoming", "a"), e.path("p", "incoming", "b")); err != nil {
		t.Fatalf("ln incoming/a incoming/b of a published file: %v", err)
	}
	for _, name := range []string{"a", "b"} {
		buf := make([]byte, 64)
		n, err := unix.Getxattr(e.path("p", "incoming", name), xattrDigest, buf)
		if err != nil || string(buf[:n]) != sum(content) {
			t.Fatalf("incoming/%s's digest: %q, %v; want %s", name, buf[:n], err, sum(content))
		}
	}

	f, err := os.Create(e.path("p", "incoming", "open"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("half")); err != nil {
		t.Fatal(err)
	}
	err = os.Link(e.path("p", "incoming", "open"), e.path("p", "incoming", "open2"))
	if err == nil {
		t.Fatal("a file still being written was linked")
	}
	t.Logf("ln of a file being written: %v", err)
}
