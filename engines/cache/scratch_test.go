package cache_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
)

// TestUploadOffFullCacheDisk: an upload larger than the cache's disk (a
// small tmpfs) starts on it, as its scratch file does to be linked in,
// and moves to the store's scratch directory when that disk fills: every
// write succeeds, the put commits and reads back, and it is not written
// through (counted as a put_nospace fill error).
func TestUploadOffFullCacheDisk(t *testing.T) {
	fsdir := t.TempDir()
	if err := mountTmpfs(fsdir, "size=8m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { unmount(fsdir) })
	f := &fixture{t: t, url: s3test.URL(t), dir: filepath.Join(fsdir, "cache"), scratch: t.TempDir()}
	f.open(4 << 20)
	ctx := context.Background()
	b := randBytes(24<<20+5, 51)
	u, err := f.st.NewUpload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(b); off += 1 << 20 {
		if _, err := u.WriteAt(b[off:min(off+1<<20, len(b))], int64(off)); err != nil {
			t.Fatalf("write at %d MiB of an upload larger than the cache's disk: %v", off>>20, err)
		}
	}
	d, pin, err := u.Commit(ctx, nil)
	if err != nil {
		t.Fatalf("commit: %v", err)
	}
	pin.Release()
	s := f.stats()
	if s.Process.Adopted != 0 || s.Process.FillErrors["put_nospace"] != 1 || f.cached(d) {
		t.Fatalf("after the put: cached %v, %+v; want not adopted, one put_nospace", f.cached(d), s.Process)
	}
	f.read(d)
}
