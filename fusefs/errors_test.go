//go:build linux

package fusefs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/local"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/store"
)

// faultyLarge is the local engine with switchable failures: reads that
// fail with EIO from the medium, commits that fail with ENOSPC.
type faultyLarge struct {
	*local.Engine
	failRead, failCommit atomic.Bool
}

func (f *faultyLarge) Open(ctx context.Context, d blob.Digest) (engines.Cursor, error) {
	c, err := f.Engine.Open(ctx, d)
	if err != nil {
		return nil, err
	}
	return &faultyCursor{Cursor: c, f: f, d: d}, nil
}

func (f *faultyLarge) Stage(ctx context.Context) (engines.Stage, error) {
	st, err := f.Engine.Stage(ctx)
	if err != nil {
		return nil, err
	}
	return &faultyStage{RandomStage: st.(engines.RandomStage), f: f}, nil
}

type faultyCursor struct {
	engines.Cursor
	f *faultyLarge
	d blob.Digest
}

func (c *faultyCursor) ReadAt(p []byte, off int64) (int, error) {
	if c.f.failRead.Load() {
		return 0, blob.Wrap("read", c.f.Name(), c.d, &fs.PathError{Op: "pread", Path: "blob", Err: syscall.EIO})
	}
	return c.Cursor.ReadAt(p, off)
}

type faultyStage struct {
	engines.RandomStage
	f *faultyLarge
}

func (s *faultyStage) Commit(ctx context.Context, d blob.Digest) error {
	if s.f.failCommit.Load() {
		s.RandomStage.Discard() // a failed commit leaves no residue
		return &fs.PathError{Op: "write", Path: "stage", Err: syscall.ENOSPC}
	}
	return s.RandomStage.Commit(ctx, d)
}

