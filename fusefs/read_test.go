//go:build linux

package fusefs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/fusefs/fusectl"
	"github.com/alkblobfs/alkblobfs/store"
)

// TestMain doubles as a helper process: a page fault on a FUSE file must
// not happen in the process serving it (it can stall the Go runtime's
// stop-the-world while the server waits to run), so mmap reads run in a
// child.
// Most tests here run one at a time: many hold a file of incoming/ open
// in this process, and a fork by a test running beside them (any
// exec.Command) would close its copy of that descriptor at exec, a
// FLUSH that commits the file early. The few marked parallel only fork
// or read blobs; Go runs them together after every serial test has
// ended, so they never overlap one that holds such a file.
func TestMain(m *testing.M) {
	if p := os.Getenv("FUSEFS_TEST_MMAP"); p != "" {
		os.Exit(mmapHelper(p))
	}
	os.Exit(m.Run())
}

func mmapHelper(path string) int {
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer syscall.Munmap(b)
	s := sha256.Sum256(b)
	fmt.Println(hex.EncodeToString(s[:]))
	return 0
}

func TestMmap(t *testing.T) {
	t.Parallel() // reads blobs, in a child: no file of incoming/ open here
	for _, spec := range storeSpecs {
		t.Run(spec.name, func(t *testing.T) { testMmap(t, spec) })
	}
}

func testMmap(t *testing.T, spec storeSpec) {
	e := mountStore(t, spec)
	e.mkns("m")
	for _, n := range []int{5000, 3<<20 + 123} {
		d := e.put("m", randBytes(uint64(n), n))
		out, err := mmapSum(e.path("m", d.String()))
		if err != nil || strings.TrimSpace(string(out)) != d.String() {
			t.Fatalf("mmap of a %d-byte blob: %v: %s", n, err, out)
		}
	}
}

