package cache_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/cache"
	"github.com/alkblobfs/alkblobfs/engines/s3"
	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
	"github.com/alkblobfs/alkblobfs/store"
)

// fixture is a large-only store on a fresh S3 prefix with a cache in dir.
type fixture struct {
	t       *testing.T
	url     string
	dir     string
	st      *store.Store
	c       *cache.Engine
	opt     cache.Options                     // Dir and Limit are set by open
	wrap    func(engines.Large) engines.Large // the remote, if set
	scratch string                            // the store's ScratchDir
}

func newFixture(t *testing.T, url, dir string, limit int64) *fixture {
	t.Helper()
	f := &fixture{t: t, url: url, dir: dir}
	f.open(limit)
	return f
}

func (f *fixture) open(limit int64) {
	f.t.Helper()
	ctx := context.Background()
	s3e, err := s3.OpenURL(ctx, f.url, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	var remote engines.Large = s3e
	if f.wrap != nil {
		remote = f.wrap(remote)
	}
	opt := f.opt
	opt.Dir, opt.Limit = f.dir, limit
	if opt.Segment == 0 {
		opt.Segment = 1 << 20
	}
	large, c, err := cache.New(ctx, remote, opt)
	if err != nil {
		remote.Close()
		f.t.Fatal(err)
	}
	st, err := store.Open(ctx, store.Config{Large: large, ScratchDir: f.scratch})
	if err != nil {
		large.Close()
		f.t.Fatal(err)
	}
	f.st, f.c = st, c
	f.t.Cleanup(func() { st.Close() })
}

func (f *fixture) put(n int, seed uint64) (blob.Digest, []byte) {
	f.t.Helper()
	b := randBytes(n, seed)
	d, pin, err := f.st.Put(context.Background(), bytes.NewReader(b), int64(n))
	if err != nil {
		f.t.Fatal(err)
	}
	pin.Release()
	return d, b
}

func randBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// read reads d whole through the store and checks it.
func (f *fixture) read(d blob.Digest) {
	f.t.Helper()
	r, ok, err := f.st.Get(context.Background(), d)
	if err != nil || !ok {
		f.t.Fatalf("get %s: %v, %v", d, ok, err)
	}
	defer r.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(r, 0, r.Len())); err != nil {
		f.t.Fatalf("read %s: %v", d, err)
	}
	if got := blob.Digest(h.Sum(nil)); got != d {
		f.t.Fatalf("read %s: got %s", d, got)
	}
}