func faultySpec(t testing.TB) (string, store.Config, *faultyLarge) {
	data := t.TempDir()
	ctx := context.Background()
	kv, err := sqlite.Open(ctx, filepath.Join(data, "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := local.Open(ctx, filepath.Join(data, "large"), nil)
	if err != nil {
		t.Fatal(err)
	}
	fl := &faultyLarge{Engine: l}
	return data, store.Config{KV: kv, Large: fl}, fl
}

func wantErrno(t *testing.T, what string, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got %v, want %v (%d)", what, err, want, int(want))
	}
}

// TestErrnoContract makes every row of the errno table (docs/errors.md) happen
// through real system calls and checks the errno the caller sees.
func TestErrnoContract(t *testing.T) {
	requireFUSE(t)
	data, cfg, fl := faultySpec(t)
	e := mountOn(t, data, cfg)
	ns := e.mkns("b")
	e.mkns("c")
	big := randBytes(30, 300<<10)
	d := e.put("b", big)
	p := filepath.Join(ns, d.String())

	t.Run("write to a blob is EACCES", func(t *testing.T) {
		for _, fl := range []int{os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_WRONLY | os.O_APPEND} {
			_, err := os.OpenFile(p, fl, 0)
			wantErrno(t, fmt.Sprintf("open flags %#x", fl), err, syscall.EACCES)
		}
		wantErrno(t, "truncate", os.Truncate(p, 0), syscall.EACCES)
	})
	t.Run("chmod chown utimes are EPERM", func(t *testing.T) {
		wantErrno(t, "chmod", os.Chmod(p, 0o644), syscall.EPERM)
		wantErrno(t, "chown", os.Chown(p, 1, 1), syscall.EPERM)
		now := time.Now()
		wantErrno(t, "utimes", os.Chtimes(p, now, now), syscall.EPERM)
		wantErrno(t, "setxattr", syscall.Setxattr(p, "user.x", []byte("1"), 0), syscall.EPERM)
	})
	t.Run("rename and link of a blob are EPERM", func(t *testing.T) {
		wantErrno(t, "rename in namespace", os.Rename(p, filepath.Join(ns, strings.Repeat("0", 64))), syscall.EPERM)
		wantErrno(t, "rename across namespaces", os.Rename(p, e.path("c", d.String())), syscall.EPERM)
		wantErrno(t, "rename into incoming", os.Rename(p, e.path("b", "incoming", "x")), syscall.EPERM)
		wantErrno(t, "link across namespaces", os.Link(p, e.path("c", d.String())), syscall.EPERM)
		// Copying works and dedups.
		run(t, "", "cp", p, e.path("c", "incoming", "copy"))
		e.expectNS(t, "c", []string{d.String()})
	})
	t.Run("malformed or absent names are ENOENT", func(t *testing.T) {
		for _, name := range []string{"nope", strings.Repeat("0", 64), strings.ToUpper(d.String()), d.String()[:63]} {
			_, err := os.Stat(filepath.Join(ns, name))
			wantErrno(t, "stat "+name, err, syscall.ENOENT)
		}
		_, err := os.Stat(e.path("no-such-namespace"))
		wantErrno(t, "stat absent namespace", err, syscall.ENOENT)
	})
	t.Run("names over 255 bytes are ENAMETOOLONG", func(t *testing.T) {
		e.mkns("long")
		inc := e.path("long", "incoming")
		if err := os.Mkdir(filepath.Join(inc, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{256, 1100, 4000} {
			long := strings.Repeat("n", n)
			_, err := os.Create(filepath.Join(inc, long))
			wantErrno(t, fmt.Sprintf("create %d bytes in incoming/", n), err, syscall.ENAMETOOLONG)
			wantErrno(t, fmt.Sprintf("mkdir %d bytes in incoming/", n), os.Mkdir(filepath.Join(inc, "sub", long), 0o755), syscall.ENAMETOOLONG)
			_, err = os.Stat(filepath.Join(inc, long))
			wantErrno(t, fmt.Sprintf("lookup %d bytes in incoming/", n), err, syscall.ENAMETOOLONG)
			_, err = os.Stat(filepath.Join(ns, long))
			wantErrno(t, fmt.Sprintf("lookup %d bytes in a namespace", n), err, syscall.ENAMETOOLONG)
			wantErrno(t, fmt.Sprintf("mkdir %d bytes at the root", n), os.Mkdir(e.path(long), 0o755), syscall.ENAMETOOLONG)
		}
		// 255 bytes is a name like any other.
		max := filepath.Join(inc, strings.Repeat("m", 255))
		if err := os.WriteFile(max, []byte("x"), 0o644); err != nil {
			t.Fatalf("a 255-byte name: %v", err)
		}
		if _, err := os.Stat(max); err != nil {
			t.Fatalf("lookup of a 255-byte name: %v", err)
		}
		if names, _ := os.ReadDir(inc); len(names) != 2 {
			t.Fatalf("incoming/ lists %d names; want sub and the 255-byte one", len(names))
		}
	})
	t.Run("mkdir and non-digest creates in a namespace are EPERM", func(t *testing.T) {
		wantErrno(t, "mkdir", os.Mkdir(filepath.Join(ns, "dir"), 0o755), syscall.EPERM)
		_, err := os.Create(filepath.Join(ns, "notes.txt"))
		wantErrno(t, "create", err, syscall.EPERM)
		if !strings.Contains(e.logs.String(), "incoming/") {
			t.Errorf("no log hint pointing to incoming/:\n%s", e.logs.String())
		}
		wantErrno(t, "symlink", os.Symlink("x", filepath.Join(ns, "l")), syscall.EPERM)
		wantErrno(t, "mkfifo", syscall.Mkfifo(filepath.Join(ns, "f"), 0o644), syscall.EPERM)
		wantErrno(t, "rmdir incoming", os.Remove(filepath.Join(ns, "incoming")), syscall.EPERM)
	})
	t.Run("rmdir of a namespace", func(t *testing.T) {
		wantErrno(t, "rmdir non-empty", syscall.Rmdir(ns), syscall.ENOTEMPTY)
		e.mkns("empty")
		if err := os.Remove(e.path("empty")); err != nil {
			t.Fatalf("rmdir empty namespace: %v", err)
		}
		if _, err := os.Stat(e.path("empty")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("removed namespace still there: %v", err)
		}
		wantErrno(t, "mkdir bad name", os.Mkdir(e.path("a b"), 0o755), syscall.EINVAL)
		wantErrno(t, "mkdir existing", os.Mkdir(ns, 0o755), syscall.EEXIST)
	})
	t.Run("rm of a blob drops the reference", func(t *testing.T) {
		d2 := e.put("b", []byte("to be removed"))
		if err := os.Remove(filepath.Join(ns, d2.String())); err != nil {
			t.Fatal(err)
		}
		e.expectNS(t, "b", []string{d.String()})
		wantErrno(t, "rm again", os.Remove(filepath.Join(ns, d2.String())), syscall.ENOENT)
	})
	t.Run("backend I/O failure is EIO with a log line", func(t *testing.T) {
		// A blob never read before: nothing of it in the page cache.
		d3 := e.put("c", randBytes(33, 300<<10))
		fl.failRead.Store(true)
		defer fl.failRead.Store(false)
		_, err := os.ReadFile(e.path("c", d3.String()))
		wantErrno(t, "read", err, syscall.EIO)
		logs := e.logs.String()
		if !strings.Contains(logs, d3.String()) || !strings.Contains(logs, fl.Name()) {
			t.Errorf("EIO not logged with engine and digest:\n%s", logs)
		}
	})
	t.Run("store full is ENOSPC at close, nothing published", func(t *testing.T) {
		fl.failCommit.Store(true)
		defer fl.failCommit.Store(false)
		before := e.listNS(t, "b")
		f, err := os.Create(e.path("b", "incoming", "full.bin"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(randBytes(31, 1<<20)); err != nil {
			t.Fatal(err)
		}
		wantErrno(t, "close", f.Close(), syscall.ENOSPC)
		e.expectNS(t, "b", before)
		eventually(t, 5*time.Second, "failed file to disappear", func() bool {
			_, err := os.Stat(e.path("b", "incoming", "full.bin"))
			return errors.Is(err, fs.ErrNotExist)
		})
		if n := stageResidue(t, fl); n != 0 {
			t.Fatalf("%d stage files left", n)
		}
	})
	t.Run("verified put by path", func(t *testing.T) {
		good := randBytes(32, 200<<10)
		name := filepath.Join(ns, sum(good))
		writeFile(t, name, good)
		if got := fileSum(t, name); got != sum(good) {
			t.Fatalf("put by path reads back %s", got)
		}
		small := []byte("small by path")
		sh(t, fmt.Sprintf("cat > %q <<'EOF'\nsmall by path\nEOF", filepath.Join(ns, sum(append(small, '\n')))))
		e.expectNS(t, "b", []string{d.String(), sum(good), sum(append(small, '\n'))})

		bad := filepath.Join(ns, sum([]byte("something else")))
		f, err := os.Create(bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte("not what the name says")); err != nil {
			t.Fatal(err)
		}
		wantErrno(t, "close of a mismatching put", f.Close(), syscall.EIO)
		_, err = os.Stat(bad)
		wantErrno(t, "stat after mismatch", err, syscall.ENOENT)
		e.expectNS(t, "b", []string{d.String(), sum(good), sum(append(small, '\n'))})
	})
}

// TestENOSPCAtWrite: a kv-only store cannot take a file over its
// threshold; the write that crosses it fails with ENOSPC and nothing is
// published.
func TestENOSPCAtWrite(t *testing.T) {
	requireFUSE(t)
	data := t.TempDir()
	kv, err := sqlite.Open(context.Background(), filepath.Join(data, "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	e := mountOn(t, data, store.Config{KV: kv, Threshold: 64 << 10, ScratchDir: data})
	e.mkns("k")
	f, err := os.Create(e.path("k", "incoming", "big"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write(randBytes(40, 128<<10))
	wantErrno(t, "write over the threshold", err, syscall.ENOSPC)
	wantErrno(t, "close", f.Close(), syscall.ENOSPC)
	e.expectNS(t, "k", nil)
	run(t, "", "cp", "/dev/null", e.path("k", "incoming", "ok"))
	e.expectNS(t, "k", []string{sum(nil)})
}

// TestFailureAfterAcknowledgedClose: a close that returned 0 is published
// even when writes through another descriptor of the file fail after it:
// the failed version never shows, the acknowledged one does (at the last
// RELEASE). Before, the failure dropped the acknowledged version too.
func TestFailureAfterAcknowledgedClose(t *testing.T) {
	requireFUSE(t)
	data := t.TempDir()
	kv, err := sqlite.Open(context.Background(), filepath.Join(data, "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	e := mountOn(t, data, store.Config{KV: kv, Threshold: 64 << 10, ScratchDir: data})
	e.mkns("k")
	f, err := os.Create(e.path("k", "incoming", "f"))
	if err != nil {
		t.Fatal(err)
	}
	v1 := randBytes(41, 1000)
	if _, err := f.Write(v1); err != nil {
		t.Fatal(err)
	}
	fd2, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	g := os.NewFile(uintptr(fd2), "dup")
	if err := f.Close(); err != nil {
		t.Fatalf("the first close: %v", err) // acknowledged: v1 is committed
	}
	_, err = g.Write(randBytes(42, 128<<10))
	wantErrno(t, "a write over the threshold after the close", err, syscall.ENOSPC)
	wantErrno(t, "the last close", g.Close(), syscall.ENOSPC)
	e.expectNS(t, "k", []string{sum(v1)})
}