// TestConcurrentReaders: readers of one large blob all get its bytes.
func TestConcurrentReaders(t *testing.T) {
	t.Parallel() // reads blobs only (see TestMain)
	e := mountStore(t, defaultSpec)
	e.mkns("r")
	// 64 MiB: each reader crosses many readahead windows and the
	// halves' seeks; 256 MiB under ALKBLOBFS_LONG (make test-long).
	size := 64 << 20
	if os.Getenv("ALKBLOBFS_LONG") == "1" {
		size = 256 << 20
	}
	d := e.put("r", randBytes(7, size))
	p := e.path("r", d.String())
	const readers = 8
	var wg sync.WaitGroup
	errs := make([]error, readers)
	for i := range readers {
		wg.Go(func() {
			f, err := os.Open(p)
			if err != nil {
				errs[i] = err
				return
			}
			defer f.Close()
			h := sha256.New()
			// Different buffer sizes and a late start for half of them,
			// so the readers are not in lockstep.
			buf := make([]byte, (64<<10)<<(i%4))
			if i%2 == 1 {
				if _, err := f.Seek(int64(size/2), io.SeekStart); err != nil {
					errs[i] = err
					return
				}
				h2 := sha256.New()
				if _, err := io.CopyBuffer(h2, f, buf); err != nil {
					errs[i] = err
					return
				}
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					errs[i] = err
					return
				}
			}
			if _, err := io.CopyBuffer(h, f, buf); err != nil {
				errs[i] = err
				return
			}
			if got := hex.EncodeToString(h.Sum(nil)); got != d.String() {
				errs[i] = fmt.Errorf("reader %d read content hashing to %s", i, got)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// TestFlippedByte: a large blob altered on disk is never served as good.
func TestFlippedByte(t *testing.T) {
	e := mountStore(t, defaultSpec)
	e.mkns("f")
	content := randBytes(8, 2<<20)
	d := e.put("f", content)
	flipByte(t, e.blobFile(d.String()), 1<<20)
	_, err := os.ReadFile(e.path("f", d.String()))
	wantErrno(t, "read of a corrupted blob", err, syscall.EIO)
	if !strings.Contains(e.logs.String(), d.String()) || !strings.Contains(e.logs.String(), "verification") {
		t.Fatalf("no log line naming the digest:\n%s", e.logs.String())
	}
}

// TestChangedAfterPassthrough: in --verify=full a blob verified once and
// then served by passthrough is verified again once its file changes on
// disk: after a flipped byte (and dropped caches) reads give EIO, a log
// line names the digest, and stats count the change.
func TestChangedAfterPassthrough(t *testing.T) {
	e := mountStore(t, defaultSpec)
	if !e.srv.Passthrough() {
		t.Log("passthrough unavailable on this kernel: only the daemon path is exercised")
	}
	e.mkns("c")
	src := filepath.Join(t.TempDir(), "src")
	content := randBytes(15, 8<<20)
	writeFile(t, src, content)
	run(t, "", "cp", src, e.path("c", incomingName, "big"))
	d := sum(content)
	p := e.path("c", d)
	ctx := context.Background()
	for i := range 2 { // the first read verifies, the second passes through
		if got := fileSum(t, p); got != d {
			t.Fatalf("read %d: %s", i, got)
		}
		eventually(t, 30*time.Second, "the release", func() bool { return e.srv.Stats(ctx).OpenHandles == 0 })
	}
	if e.srv.Passthrough() && e.srv.Stats(ctx).Passthrough.Opens == 0 {
		t.Fatal("the second read of a verified blob did not pass through")
	}
	flipByte(t, e.blobFile(d), 5<<20)
	dropCaches(t)
	out, err := exec.Command("sh", "-c", fmt.Sprintf("sha256sum < %q", p)).CombinedOutput()
	if err == nil {
		t.Fatalf("sha256sum of a blob changed on disk succeeded: %s", out)
	}
	_, err = os.ReadFile(p)
	wantErrno(t, "read of a blob changed on disk", err, syscall.EIO)
	logs := e.logs.String()
	if !strings.Contains(logs, d) || !strings.Contains(logs, "verification") {
		t.Fatalf("no log line naming the digest:\n%s", logs)
	}
	if e.srv.Passthrough() && e.srv.Stats(ctx).ChangedOnDisk == 0 {
		t.Fatal("stats do not count the change on disk")
	}
}

// dropCaches empties the page cache (root only), so reads reach the disk.
// Pages only (1, not 3): dropping dentries and inodes too would make every
// FUSE mount on the machine forget its entries, another test's among them.
func dropCaches(t testing.TB) {
	t.Helper()
	syscall.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("1\n"), 0o200); err != nil {
		t.Fatalf("drop caches: %v", err)
	}
}

// TestRmWhileOpen: an unlinked blob stays readable through an open handle.
func TestRmWhileOpen(t *testing.T) {
	for _, spec := range storeSpecs {
		t.Run(spec.name, func(t *testing.T) { testRmWhileOpen(t, spec) })
	}
}

func testRmWhileOpen(t *testing.T, spec storeSpec) {
	e := mountStore(t, spec)
	e.mkns("r")
	for _, n := range []int{100, 1 << 20} { // kv and large tier
		content := randBytes(uint64(n)+9, n)
		d := e.put("r", content)
		p := e.path("r", d.String())
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("stat after rm: %v", err)
		}
		got, err := io.ReadAll(f)
		if err != nil || sum(got) != d.String() {
			t.Fatalf("read after rm: %v", err)
		}
		f.Close()
	}
}

// TestPassthrough: in --verify=publish a local blob is served by the
// kernel from its file; in --verify=full only once verified end to end.
func TestPassthrough(t *testing.T) {
	for _, v := range []Verify{VerifyPublish, VerifyFull} {
		t.Run(string(v), func(t *testing.T) {
			e := mountStore(t, defaultSpec, withVerify(v))
			if !e.srv.Passthrough() {
				t.Skip("passthrough unavailable on this kernel")
			}
			e.mkns("p")
			d := e.put("p", randBytes(11, 4<<20))
			p := e.path("p", d.String())
			ctx := context.Background()
			if got := fileSum(t, p); got != d.String() {
				t.Fatalf("read %s", got)
			}
			// A new open takes the mode of the opens still there: wait for
			// the first one's RELEASE, which the kernel sends after close.
			eventually(t, 30*time.Second, "the first handle's release", func() bool {
				return e.srv.Stats(ctx).OpenHandles == 0
			})
			s1 := e.srv.Stats(ctx)
			if got := fileSum(t, p); got != d.String() {
				t.Fatalf("second read %s", got)
			}
			s2 := e.srv.Stats(ctx)
			if s2.Passthrough.Opens == s1.Passthrough.Opens {
				t.Fatalf("second open did not pass through: %+v", s2.Passthrough)
			}
			if v == VerifyPublish && s1.Passthrough.CachedOpens != 0 {
				t.Fatalf("publish mode opened through the daemon: %+v", s1.Passthrough)
			}
			if v == VerifyFull && s1.Passthrough.Opens != 0 {
				t.Fatalf("full mode passed an unverified blob through: %+v", s1.Passthrough)
			}
		})
	}
}

// TestListing: a namespace larger than a registry page lists completely,
// in order, and ls -l shows sizes.
func TestListing(t *testing.T) {
	t.Parallel() // puts through the store, forks ls: no file of incoming/ open here
	e := mountStore(t, defaultSpec)
	e.mkns("l")
	ctx := context.Background()
	const n = 2345
	var want []string
	var ds []blob.Digest
	for i := range n {
		d, pin, err := e.st.PutBytes(ctx, []byte(fmt.Sprintf("entry %d", i)))
		if err != nil {
			t.Fatal(err)
		}
		pin.Release()
		ds = append(ds, d)
		want = append(want, d.String())
	}
	if _, err := e.reg.LinkMany(ctx, "l", ds); err != nil {
		t.Fatal(err)
	}
	got := e.listNS(t, "l")
	if len(got) != n {
		t.Fatalf("listed %d entries, want %d", len(got), n)
	}
	for i := 1; i < len(got); i++ {
		if got[i-1] >= got[i] {
			t.Fatalf("listing out of order at %d", i)
		}
	}
	out := run(t, "", "ls", "-l", e.path("l"))
	if lines := strings.Count(out, "\n"); lines < n {
		t.Fatalf("ls -l printed %d lines", lines)
	}
	if !strings.Contains(out, " 7 ") && !strings.Contains(out, " 8 ") {
		t.Fatalf("ls -l shows no sizes:\n%s", out[:min(len(out), 500)])
	}
	// Plain readdir after ls -l (cached attributes) and a rewind.
	if got2 := e.listNS(t, "l"); len(got2) != n {
		t.Fatalf("second listing: %d entries", len(got2))
	}

}

// TestUnmountBusy: unmounting with a file open detaches lazily; the open
// file stays readable and the unmount completes when it is closed.
func TestUnmountBusy(t *testing.T) {
	requireFUSE(t)
	data := t.TempDir()
	e := mountOn(t, data, defaultSpec.open(t, data))
	e.mkns("u")
	d := e.put("u", randBytes(14, 1<<20))
	f, err := os.Open(e.path("u", d.String()))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.srv.Unmount() }()
	eventually(t, 10*time.Second, "the lazy detach", func() bool {
		_, mounted, err := fusectl.Find(e.mnt)
		return err == nil && !mounted
	})
	select {
	case err := <-done:
		t.Fatalf("Unmount returned with a file open: %v", err)
	default:
	}
	got, err := io.ReadAll(f)
	if err != nil || sum(got) != d.String() {
		t.Fatalf("read after detach: %v", err)
	}
	f.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Unmount did not return after the last close")
	}
}

