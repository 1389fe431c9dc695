//go:build linux

package main

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// TestGetOutputSpecialFiles: get -o never replaces what is not a regular
// file. A character device (a /dev/null made with mknod) and a FIFO keep
// their type and receive the content; a symbolic link stays a link and its
// target is replaced; a dangling link is refused and stays.
func TestGetOutputSpecialFiles(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	dir := t.TempDir()
	src, content, _ := clitest.WriteFile(t, dir, clitest.LargeSize, 8)
	d := strings.TrimSpace(c.OK("put", src))

	if os.Geteuid() == 0 {
		null := filepath.Join(dir, "null")
		if err := syscall.Mknod(null, syscall.S_IFCHR|0o666, int(1<<8|3)); err != nil {
			t.Fatal(err)
		}
		c.OK("get", d, "-o", null)
		if fi, err := os.Lstat(null); err != nil || fi.Mode()&fs.ModeCharDevice == 0 {
			t.Fatalf("after get -o, the character device is %v (%v)", fi.Mode(), err)
		}
	}

	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	go func() {
		f, err := os.Open(fifo)
		if err != nil {
			got <- nil
			return
		}
		b, _ := io.ReadAll(f)
		f.Close()
		got <- b
	}()
	c.OK("get", d, "-o", fifo)
	if b := <-got; clitest.Sum(b) != d {
		t.Fatalf("the FIFO's reader got %d bytes that hash to %s", len(b), clitest.Sum(b))
	}
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&fs.ModeNamedPipe == 0 {
		t.Fatalf("after get -o, the FIFO is %v (%v)", fi.Mode(), err)
	}

	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	c.OK("get", d, "-o", link)
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("after get -o, the link is %v (%v)", fi.Mode(), err)
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != string(content) {
		t.Fatalf("the link's target does not hold the blob (%v)", err)
	}

	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink(filepath.Join(dir, "nowhere", "x"), dangling); err != nil {
		t.Fatal(err)
	}
	c.Fail(1, "symbolic link to nothing", "get", d, "-o", dangling)
	if fi, err := os.Lstat(dangling); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("a refused get -o changed the dangling link: %v (%v)", fi.Mode(), err)
	}
}
