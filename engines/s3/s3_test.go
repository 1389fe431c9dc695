package s3_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/minio/minio-go/v7"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/enginetest"
	"github.com/alkblobfs/alkblobfs/engines/s3"
	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
)

const part = 5 << 20 // the smallest part size S3 allows; tests use it

func TestEngine(t *testing.T) {
	enginetest.Run(t, func(t *testing.T) engines.Engine { return open(t, s3test.URL(t), nil) })
}

// TestReopen: blobs are durable across a close.
func TestReopen(t *testing.T) {
	u := s3test.URL(t)
	enginetest.Reopen(t, func(t *testing.T) engines.Engine { return open(t, u, nil) })
}

// open opens the engine at url; tweak, if not nil, changes its config.
func open(t *testing.T, url string, tweak func(*s3.Config), log ...*slog.Logger) *s3.Engine {
	t.Helper()
	cfg, err := s3.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		tweak(&cfg)
	}
	var l *slog.Logger
	if len(log) > 0 {
		l = log[0]
	}
	e, err := s3.Open(t.Context(), cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func smallParts(c *s3.Config) { c.PartSize = part }

func s3OpenURL(t testing.TB, url string) (*s3.Engine, error) {
	return s3.OpenURL(t.Context(), url, nil)
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want s3.Config
		err  string
	}{
		{url: "s3://b/p/q?endpoint=h:9000", want: s3.Config{Bucket: "b", Prefix: "p/q", Endpoint: "h:9000", TLS: true}},
		{url: "s3://b?endpoint=h:1&region=r1&tls=false", want: s3.Config{Bucket: "b", Endpoint: "h:1", Region: "r1"}},
		{url: "s3://b/p/?endpoint=h:1&tls=0", want: s3.Config{Bucket: "b", Prefix: "p", Endpoint: "h:1"}},
		{url: "s3://key:secret@b/p?endpoint=h:1", err: "credentials do not go in the URL"},
		{url: "s3://key@b/p?endpoint=h:1", err: "credentials do not go in the URL"},
		{url: "s3://b/p", err: "no endpoint"},
		{url: "s3:///p?endpoint=h:1", err: "no bucket"},
		{url: "s3://b/p?endpoint=h:1&tls=maybe", err: "tls="},
		{url: "s3://b/p?endpoint=h:1&secret=x", err: "unknown parameter"},
		{url: "s3://b/p?endpoint=http://h:1", err: "without a scheme"},
		{url: "s3://b/a//c?endpoint=h:1", err: "empty path segment"},
		{url: "local:/x", err: "want s3://"},
	} {
		got, err := s3.ParseURL(tc.url)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseURL(%q) = %v; want an error containing %q", tc.url, err, tc.err)
			}
			if err != nil && strings.Contains(err.Error(), "secret") && tc.err != "unknown parameter" {
				t.Errorf("ParseURL(%q): the error repeats the secret: %v", tc.url, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseURL(%q) = %+v, %v; want %+v", tc.url, got, err, tc.want)
		}
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"s3://k:secret@b/p?endpoint=h:1": "s3://REDACTED@b/p?endpoint=h:1",
		"s3://b/p?endpoint=h:1":          "s3://b/p?endpoint=h:1",
		"s3://k:se%zzcret@b/p":           "s3://REDACTED@b/p",
	} {
		if got := s3.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q; want %q", in, got, want)
		}
	}
}

// TestNoCredentials: a clear error, before any request.
func TestNoCredentials(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	_, err := s3.OpenURL(t.Context(), "s3://b/p?endpoint=127.0.0.1:1&tls=false", nil)
	if err == nil || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") {
		t.Fatalf("Open without credentials: %v; want an error naming AWS_ACCESS_KEY_ID", err)
	}
}

// TestMissingBucket names the bucket.
func TestMissingBucket(t *testing.T) {
	u := strings.Replace(s3test.URL(t), "s3://alkblobfs", "s3://no-such-bucket-here", 1)
	_, err := s3.OpenURL(t.Context(), u, nil)
	if err == nil || !strings.Contains(err.Error(), "no-such-bucket-here") {
		t.Fatalf("Open of a missing bucket: %v", err)
	}
}