// TestXattrsAndStatfs: digest and tier xattrs on blobs; df reports the
// large tier's filesystem.
// statCounter counts the digests a mount asks the store to stat.
type statCounter struct {
	Store
	n atomic.Int64
}

func (c *statCounter) StatMany(ctx context.Context, ds []blob.Digest) (map[blob.Digest]store.Info, error) {
	c.n.Add(int64(len(ds)))
	return c.Store.StatMany(ctx, ds)
}

// TestListingAsksOnce: ls -l of a namespace asks the store for the sizes
// of its blobs once; listing it again asks for none (their inodes know).
func TestListingAsksOnce(t *testing.T) {
	var c *statCounter
	e := mountStore(t, defaultSpec, func(cfg *Config) { c = &statCounter{Store: cfg.Store}; cfg.Store = c })
	e.mkns("l")
	for i := range 500 {
		e.put("l", []byte(fmt.Sprintf("entry %d", i)))
	}
	ls := func() int64 {
		before := c.n.Load()
		if out, err := exec.Command("ls", "-l", e.path("l")).CombinedOutput(); err != nil || strings.Count(string(out), "\n") != 502 {
			t.Fatalf("ls -l: %v: %d lines", err, strings.Count(string(out), "\n"))
		}
		return c.n.Load() - before
	}
	if n := ls(); n != 500 {
		t.Errorf("first ls -l asked for %d sizes, want 500", n)
	}
	if n := ls(); n != 0 {
		t.Errorf("second ls -l asked for %d sizes, want none", n)
	}
}

