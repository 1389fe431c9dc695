package store_test

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkUploadSequential is the incoming/ write path without FUSE:
// 1 MiB writes into an Upload on sqlite+local, then Commit.
func BenchmarkUploadSequential(b *testing.B) {
	s := openStore(b, layouts[2], b.TempDir())
	buf := make([]byte, 1<<20)
	rand.Read(buf)
	const total = 256 << 20
	b.SetBytes(total)
	for b.Loop() {
		u, err := s.NewUpload(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		for off := int64(0); off < total; off += int64(len(buf)) {
			buf[0]++
			if _, err := u.WriteAt(buf, off); err != nil {
				b.Fatal(err)
			}
		}
		_, pin, err := u.Commit(b.Context(), nil)
		if err != nil {
			b.Fatal(err)
		}
		pin.Release()
	}
}

// BenchmarkNativeWrite is the floor: the same writes into a plain file.
func BenchmarkNativeWrite(b *testing.B) {
	dir := b.TempDir()
	buf := make([]byte, 1<<20)
	rand.Read(buf)
	const total = 256 << 20
	b.SetBytes(total)
	for b.Loop() {
		f, err := os.Create(filepath.Join(dir, "f"))
		if err != nil {
			b.Fatal(err)
		}
		for off := int64(0); off < total; off += int64(len(buf)) {
			f.WriteAt(buf, off)
		}
		f.Sync()
		f.Close()
		os.Remove(f.Name())
	}
}

// BenchmarkGetLarge is the open and close of a large blob on sqlite+local
// (a mount's open of a blob file, a CLI get before its first byte): what
// the corrupt ledger's lookup adds to every large Get.
func BenchmarkGetLarge(b *testing.B) {
	s := openStore(b, layouts[2], b.TempDir())
	buf := make([]byte, 1<<20)
	rand.Read(buf)
	d, pin, err := s.PutBytes(b.Context(), buf)
	if err != nil {
		b.Fatal(err)
	}
	pin.Release()
	for b.Loop() {
		r, ok, err := s.Get(b.Context(), d)
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
		r.Close()
	}
}