// TestMultipart writes blobs across part boundaries in odd-sized writes,
// through multipart uploads and the server-side copy, and reads them back
// with reads that straddle windows. Nothing stays under the staging
// prefix.
func TestMultipart(t *testing.T) {
	e := open(t, s3test.URL(t), smallParts)
	defer e.Close()
	for _, n := range []int{part - 1, part, part + 1, 2*part + 333} {
		v := randBytes(n)
		d := commitOdd(t, e, v)
		c, err := e.Open(t.Context(), d)
		if err != nil {
			t.Fatal(err)
		}
		for _, size := range []int{1000, 128 << 10, 1 << 20, 1<<20 + 1, 17 << 20} {
			got := make([]byte, 0, n)
			p := make([]byte, size)
			for off := 0; ; off += size {
				k, err := c.ReadAt(p, int64(off))
				got = append(got, p[:k]...)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("%d-byte blob, %d-byte reads: ReadAt(%d): %v", n, size, off, err)
				}
			}
			if !bytes.Equal(got, v) {
				t.Fatalf("%d-byte blob read back in %d-byte reads differs", n, size)
			}
		}
		c.Close()
	}
	checkNoResidue(t, e)
}

// TestMultipartCopy: a staged blob larger than the copy part size is
// published by a multipart copy (UploadPartCopy), as blobs over 5 GiB
// are.
func TestMultipartCopy(t *testing.T) {
	defer s3.SetCopyPartSize(6 << 20)() // 3 ranges of just over 5 MiB
	e := open(t, s3test.URL(t), smallParts)
	defer e.Close()
	v := randBytes(3*part + 12345)
	d := commitOdd(t, e, v)
	readAll(t, e, d, v)
	checkNoResidue(t, e)
}

// TestSidecarAndDelete: the sidecar round-trips for a small and a
// multipart blob; Delete removes both objects; a cursor open across the
// Delete fails with ErrMissing (the engine is not DeleteSafe).
func TestSidecarAndDelete(t *testing.T) {
	e := open(t, s3test.URL(t), smallParts)
	defer e.Close()
	ctx := t.Context()
	if _, ok := any(e).(engines.DeleteSafe); ok {
		t.Fatal("the S3 engine claims DeleteSafe")
	}
	for _, n := range []int{100, part + 100} {
		v := randBytes(n)
		d := blob.Sum(v)
		st, err := e.Stage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st.Write(v)
		st.(engines.SidecarStage).SetSidecar([]byte("sums"))
		if err := st.Commit(ctx, d); err != nil {
			t.Fatal(err)
		}
		if b, err := e.Sidecar(ctx, d); err != nil || string(b) != "sums" {
			t.Fatalf("Sidecar = %q, %v", b, err)
		}
		c, err := e.Open(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Sidecar(ctx, d); !errors.Is(err, blob.ErrMissing) {
			t.Fatalf("Sidecar after Delete: %v; want ErrMissing", err)
		}
		if _, err := c.ReadAt(make([]byte, 10), 0); !errors.Is(err, blob.ErrMissing) {
			t.Fatalf("ReadAt after Delete: %v; want ErrMissing", err)
		}
		c.Close()
	}
	plain := commitOdd(t, e, randBytes(10))
	if _, err := e.Sidecar(ctx, plain); !errors.Is(err, blob.ErrMissing) {
		t.Fatalf("Sidecar of a blob without one: %v; want ErrMissing", err)
	}
	if n := count(t, e, ""); n != 1 {
		t.Fatalf("%d objects under the prefix; want 1 (the plain blob)", n)
	}
	checkNoResidue(t, e)
}

// TestConcurrentMultipartSameDigest: racing multipart stages of one
// digest all succeed, one object stays, nothing is left staged.
func TestConcurrentMultipartSameDigest(t *testing.T) {
	e := open(t, s3test.URL(t), smallParts)
	defer e.Close()
	v := randBytes(part + 1000)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := tryCommit(e, v); err != nil {
				t.Errorf("racing Commit: %v", err)
			}
		})
	}
	wg.Wait()
	readAll(t, e, blob.Sum(v), v)
	checkNoResidue(t, e)
}