func (f *fixture) stats() engines.CacheStats {
	f.t.Helper()
	s, err := f.st.CacheStats(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

// settled waits for the fills in flight to end.
func (f *fixture) settled() engines.CacheStats {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s := f.stats()
		if s.Filling == 0 {
			return s
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("fills still in flight after 20s: %+v", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (f *fixture) cached(d blob.Digest) bool {
	_, err := os.Stat(filepath.Join(f.dir, "blobs", d.String()[:2], d.String()))
	return err == nil
}

// TestFillThenHit: the first read fills the cache (one fill, the blob's
// bytes once), and the next read is a local file the kernel may read
// directly (passthrough); the cached file is the blob's bytes.
func TestFillThenHit(t *testing.T) {
	f := newFixture(t, s3test.URL(t), t.TempDir(), 64<<20)
	d, b := f.put(5<<20+123, 1)
	f.read(d)
	s := f.settled()
	if s.Blobs != 1 || s.Bytes != int64(len(b)) || s.Process.Fills != 1 || s.Process.Misses != 1 || s.Process.BytesFilled != int64(len(b)) {
		t.Fatalf("after the first read: %+v", s)
	}
	got, err := os.ReadFile(filepath.Join(f.dir, "blobs", d.String()[:2], d.String()))
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("cached file: %v (equal %v)", err, bytes.Equal(got, b))
	}
	r, _, err := f.st.Get(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Trust()
	if _, ok := r.Passthrough(); !ok {
		t.Fatal("a cached blob offers no passthrough")
	}
	if s := f.stats(); s.Process.Hits != 1 {
		t.Fatalf("hits %d, want 1", s.Process.Hits)
	}
}

// TestConcurrentReadersShareOneFill: readers of one blob started together
// fetch it once.
func TestConcurrentReadersShareOneFill(t *testing.T) {
	f := newFixture(t, s3test.URL(t), t.TempDir(), 64<<20)
	d, b := f.put(8<<20, 2)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			r, ok, err := f.st.Get(context.Background(), d)
			if err != nil || !ok {
				t.Errorf("get: %v %v", ok, err)
				return
			}
			defer r.Close()
			got, err := io.ReadAll(io.NewSectionReader(r, 0, r.Len()))
			if err != nil || !bytes.Equal(got, b) {
				t.Errorf("read: %v", err)
			}
		})
	}
	wg.Wait()
	s := f.settled()
	if s.Process.BytesFilled != int64(len(b)) || s.Process.Fills != 1 {
		t.Fatalf("4 readers: %+v; want one fill of %d bytes", s.Process, len(b))
	}
}

// TestEvictionSkipsOpen: at the size bound the least recently used copy
// goes, unless it is open: then the next one does.
func TestEvictionSkipsOpen(t *testing.T) {
	f := newFixture(t, s3test.URL(t), t.TempDir(), 5<<20)
	const n = 2 << 20
	a, _ := f.put(n, 3)
	b, _ := f.put(n, 4)
	c, _ := f.put(n, 5)
	f.read(a)
	f.settled()
	ra, _, err := f.st.Get(context.Background(), a) // a hit, held open
	if err != nil {
		t.Fatal(err)
	}
	f.read(b)
	f.settled()
	f.read(c) // needs room: a is oldest but open, so b goes
	s := f.settled()
	if !f.cached(a) || f.cached(b) || !f.cached(c) {
		t.Fatalf("cached a=%v b=%v c=%v; want a (open) and c", f.cached(a), f.cached(b), f.cached(c))
	}
	if s.Bytes > 5<<20 || s.Process.Evictions != 1 {
		t.Fatalf("after eviction: %+v", s)
	}
	ra.Close()
	f.read(b) // a is the oldest and closed now
	f.settled()
	if f.cached(a) || !f.cached(b) || !f.cached(c) {
		t.Fatalf("cached a=%v b=%v c=%v; want b and c", f.cached(a), f.cached(b), f.cached(c))
	}
}

// TestRestartRebuilds: a new process finds the copies (the index rebuilt
// from the files even if it is lost) and removes a dead fill's stage.
func TestRestartRebuilds(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, s3test.URL(t), dir, 64<<20)
	d, b := f.put(3<<20, 6)
	f.read(d)
	f.settled()
	f.st.Close()
	for _, name := range []string{"index.db", "index.db-wal", "index.db-shm"} {
		os.Remove(filepath.Join(dir, name))
	}
	stale := filepath.Join(dir, "stage", "stage-dead")
	if err := os.WriteFile(stale, []byte("half a fill"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.open(64 << 20)
	s := f.stats()
	if s.Blobs != 1 || s.Bytes != int64(len(b)) {
		t.Fatalf("after restart: %+v", s)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the dead fill's stage is still there: %v", err)
	}
	f.read(d)
	if s := f.stats(); s.Process.Hits != 1 || s.Process.Misses != 0 {
		t.Fatalf("read after restart: %+v, want a hit", s.Process)
	}
}

// TestFlippedByteRefetched: a cached copy with a flipped byte is never
// served: the read that finds it gets the right bytes from the remote
// tier, the copy is dropped, and the cache fills again.
func TestFlippedByteRefetched(t *testing.T) {
	f := newFixture(t, s3test.URL(t), t.TempDir(), 64<<20)
	d, b := f.put(3<<20, 7)
	f.read(d)
	f.settled()
	path := filepath.Join(f.dir, "blobs", d.String()[:2], d.String())
	flip(t, path, 1<<20+5)
	r, _, err := f.st.Get(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 64<<10)
	if _, err := r.ReadAt(p, 1<<20); err != nil || !bytes.Equal(p, b[1<<20:1<<20+len(p)]) {
		t.Fatalf("read of the flipped chunk: %v (right bytes: %v)", err, bytes.Equal(p, b[1<<20:1<<20+len(p)]))
	}
	r.Close()
	s := f.settled()
	if s.Process.Dropped != 1 {
		t.Fatalf("dropped %d, want 1", s.Process.Dropped)
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("the copy filled again: %v (right bytes: %v)", err, bytes.Equal(got, b))
	}
}

func flip(t *testing.T, path string, off int64) {
	t.Helper()
	fh, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var one [1]byte
	if _, err := fh.ReadAt(one[:], off); err != nil {
		t.Fatal(err)
	}
	one[0] ^= 0x40
	if _, err := fh.WriteAt(one[:], off); err != nil {
		t.Fatal(err)
	}
}

// TestRemoteDown: with the S3 server stopped, a cached blob still reads
// and an uncached one fails.
func TestRemoteDown(t *testing.T) {
	srv := s3test.FaultServer(t)
	f := newFixture(t, srv.URL, t.TempDir(), 64<<20)
	a, _ := f.put(2<<20, 8)
	b, _ := f.put(2<<20, 9)
	f.read(a)
	f.settled()
	srv.Stop(t)
	f.read(a)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, ok, err := f.st.Get(ctx, b)
	if err == nil && ok {
		_, err = io.ReadAll(io.NewSectionReader(r, 0, r.Len()))
		r.Close()
	}
	if err == nil {
		t.Fatal("an uncached blob read with the server down")
	}
}

// TestNoSpace: a cache whose filesystem is full (no inode left for a
// stage) still serves reads, from the remote tier, and counts it.
func TestNoSpace(t *testing.T) {
	fsdir := t.TempDir()
	if err := mountTmpfs(fsdir, "size=64m,nr_inodes=64"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { unmount(fsdir) })
	f := newFixture(t, s3test.URL(t), filepath.Join(fsdir, "cache"), 32<<20)
	d, b := f.put(2<<20, 10)
	for i := 0; ; i++ {
		if err := os.WriteFile(filepath.Join(fsdir, "fill", string(rune('a'+i%26))+string(rune('a'+i/26))), nil, 0o600); err != nil {
			if os.IsNotExist(err) {
				os.Mkdir(filepath.Join(fsdir, "fill"), 0o700)
				continue
			}
			break
		}
		if i > 1000 {
			t.Fatal("the tmpfs never ran out of inodes")
		}
	}
	r, _, err := f.st.Get(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(io.NewSectionReader(r, 0, r.Len()))
	r.Close()
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("read with the cache's disk full: %v", err)
	}
	if s := f.settled(); s.Process.FillErrors["nospace"] != 1 || s.Blobs != 0 {
		t.Fatalf("%+v; want one nospace fill error", s)
	}
}

// TestWrongBytesNotCached: bytes from the remote tier that do not hash to
// the digest are never published into the cache (nor served as good).
func TestWrongBytesNotCached(t *testing.T) {
	url := s3test.URL(t)
	f := newFixture(t, url, t.TempDir(), 64<<20)
	d, b := f.put(2<<20, 11)
	remote, err := s3.OpenURL(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	bad := bytes.Clone(b)
	bad[len(bad)-1] ^= 1
	if _, err := remote.Client().PutObject(context.Background(), remote.Config().Bucket, remote.Key(d),
		bytes.NewReader(bad), int64(len(bad)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	r, _, err := f.st.Get(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(io.NewSectionReader(r, 0, r.Len()))
	r.Close()
	if !errors.Is(err, store.ErrVerification) {
		t.Fatalf("read of wrong bytes: %v, want a verification error", err)
	}
	s := f.settled()
	if f.cached(d) || s.Process.FillErrors["verify"] != 1 {
		t.Fatalf("wrong bytes: cached %v, %+v", f.cached(d), s.Process)
	}
}

// TestUploadWriteThrough: an upload through the store (as the mount's
// incoming/ files are) lands in the cache when it commits, by a link of
// its scratch file: no fill, no byte fetched, and with S3 stopped it
// reads from the cache, passed through. The cache is on a filesystem of
// its own (a tmpfs), away from the store's scratch directory (the system's
// temp directory): the store makes its scratch files in the cache's.
func TestUploadWriteThrough(t *testing.T) {
	srv := s3test.FaultServer(t)
	fsdir := t.TempDir()
	if err := mountTmpfs(fsdir, "size=64m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { unmount(fsdir) })
	f := newFixture(t, srv.URL, filepath.Join(fsdir, "cache"), 32<<20)
	ctx := context.Background()
	b := randBytes(6<<20+17, 9)
	u, err := f.st.NewUpload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(b); off += 1 << 20 {
		if _, err := u.WriteAt(b[off:min(off+1<<20, len(b))], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	d, pin, err := u.Commit(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	s := f.stats()
	if !f.cached(d) || s.Blobs != 1 || s.Bytes != int64(len(b)) || s.Process.Adopted != 1 || s.Process.Fills != 0 || s.Process.BytesFilled != 0 {
		t.Fatalf("after the put: cached %v, %+v; want the upload's file adopted", f.cached(d), s)
	}
	if _, err := f.c.Sidecar(ctx, d); err != nil {
		t.Fatalf("the adopted copy has no chunk checksums: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(f.dir, "stage", "*")); len(m) != 0 {
		t.Fatalf("the put left files in the cache's stage: %v", m)
	}
	srv.Stop(t)
	f.read(d)
	r, _, err := f.st.Get(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Trust()
	if _, ok := r.Passthrough(); !ok {
		t.Fatal("the adopted copy offers no passthrough")
	}
	srv.Start(t)
}

// TestAdoptLinks: Adopt publishes the very file it is given (same inode:
// no copy), and refuses, leaving nothing, a nameless file that was not
// made with O_TMPFILE.
func TestAdoptLinks(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, s3test.URL(t), dir, 64<<20)
	ctx := context.Background()
	b := randBytes(3<<20, 10)
	d := blob.Sum(b)
	if err := os.MkdirAll(f.c.ScratchDir(), 0o700); err != nil {
		t.Fatal(err)
	}

	plain, err := os.CreateTemp(f.c.ScratchDir(), "x-*")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	os.Remove(plain.Name())
	if _, err := plain.Write(b); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.c.Adopt(ctx, d, plain, int64(len(b)), []byte("sums")); ok || err == nil {
		t.Fatalf("adopted an unlinked, non-O_TMPFILE file: %v %v", ok, err)
	}
	if s := f.stats(); f.cached(d) || s.Blobs != 0 {
		t.Fatalf("a refused adoption left a copy: %+v", s)
	}
	if _, err := f.c.Sidecar(engines.Direct(ctx), d); err == nil {
		t.Fatal("a refused adoption left a sidecar")
	}

	fd, err := unix.Open(f.c.ScratchDir(), unix.O_TMPFILE|unix.O_RDWR, 0o600)
	if err != nil {
		t.Skipf("no O_TMPFILE here: %v", err)
	}
	tmp := os.NewFile(uintptr(fd), "tmpfile")
	defer tmp.Close()
	if _, err := tmp.Write(b); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.c.Adopt(ctx, d, tmp, int64(len(b)), nil); !ok || err != nil {
		t.Fatalf("adopt an O_TMPFILE file: %v %v", ok, err)
	}
	var mine, there unix.Stat_t
	if err := unix.Fstat(fd, &mine); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Join(dir, "blobs", d.String()[:2], d.String()), &there); err != nil {
		t.Fatal(err)
	}
	if mine.Ino != there.Ino || mine.Dev != there.Dev || there.Nlink != 1 {
		t.Fatalf("the cached copy is inode %d (links %d), the adopted file %d: a copy, not a link", there.Ino, there.Nlink, mine.Ino)
	}
	if s := f.stats(); s.Blobs != 1 || s.Bytes != int64(len(b)) || s.Process.Adopted != 1 {
		t.Fatalf("after the adoption: %+v", s)
	}
}

// TestTruncatedAfterOpenRefetched: a cached copy truncated after a
// reader opened it is damage, as a flipped byte is: the read gets the
// right bytes from the remote tier instead of failing until the blob is
// opened again.
func TestTruncatedAfterOpenRefetched(t *testing.T) {
	f := newFixture(t, s3test.URL(t), t.TempDir(), 64<<20)
	d, b := f.put(3<<20, 8)
	f.read(d)
	f.settled()
	r, _, err := f.st.Get(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	path := filepath.Join(f.dir, "blobs", d.String()[:2], d.String())
	if err := os.Truncate(path, 1<<20); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 64<<10)
	off := 2 << 20
	if _, err := r.ReadAt(p, int64(off)); err != nil || !bytes.Equal(p, b[off:off+len(p)]) {
		t.Fatalf("read past the truncation: %v (right bytes: %v)", err, bytes.Equal(p, b[off:off+len(p)]))
	}
}

// TestPublishingCopyIsNoMiss: a filler publishes by linking its stage as
// the copy, removing the stage's name and then closing it, and holds the
// stage's lock, the copy's inode, until it closes. A process that misses
// the blob in that window claims a new stage (the name is free) and
// finds the copy locked: it must wait for it, not fetch the blob a second
// time. (Busy run 11: two processes, one blob, 2 × 64 MiB fetched.) The
// window is held open here by a lock on the copy.
func TestPublishingCopyIsNoMiss(t *testing.T) {
	dir := t.TempDir()
	url := s3test.URL(t)
	a := newFixture(t, url, dir, 64<<20)
	d, b := a.put(4<<20, 41)
	a.read(d) // the copy
	a.settled()
	if !a.cached(d) {
		t.Fatal("the blob is not cached after a read")
	}
	copyPath := filepath.Join(dir, "blobs", d.String()[:2], d.String())
	held, err := os.Open(copyPath)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := unix.Flock(int(held.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}

	other := newFixture(t, url, dir, 64<<20) // another process of the host
	done := make(chan error, 1)
	go func() {
		r, ok, err := other.st.Get(context.Background(), d)
		if err != nil || !ok {
			done <- fmt.Errorf("get: %v %v", ok, err)
			return
		}
		defer r.Close()
		got, err := io.ReadAll(io.NewSectionReader(r, 0, r.Len()))
		if err == nil && !bytes.Equal(got, b) {
			err = errors.New("wrong bytes")
		}
		done <- err
	}()
	// While the copy is locked the reader waits, and fetches nothing; a
	// wait of a few polls, which can only miss a fetch, never invent one.
	select {
	case err := <-done:
		t.Fatalf("the read ended while the copy was locked (%v): it fetched the blob again: %+v", err, other.stats().Process)
	case <-time.After(300 * time.Millisecond):
	}
	if s := other.stats().Process; s.BytesFilled != 0 {
		t.Fatalf("a copy being published was taken for a miss: %+v", s)
	}
	unix.Flock(int(held.Fd()), unix.LOCK_UN)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the read did not end 30 s after the copy was unlocked")
	}
	if s := other.settled().Process; s.BytesFilled != 0 || s.Fills != 0 {
		t.Fatalf("the read of a published copy: %+v; want no fill", s)
	}
}