// TestForeignXattrsUnsupported: every node answers the xattr namespaces
// the filesystem does not keep (SELinux labels, ACLs, trusted.*) with
// EOPNOTSUPP, so that ls -l asks once per listing instead of twice per
// entry; where strace is installed, a listing of 300 blobs shows it.
func TestForeignXattrsUnsupported(t *testing.T) {
	e := mountStore(t, defaultSpec)
	e.mkns("x")
	var d blob.Digest
	for i := range 300 {
		d = e.put("x", []byte(fmt.Sprintf("blob %d", i)))
	}
	writeFile(t, e.path("x", incomingName, "f"), []byte("receipt"))
	for _, p := range []string{e.mnt, e.path("x"), e.path("x", d.String()), e.path("x", incomingName), e.path("x", incomingName, "f"), e.path(".alkblobfs", "stats")} {
		for _, attr := range []string{"security.selinux", "system.posix_acl_access", "system.posix_acl_default", "trusted.x", "security.capability"} {
			_, err := syscall.Getxattr(p, attr, make([]byte, 64))
			wantErrno(t, attr+" of "+p, err, syscall.EOPNOTSUPP)
		}
		_, err := syscall.Getxattr(p, "user.nope", make([]byte, 64))
		wantErrno(t, "user.nope of "+p, err, syscall.ENODATA)
	}
	if _, err := exec.LookPath("strace"); err != nil {
		t.Log("strace is not installed: the xattr requests of ls -l are not counted")
		return
	}
	out, err := exec.Command("strace", "-f", "-c", "-e", "trace=getxattr,lgetxattr", "-o", "/dev/stdout", "ls", "-l", e.path("x")).Output()
	if err != nil {
		t.Fatalf("strace ls -l: %v", err)
	}
	calls := 0
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && (f[len(f)-1] == "getxattr" || f[len(f)-1] == "lgetxattr") {
			n, _ := strconv.Atoi(f[3])
			calls += n
		}
	}
	if calls > 4 {
		t.Fatalf("ls -l of 300 entries made %d xattr calls, want a few:\n%s", calls, out)
	}
}

func TestXattrsAndStatfs(t *testing.T) {
	e := mountStore(t, defaultSpec)
	e.mkns("x")
	for _, c := range []struct {
		n    int
		tier string
	}{{10, "kv"}, {1 << 20, "large"}} {
		d := e.put("x", randBytes(uint64(c.n), c.n))
		p := e.path("x", d.String())
		for attr, want := range map[string]string{xattrDigest: d.String(), xattrTier: c.tier} {
			buf := make([]byte, 128)
			n, err := syscall.Getxattr(p, attr, buf)
			if err != nil || string(buf[:n]) != want {
				t.Fatalf("%s of a %d-byte blob: %q, %v; want %q", attr, c.n, buf[:max(n, 0)], err, want)
			}
		}
		_, err := syscall.Getxattr(p, "user.other", make([]byte, 16))
		wantErrno(t, "absent xattr", err, syscall.ENODATA)
	}
	var got, want syscall.Statfs_t
	if err := syscall.Statfs(e.mnt, &got); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Statfs(filepath.Join(e.data, "large"), &want); err != nil {
		t.Fatal(err)
	}
	if got.Blocks != want.Blocks || got.Bsize != want.Bsize || got.Blocks == 0 {
		t.Fatalf("statfs: %d blocks of %d, want %d of %d", got.Blocks, got.Bsize, want.Blocks, want.Bsize)
	}
}
