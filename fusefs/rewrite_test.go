//go:build linux

package fusefs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
)

// sparseModel is the expected content of a large file that is mostly
// zeros: the 1 MiB pages written so far, zeros elsewhere.
type sparseModel struct {
	size  int64
	pages map[int64][]byte
}

const modelPage = 1 << 20

func newSparseModel(size int64) *sparseModel {
	return &sparseModel{size: size, pages: make(map[int64][]byte)}
}

func (m *sparseModel) write(b []byte, off int64) {
	m.size = max(m.size, off+int64(len(b)))
	for len(b) > 0 {
		i := off / modelPage
		pg := m.pages[i]
		if pg == nil {
			pg = make([]byte, modelPage)
			m.pages[i] = pg
		}
		k := copy(pg[off%modelPage:], b)
		b, off = b[k:], off+int64(k)
	}
}

func (m *sparseModel) read(off int64, n int) []byte {
	out := make([]byte, 0, n)
	for len(out) < n && off < m.size {
		i := off / modelPage
		k := min(int64(n-len(out)), modelPage-off%modelPage, m.size-off)
		if pg := m.pages[i]; pg != nil {
			out = append(out, pg[off%modelPage:off%modelPage+k]...)
		} else {
			out = append(out, make([]byte, k)...)
		}
		off += k
	}
	return out
}

// sum is the sha256 of the content, computed off the caller's goroutine
// (while the mount hashes the same content at a close).
func (m *sparseModel) sum() <-chan string {
	pages := make(map[int64][]byte, len(m.pages))
	for i, pg := range m.pages {
		pages[i] = slices.Clone(pg)
	}
	size := m.size
	ch := make(chan string, 1)
	go func() {
		h := sha256.New()
		zero := make([]byte, modelPage)
		for i := int64(0); i*modelPage < size; i++ {
			pg := pages[i]
			if pg == nil {
				pg = zero
			}
			h.Write(pg[:min(modelPage, size-i*modelPage)])
		}
		ch <- hex.EncodeToString(h.Sum(nil))
	}()
	return ch
}

// publishedDigest is the digest a published incoming file reports.
func publishedDigest(t testing.TB, path string) string {
	t.Helper()
	buf := make([]byte, 128)
	n, err := unix.Getxattr(path, xattrDigest, buf)
	if err != nil {
		t.Fatalf("getxattr %s: %v", path, err)
	}
	return string(buf[:n])
}