// TestListSkipsForeign: objects under the prefix that are not blobs are
// not listed, and the listing stops before the staging and sidecar
// prefixes.
func TestListSkipsForeign(t *testing.T) {
	u := s3test.URL(t)
	e := open(t, u, nil)
	defer e.Close()
	ds := []blob.Digest{commitOdd(t, e, []byte("a")), commitOdd(t, e, []byte("b"))}
	cfg := e.Config()
	for _, k := range []string{"README", "00/x", "ab/" + strings.Repeat("c", 64), "stage/x", "sums/ab/x", "zz"} {
		if _, err := e.Client().PutObject(t.Context(), cfg.Bucket, cfg.Prefix+"/"+k, bytes.NewReader(nil), 0, minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var got []blob.Digest
	for en, err := range e.List(t.Context(), blob.Digest{}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, en.Digest)
	}
	if len(got) != 2 || !(got[0] == ds[0] && got[1] == ds[1] || got[0] == ds[1] && got[1] == ds[0]) || got[0].Compare(got[1]) > 0 {
		t.Fatalf("listed %v; want the two blobs in order", got)
	}
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func tryCommit(e *s3.Engine, v []byte) error {
	st, err := e.Stage(context.Background())
	if err != nil {
		return err
	}
	defer st.Discard()
	if _, err := st.Write(v); err != nil {
		return err
	}
	return st.Commit(context.Background(), blob.Sum(v))
}

// commitOdd stages v in writes of growing odd sizes and commits it.
func commitOdd(t *testing.T, e *s3.Engine, v []byte) blob.Digest {
	t.Helper()
	st, err := e.Stage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Discard()
	for off, step := 0, 1; off < len(v); off, step = off+step, step*3+1 {
		if _, err := st.Write(v[off:min(off+step, len(v))]); err != nil {
			t.Fatal(err)
		}
	}
	d := blob.Sum(v)
	if err := st.Commit(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	return d
}

func readAll(t *testing.T, e *s3.Engine, d blob.Digest, want []byte) {
	t.Helper()
	c, err := e.Open(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := make([]byte, len(want)+1)
	n, err := c.ReadAt(got, 0)
	if n != len(want) || err != io.EOF || !bytes.Equal(got[:n], want) {
		t.Fatalf("ReadAt = %d, %v (equal %v); want %d, EOF", n, err, bytes.Equal(got[:n], want), len(want))
	}
}

func checkNoResidue(t *testing.T, e *s3.Engine) {
	t.Helper()
	n, err := e.StageResidue(t.Context())
	if err != nil || n != 0 {
		t.Fatalf("StageResidue = %d, %v; want 0", n, err)
	}
	if n := count(t, e, "stage/"); n != 0 {
		t.Fatalf("%d objects under stage/", n)
	}
}

// count counts the objects under the engine's prefix + sub.
func count(t *testing.T, e *s3.Engine, sub string) int {
	t.Helper()
	cfg := e.Config()
	n := 0
	for obj := range e.Client().ListObjectsIter(t.Context(), cfg.Bucket, minio.ListObjectsOptions{Prefix: cfg.Prefix + "/" + sub, Recursive: true}) {
		if obj.Err != nil {
			t.Fatal(obj.Err)
		}
		n++
	}
	return n
}

// TestStageMemoryBounded: a stage's memory does not grow with the blob:
// 256 MiB through 5 MiB parts keeps the heap within a few parts.
func TestStageMemoryBounded(t *testing.T) {
	e := open(t, s3test.URL(t), smallParts)
	defer e.Close()
	st, err := e.Stage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Discard()
	chunk := randBytes(1 << 20)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapInuse, ms.HeapInuse
	for i := range 256 {
		chunk[0] = byte(i) // distinct content, not that it matters
		if _, err := st.Write(chunk); err != nil {
			t.Fatal(err)
		}
		if i%16 == 15 {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
		}
	}
	growth := int64(peak) - int64(base)
	t.Logf("heap in use grew by %d MiB staging 256 MiB", growth>>20)
	if growth > 64<<20 {
		t.Fatalf("heap in use grew by %d MiB staging 256 MiB in 5 MiB parts; want a few parts", growth>>20)
	}
	if err := st.Discard(); err != nil {
		t.Fatal(err)
	}
	checkNoResidue(t, e)
}
