//go:build linux

package fusefs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// renameFlags are the rename(2) forms a cross-namespace move is tried
// with: plain, RENAME_NOREPLACE, RENAME_EXCHANGE (onto an existing name).
var renameFlags = []struct {
	name  string
	flags int
}{{"rename", 0}, {"noreplace", unix.RENAME_NOREPLACE}, {"exchange", unix.RENAME_EXCHANGE}}

// flushNow makes the kernel send a FLUSH for f's open file without
// releasing it: close(2) of a dup, as a shell's `echo >&3` does.
func flushNow(t *testing.T, f *os.File) {
	t.Helper()
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Close(fd); err != nil {
		t.Fatalf("close of a dup: %v", err)
	}
}

// TestRenameAcrossNamespaces: to a rename, every namespace is a
// filesystem of its own. Every shape (a closed file, a receipt, a
// directory of them, a symlink) and every flag is EXDEV, which mv answers
// by copying; a file open for writing, or a directory holding one, is
// EBUSY, and its writer's final close publishes all of it in its own
// namespace: nothing that write() and close() acknowledged is lost, and
// no intermediate version shows anywhere.
func TestRenameAcrossNamespaces(t *testing.T) {
	e := mountStore(t, defaultSpec)
	d, x := e.mkns("d"), e.mkns("x")
	inc := func(ns string, p ...string) string { return filepath.Join(append([]string{ns, incomingName}, p...)...) }
	writeFile(t, inc(x, "there"), []byte("the exchange target"))
	writeFile(t, inc(x, "sub", "there"), []byte("the exchange target"))
	target := map[bool]string{false: "f2", true: "there"}

	t.Run("closed", func(t *testing.T) {
		b := []byte("a closed file")
		writeFile(t, inc(d, "closed"), b)
		writeFile(t, inc(d, "dir", "a"), b)
		if err := os.Symlink("closed", inc(d, "link")); err != nil {
			t.Fatal(err)
		}
		for _, src := range []string{"closed", "dir", "link"} {
			for _, fl := range renameFlags {
				dst := inc(x, target[fl.flags == unix.RENAME_EXCHANGE])
				if src == "dir" && fl.flags == unix.RENAME_EXCHANGE {
					dst = inc(x, "sub")
				}
				err := unix.Renameat2(unix.AT_FDCWD, inc(d, src), unix.AT_FDCWD, dst, uint(fl.flags))
				if !errors.Is(err, syscall.EXDEV) {
					t.Errorf("%s %s → x: %v, want EXDEV", fl.name, src, err)
				}
			}
		}
		// mv copies, and the copy publishes in x; d keeps its reference.
		run(t, "", "mv", inc(d, "closed"), inc(x, "moved"))
		run(t, "", "mv", inc(d, "dir"), inc(x, "dir"))
		e.expectNS(t, "x", []string{sum([]byte("the exchange target")), sum(b)})
		e.expectNS(t, "d", []string{sum(b)})
		if _, err := os.Lstat(inc(d, "closed")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after mv the source is still there: %v", err)
		}
	})

	t.Run("open", func(t *testing.T) {
		part1, part2 := randBytes(1, 300_000), randBytes(2, 300_000)
		full := append(bytes.Clone(part1), part2...)
		if err := os.MkdirAll(inc(d, "tree", "deep"), 0o755); err != nil {
			t.Fatal(err)
		}
		var files []*os.File
		for _, p := range []string{"f1", "tree/deep/f1"} {
			f, err := os.Create(inc(d, p))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.Write(part1); err != nil {
				t.Fatal(err)
			}
			flushNow(t, f) // part1 is committed, and could be copied
			files = append(files, f)
		}
		for _, src := range []string{"f1", "tree", "tree/deep"} {
			for _, fl := range renameFlags {
				dst := inc(x, target[fl.flags == unix.RENAME_EXCHANGE])
				if src != "f1" && fl.flags == unix.RENAME_EXCHANGE {
					dst = inc(x, "sub")
				}
				err := unix.Renameat2(unix.AT_FDCWD, inc(d, src), unix.AT_FDCWD, dst, uint(fl.flags))
				if !errors.Is(err, syscall.EBUSY) {
					t.Errorf("%s %s → x while open for writing: %v, want EBUSY", fl.name, src, err)
				}
			}
		}
		// The exchange is refused from the other side too.
		err := unix.Renameat2(unix.AT_FDCWD, inc(x, "there"), unix.AT_FDCWD, inc(d, "f1"), unix.RENAME_EXCHANGE)
		if !errors.Is(err, syscall.EBUSY) {
			t.Errorf("exchange with a file open for writing in another namespace: %v, want EBUSY", err)
		}
		out, err := exec.Command("mv", inc(d, "f1"), inc(x, "f2")).CombinedOutput()
		if err == nil {
			t.Errorf("mv of a file open for writing into another namespace succeeded:\n%s", out)
		}
		for _, f := range files {
			if _, err := f.Write(part2); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
		}
		e.expectNS(t, "d", []string{sum([]byte("a closed file")), sum(full)})
		e.expectNS(t, "x", []string{sum([]byte("the exchange target")), sum([]byte("a closed file"))})
	})
}