// TestReopenBigReceipt: opening a published 1 GiB receipt for writing
// without O_TRUNC returns at once (the upload reads the blob lazily), and
// what `>>` then publishes is the old content and the appended bytes.
func TestReopenBigReceipt(t *testing.T) {
	e := mountStore(t, defaultSpec)
	ns := e.mkns("ns")
	p := filepath.Join(ns, incomingName, "big")
	const size = 1 << 30
	m := newSparseModel(size)
	start := time.Now()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for i, off := range []int64{0, 300<<20 + 12345, size - 1<<20} {
		b := randBytes(uint64(i+1), 1<<20)
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
		m.write(b, off)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("1 GiB receipt written and published: %v", time.Since(start))

	// Open for appending, and close without writing: five times.
	var took []time.Duration
	for range 5 {
		start := time.Now()
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		took = append(took, time.Since(start))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	t.Logf("open(O_WRONLY|O_APPEND) of a 1 GiB receipt: %v", took)
	slices.Sort(took)
	if med := took[len(took)/2]; med > 500*time.Millisecond {
		t.Fatalf("open for append of a 1 GiB receipt takes %v (median); want well under a second", med)
	}

	start = time.Now()
	sh(t, "echo appended >> "+p)
	t.Logf("echo appended >> (1 GiB receipt): %v", time.Since(start))
	m.write([]byte("appended\n"), m.size)
	if got, w := publishedDigest(t, p), <-m.sum(); got != w {
		t.Fatalf("after >>: published %s, want %s", got[:12], w[:12])
	}
	if n := stageResidue(t, e.large); n != 0 {
		t.Fatalf("%d stage files left", n)
	}
}

// TestReopenReceiptRewrites: a receipt re-opened without O_TRUNC
// publishes its old content with the new writes: dd conv=notrunc in the
// middle, across a chunk boundary; and writes through a descriptor kept
// open across sweeps that take unreferenced blobs, which keep the old
// version while the open upload reads it, and take it once it ended.
func TestReopenReceiptRewrites(t *testing.T) {
	e := mountStore(t, defaultSpec)
	ns := e.mkns("ns")
	p := filepath.Join(ns, incomingName, "f")
	const size = 16 << 20
	m := newSparseModel(0)
	page := randBytes(1, modelPage)
	for i := range int64(size / modelPage) {
		page[0], page[1] = byte(i), byte(i>>8) // every page differs
		m.write(page, i*modelPage)
	}
	writeFile(t, p, m.read(0, size))

	src := filepath.Join(t.TempDir(), "patch")
	patch := randBytes(7, 100<<10)
	writeFile(t, src, patch)
	off := int64(10<<20 + 64<<10 - 5000)
	sh(t, fmt.Sprintf("dd if=%s of=%s bs=100k count=1 seek=%d oflag=seek_bytes conv=notrunc status=none", src, p, off))
	m.write(patch, off)
	if got, w := publishedDigest(t, p), <-m.sum(); got != w {
		t.Fatalf("after dd conv=notrunc: published %s, want %s", got[:12], w[:12])
	}

	ctx := context.Background()
	old := publishedDigest(t, p)
	oldD, _ := blob.Parse(old)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Nothing references the old version now but the open upload.
	if err := os.Remove(filepath.Join(ns, old)); err != nil {
		t.Fatal(err)
	}
	other, pin, err := e.st.Put(ctx, bytes.NewReader(randBytes(9, 1<<20)), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	for range 2 {
		if _, err := e.st.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if ok, _ := e.st.Has(ctx, other); ok {
		t.Fatal("two sweeps left an unreferenced blob: the test proves nothing")
	}
	if ok, _ := e.st.Has(ctx, oldD); !ok {
		t.Fatal("a sweep took the blob an open upload reads")
	}
	mid := []byte("written in the middle")
	if _, err := f.WriteAt(mid, 12<<20+3); err != nil {
		t.Fatal(err)
	}
	m.write(mid, 12<<20+3)
	for _, at := range []int64{0, off - 10, 12<<20 - 100, size - 1000} {
		got := make([]byte, 200<<10)
		k, err := f.ReadAt(got, at)
		if err != nil && k != size-int(at) || !bytes.Equal(got[:k], m.read(at, len(got))) {
			t.Fatalf("read at %d through the open descriptor: %d bytes, %v; or wrong content", at, k, err)
		}
	}
	want := m.sum()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	d := publishedDigest(t, p)
	if w := <-want; d != w {
		t.Fatalf("after a write through an open descriptor: published %s, want %s", d[:12], w[:12])
	}
	if s := fileSum(t, e.blobFile(d)); s != d {
		t.Fatalf("the blob file of %s hashes to %s", d[:12], s[:12])
	}
	eventually(t, 5*time.Second, "sweeps to take the old version once its upload ended", func() bool {
		if _, err := e.st.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		ok, _ := e.st.Has(ctx, oldD)
		return !ok
	})
	if n := stageResidue(t, e.large); n != 0 {
		t.Fatalf("%d stage files left", n)
	}
}

// sparseSum is the sha256 of a file, read in large pieces (a 1 GiB file
// of holes is a second of hashing).
func sparseSum(t testing.TB, path string) string {
	f, err := os.Open(path)
	if err != nil {
		t.Error(err)
		return ""
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, f, make([]byte, 1<<20)); err != nil {
		t.Errorf("read %s: %v", path, err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// blocksOf is the disk a file takes, in bytes.
func blocksOf(t testing.TB, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestSparseIncoming: a 1 GiB file holding 4 KiB of data, written into
// incoming/ as truncate + dd conv=notrunc or by cp --sparse=always, is
// stored in about 4 KiB on the local engine, under the sha256 of its full
// content (that of the same file made natively), and reads back as
// zeros in its holes.
func TestSparseIncoming(t *testing.T) {
	e := mountStore(t, defaultSpec)
	ns := e.mkns("ns")
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	writeFile(t, data, randBytes(3, 4<<10))
	native := filepath.Join(dir, "native")
	mk := func(path string) string {
		return fmt.Sprintf("truncate -s 1G %[1]s && dd if=%[2]s of=%[1]s bs=4k seek=1000 count=1 conv=notrunc status=none", path, data)
	}
	sh(t, mk(native))
	nativeSum := make(chan string, 1)
	go func() { nativeSum <- sparseSum(t, native) }()
	in := filepath.Join(ns, incomingName, "sparse")
	start := time.Now()
	sh(t, mk(in))
	t.Logf("truncate -s 1G + dd conv=notrunc into incoming/: %v", time.Since(start))
	want := <-nativeSum
	d := publishedDigest(t, in)
	if d != want {
		t.Fatalf("published %s; sha256sum of the same file made natively says %s", d[:12], want[:12])
	}
	if b := blocksOf(t, e.blobFile(d)); b > 64<<10 {
		t.Fatalf("the 1 GiB blob holding 4 KiB takes %d bytes on disk", b)
	} else {
		t.Logf("blob of 1 GiB holding 4 KiB: %d bytes on disk", b)
	}
	// cp --sparse=always of the native file: the same blob.
	cp := filepath.Join(ns, incomingName, "cp")
	start = time.Now()
	sh(t, "cp --sparse=always "+native+" "+cp)
	t.Logf("cp --sparse=always: %v", time.Since(start))
	if got := publishedDigest(t, cp); got != want {
		t.Fatalf("cp --sparse=always published %s, want %s", got[:12], want[:12])
	}
	// Reads: zeros in a hole, the data where it was written.
	f, err := os.Open(filepath.Join(ns, d))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 8<<10)
	if _, err := f.ReadAt(b, 4000<<10-4<<10); err != nil {
		t.Fatal(err)
	}
	src, _ := os.ReadFile(data)
	if !bytes.Equal(b[:4<<10], make([]byte, 4<<10)) || !bytes.Equal(b[4<<10:], src) {
		t.Fatal("the published sparse blob reads back wrong")
	}
	if n := stageResidue(t, e.large); n != 0 {
		t.Fatalf("%d stage files left", n)
	}
}

// TestReopenDropsStaleCache: opens of an incoming file keep the kernel's
// page cache (a receipt just written need not be dropped from it at its
// next open), except after its content changed behind the kernel: a
// version whose publish failed is not served from the pages its writes
// left, once a new writer starts over from the published version.
func TestReopenDropsStaleCache(t *testing.T) {
	data, cfg, fl := faultySpec(t)
	e := mountOn(t, data, cfg)
	ns := e.mkns("ns")
	p := filepath.Join(ns, incomingName, "r")
	a := randBytes(11, 1<<20)
	writeFile(t, p, a)
	// A reader keeps the name through the failure below.
	r, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.WriteAt(randBytes(12, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	fl.failCommit.Store(true)
	wantErrno(t, "close of a version that fails to publish", w.Close(), syscall.ENOSPC)
	fl.failCommit.Store(false)
	w, err = os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close() // on failure: the mount's unmount waits for it
	got := make([]byte, len(a))
	if _, err := w.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, a) {
		t.Fatal("a new writer reads the failed version's bytes: the kernel kept a stale cache")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got := fileSum(t, p); got != sum(a) {
		t.Fatalf("the file reads as %s, want %s", got[:12], sum(a)[:12])
	}
}

// TestWriteKillsSetID: the daemon clears set-id bits where the kernel
// would (a write, a truncate, a chown), since the mount takes that job
// with FUSE_HANDLE_KILLPRIV_V2; in exchange the kernel asks for
// security.capability once per file, not before every WRITE.
func TestWriteKillsSetID(t *testing.T) {
	var mu sync.Mutex
	ops := map[string]int{}
	count := func(c *Config) {
		c.Observe = func(op string, _ time.Duration) {
			mu.Lock()
			ops[op]++
			mu.Unlock()
		}
	}
	e := mountStore(t, defaultSpec, count)
	ns := e.mkns("ns")
	p := filepath.Join(ns, incomingName, "f")
	mode := func() os.FileMode {
		t.Helper()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid)
	}
	appendTo := func(b []byte) {
		t.Helper()
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, p, []byte("x"))
	for _, c := range []struct {
		set  uint32
		do   string
		want os.FileMode
	}{
		{0o4755, "write", 0o755},
		{0o6755, "write", 0o755},
		{0o2745, "write", 0o745 | os.ModeSetgid}, // no group execute: sgid means locking, and stays
		{0o4755, "truncate", 0o755},
		{0o4755, "truncate to its size", 0o755},
		{0o4755, "O_TRUNC", 0o755},
		{0o6775, "chown", 0o775},
		{0o4755, "chmod", 0o755 | os.ModeSetuid}, // a chmod alone keeps what it sets
	} {
		if err := syscall.Chmod(p, c.set); err != nil {
			t.Fatal(err)
		}
		switch c.do {
		case "write":
			appendTo([]byte("y"))
		case "truncate":
			if err := os.Truncate(p, 1); err != nil {
				t.Fatal(err)
			}
		case "truncate to its size":
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(p, fi.Size()); err != nil {
				t.Fatal(err)
			}
		case "O_TRUNC": // `: > f`, nothing written
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}

		case "chown":
			if err := os.Chown(p, 1000, 1000); err != nil {
				t.Fatal(err)
			}
		}
		if got := mode(); got != c.want {
			t.Errorf("chmod %o, then %s: mode %v, want %v", c.set, c.do, got, c.want)
		}
	}

	// 32 WRITE requests into one file: one capability lookup, not 32.
	mu.Lock()
	clear(ops)
	mu.Unlock()
	f, err := os.Create(filepath.Join(ns, incomingName, "g"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 32 {
		if _, err := f.Write(randBytes(uint64(i), 64<<10)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if ops["write"] < 32 || ops["getxattr"] > 1 {
		t.Errorf("32 writes made %d WRITE and %d GETXATTR requests; want ≥ 32 and ≤ 1", ops["write"], ops["getxattr"])
	}
}

// TestMmapWriteIncoming: a program that writes its output through a
// shared mapping (ftruncate, mmap, store, msync, close) publishes what it
// stored. Descriptors open for writing into incoming/ are direct I/O
// (writeOpen), which the kernel lets map only with DIRECT_IO_ALLOW_MMAP.
// The program is a child process (child_test.go): its stores page-fault
// into the mount, and this process serves it.
func TestMmapWriteIncoming(t *testing.T) {
	e := mountStore(t, defaultSpec)
	ns := e.mkns("ns")
	const seed, size = 7, 3<<20 + 123
	inChild(t, time.Minute, "mmap-write", filepath.Join(ns, incomingName, "m"), fmt.Sprint(seed), fmt.Sprint(size))
	d := sum(randBytes(seed, size))
	if got := fileSum(t, filepath.Join(ns, d)); got != d {
		t.Fatalf("published %s; want %s", got, d)
	}
}

// mmapWrite creates path and writes b to it through a shared mapping. It
// must not run in the process serving path's mount (child_test.go).
func mmapWrite(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(int64(len(b))); err != nil {
		return err
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, len(b), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap of a file open for writing in incoming/: %w", err)
	}
	copy(m, b)
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		return fmt.Errorf("msync: %w", err)
	}
	if err := syscall.Munmap(m); err != nil {
		return fmt.Errorf("munmap: %w", err)
	}
	return f.Close()
}
