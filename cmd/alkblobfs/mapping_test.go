//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Mappings of files in the tests of the mount (a blob mmapped across an
// upgrade). Two rules that a test of its own checks:
//
//   - A mapping is unmapped once. syscall.Munmap finds a mapping by its
//     address and length; once the first munmap freed them, the next
//     mapping of the same length in the process (a parallel subtest's)
//     may get the same address, and a second Munmap of the stale slice
//     unmaps that one. Its next page fault is then SIGSEGV. This is what
//     issue 37's "SIGBUS in one upgrade in twelve" was:
//     TestUpgradeKeepsReaders unmapped its mapping and, deferred, unmapped
//     it again, while its sibling subtest had just mapped a blob of the
//     same size (a kernel trace showed mmap, munmap, mmap at the same
//     address by the sibling, munmap by the first, SEGV_MAPERR in the
//     sibling; no FUSE request failed).
//   - A fault is reported with its address and whether it lies in the
//     mapping, so that a fault of the mount (SIGBUS inside it) is told
//     from a fault of the test (an address outside it, or unmapped).

// mapShared maps the first n bytes of f read-only and shared, and
// returns the mapping and unmap, which unmaps it on its first call only;
// the test's cleanup calls it too.
func mapShared(t *testing.T, f *os.File, n int) (mem []byte, unmap func()) {
	t.Helper()
	mem, err := syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap %s: %v", f.Name(), err)
	}
	unmap = sync.OnceFunc(func() {
		if err := syscall.Munmap(mem); err != nil {
			t.Errorf("munmap %s: %v", f.Name(), err)
		}
	})
	t.Cleanup(unmap)
	return mem, unmap
}

// faultSafeSum is the sha256 of mapped memory; a fault reading it (a
// page the mount fails to fill: SIGBUS) is an error, not a crash of the
// test, naming the address and the mapping's range.
func faultSafeSum(mem []byte) (sum string, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			start := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
			where := ""
			if a, ok := r.(interface{ Addr() uintptr }); ok {
				where = fmt.Sprintf(" at %#x (the mapping is %#x-%#x, offset %d)", a.Addr(), start, start+uintptr(len(mem)), int64(a.Addr())-int64(start))
			}
			err = fmt.Errorf("fault reading the mapping%s: %v", where, r)
		}
	}()
	return sha(mem), nil
}

// errWrongBytes is readMapped's error for content that is not the blob's.
var errWrongBytes = errors.New("wrong bytes")

// readMapped maps the first n bytes of the blob at path, faults them in
// page by page without readahead (MADV_RANDOM: a READ of its own for
// each page), checks that they hash to d (errWrongBytes if not), and
// unmaps and closes it; then it drops the file's pages from the page
// cache (POSIX_FADV_DONTNEED), so that the next mapping of it reads
// through the mount again. For a goroutine beside a test: it returns
// errors rather than fail the test.
func readMapped(path string, n int, d string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap %s: %w", path, err)
	}
	err = syscall.Madvise(mem, syscall.MADV_RANDOM)
	var got string
	if err == nil {
		got, err = faultSafeSum(mem)
	}
	if uerr := syscall.Munmap(mem); err == nil {
		err = uerr
	}
	switch {
	case err != nil:
		return fmt.Errorf("%s through a mapping: %w", path, err)
	case got != d:
		return fmt.Errorf("%s through a mapping: %w (sha256 %s)", path, errWrongBytes, got)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("fadvise %s: %w", path, err)
	}
	return nil
}

// TestMapSharedUnmapsOnce: a mapping unmapped, then unmapped again by
// its cleanup, leaves alone the next mapping the process made, which
// takes the same address when it has the same length (the kernel hands
// out the gap just freed). It fails if unmap unmaps on every call (the
// second mapping faults), and it checks that the addresses coincided,
// so that it cannot pass without trying.
func TestMapSharedUnmapsOnce(t *testing.T) {
	dir := t.TempDir()
	const n = 3 << 20
	open := func(name string, b byte) *os.File {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, bytes.Repeat([]byte{b}, n), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	a, b := open("a", 'a'), open("b", 'b')
	memA, unmapA := mapShared(t, a, n)
	addrA := unsafe.SliceData(memA)
	unmapA()
	memB, _ := mapShared(t, b, n)
	if unsafe.SliceData(memB) != addrA {
		t.Fatalf("the second mapping is at %p, the first was at %p: the kernel did not reuse the address, so this test shows nothing", unsafe.SliceData(memB), addrA)
	}
	unmapA() // as the first mapping's cleanup does
	got, err := faultSafeSum(memB)
	if err != nil {
		t.Fatalf("the second mapping after the first's second unmap: %v", err)
	}
	if want := sha(bytes.Repeat([]byte{'b'}, n)); got != want {
		t.Fatalf("the second mapping sums to %s, want %s", got, want)
	}
}