// TestRenameWaitsForRelease: a rename into another namespace of a file
// whose last close has returned is EXDEV (mv copies it), even while the
// kernel's RELEASE of it is still on its way: here a child that inherited
// the descriptor holds it 50 ms past the writer's close, as the kernel's
// asynchronous RELEASE can on a loaded machine.
//
// The mount waits releaseWait (200 ms) for such a RELEASE. On a loaded
// machine the child's 50 ms may end later than that, and then EBUSY is
// the promised answer: the child records when it let go, and an EBUSY
// fails the test only when it let go within half of releaseWait of the
// writer's close; a later one is tried again, up to ten times.
func TestRenameWaitsForRelease(t *testing.T) {
	e := mountStore(t, defaultSpec)
	d, x := e.mkns("d"), e.mkns("x")
	stamps := t.TempDir()
	nanos := func(name string) time.Time {
		t.Helper()
		var b []byte
		eventually(t, 30*time.Second, "the script's time stamp "+name, func() bool {
			var err error
			b, err = os.ReadFile(filepath.Join(stamps, name))
			return err == nil && bytes.HasSuffix(b, []byte("\n"))
		})
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatalf("time stamp %s: %q", name, b)
		}
		return time.Unix(0, n)
	}
	for _, src := range []string{"f", "dir"} {
		p := filepath.Join(d, incomingName, src)
		if src == "dir" {
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
			p = filepath.Join(p, "a")
		}
		// W: just after the writer's close; C: just after the child's.
		script := `exec 3>"$F"; printf %s "$F" >&3; ( sleep 0.05; exec 3>&-; date +%s%N >"$S/C" ) >/dev/null 2>&1 & exec 3>&-; date +%s%N >"$S/W"`
		for try := 1; ; try++ {
			os.Remove(filepath.Join(stamps, "W"))
			os.Remove(filepath.Join(stamps, "C"))
			cmd := exec.Command("bash", "-c", script)
			cmd.Env = append(os.Environ(), "F="+p, "S="+stamps)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", script, err, out)
			}
			err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(d, incomingName, src), unix.AT_FDCWD, filepath.Join(x, incomingName, src), 0)
			if errors.Is(err, syscall.EXDEV) {
				break
			}
			late := nanos("C").Sub(nanos("W"))
			if !errors.Is(err, syscall.EBUSY) || late < releaseWait/2 {
				t.Fatalf("rename of %s → x just after its writer closed it (the last copy closed %s after): %v, want EXDEV", src, late, err)
			}
			if try == 10 {
				t.Fatalf("rename of %s → x: EBUSY in 10 tries, the last copy closing each time %s or more after the writer's (last: %s): the machine is too loaded to tell", src, releaseWait/2, late)
			}
			t.Logf("try %d: the child let go %s after the writer's close, past the mount's wait: EBUSY, trying again", try, late)
		}
	}
}

// TestUnlinkWhileWriting: rm of a file open for writing, and a rename over
// it, take its name, not its content. What the writer writes and closes
// afterwards is published in full, as the final version; the version an
// earlier close committed never shows.
func TestUnlinkWhileWriting(t *testing.T) {
	e := mountStore(t, defaultSpec)
	for _, size := range []int{6, 300_000} {
		for _, how := range []string{"rm", "rename over"} {
			nsName := fmt.Sprintf("%s-%d", strings.ReplaceAll(how, " ", "-"), size)
			ns := e.mkns(nsName)
			part1, part2 := randBytes(uint64(size), size), randBytes(uint64(size)+1, size)
			full := append(bytes.Clone(part1), part2...)
			name := filepath.Join(ns, incomingName, "f")
			f, err := os.Create(name)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write(part1); err != nil {
				t.Fatal(err)
			}
			flushNow(t, f)
			switch how {
			case "rm":
				if err := os.Remove(name); err != nil {
					t.Fatal(err)
				}
			case "rename over":
				writeFile(t, name+".new", []byte("the replacement"))
				if err := os.Rename(name+".new", name); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := f.Write(part2); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatalf("%s, %d bytes: close: %v", how, size, err)
			}
			want := []string{sum(full)}
			if how == "rename over" {
				want = append(want, sum([]byte("the replacement")))
			}
			e.expectNS(t, nsName, want)
		}
	}
}

// TestEmptyCreateByDigest: creating a digest-named file and closing it
// empty is a verified put of empty content, which hashes to e3b0…, not to
// the name: the close fails with EIO, and the name never reads back. An
// fsync of one not yet complete fails the same way. The
// empty digest's own name publishes, and a shell's `printf > <digest>`
// (whose first close comes before any write) still works.
func TestEmptyCreateByDigest(t *testing.T) {
	e := mountStore(t, defaultSpec)
	ns := e.mkns("ns")
	b := []byte("by path\n")
	name := filepath.Join(ns, sum(b))
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("close of an empty create of %s: %v, want EIO", sum(b)[:12], err)
	}
	if _, err := os.Stat(name); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat after the failed close: %v, want ENOENT", err)
	}
	e.expectNS(t, "ns", nil)
	if out, err := exec.Command("touch", name).CombinedOutput(); err == nil {
		t.Errorf("touch of a digest name succeeded:\n%s", out)
	}
	e.expectNS(t, "ns", nil)

	// An fsync makes the put durable, so it must be complete by then.
	half, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := half.Write(b[:3]); err != nil {
		t.Fatal(err)
	}
	if err := half.Sync(); !errors.Is(err, syscall.EIO) {
		t.Errorf("fsync of a half-written put by path: %v, want EIO", err)
	}
	half.Close()
	e.expectNS(t, "ns", nil)
	whole, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := whole.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := whole.Sync(); err != nil {
		t.Errorf("fsync of a complete put by path: %v", err)
	}
	if err := whole.Close(); err != nil {
		t.Errorf("close after the fsync: %v", err)
	}
	e.expectNS(t, "ns", []string{sum(b)})
	if err := os.Remove(name); err != nil {
		t.Fatal(err)
	}

	// The forms that must go on working.
	sh(t, `printf 'by path\n' > `+name)
	if err := os.WriteFile(filepath.Join(ns, sum(nil)), nil, 0o644); err != nil {
		t.Fatalf("an empty file under the empty digest: %v", err)
	}
	e.expectNS(t, "ns", []string{sum(b), sum(nil)})
}
