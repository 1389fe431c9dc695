package cache_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
)

// TestFillIsVerified: a blob read once through the store (a fill, hashed
// whole before its copy was published) is passed through at its next
// open without Trust, as a local blob a reader verified whole is: the
// fill told the store the copy is good as the file it published.
func TestFillIsVerified(t *testing.T) {
	f := newFixture(t, s3test.URL(t), t.TempDir(), 64<<20)
	d, _ := f.put(5<<20+3, 21)
	f.read(d)
	f.settled()
	r, _, err := f.st.Get(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, ok := r.Passthrough(); !ok {
		t.Fatal("a copy the fill verified whole is not passed through without Trust (--verify=full)")
	}
	// A changed file is verified again first, as a local blob's.
	r.Close()
	path := filepath.Join(f.dir, "blobs", d.String()[:2], d.String())
	if err := os.Chmod(path, 0o400); err != nil {
		t.Fatal(err)
	}
	r2, _, err := f.st.Get(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if _, ok := r2.Passthrough(); ok {
		t.Fatal("a copy whose file changed since its fill is passed through unverified")
	}
}

// gated is a remote whose cursors' reads past offset 0 wait for gate:
// a test holds a fill in flight.
type gated struct {
	engines.Large
	gate chan struct{}
}

func (g gated) Open(ctx context.Context, d blob.Digest) (engines.Cursor, error) {
	c, err := g.Large.Open(ctx, d)
	if err != nil {
		return nil, err
	}
	return gatedCursor{c, g.gate}, nil
}

func (g gated) Sidecar(ctx context.Context, d blob.Digest) ([]byte, error) {
	return g.Large.(engines.SidecarReader).Sidecar(ctx, d)
}

type gatedCursor struct {
	engines.Cursor
	gate chan struct{}
}

func (c gatedCursor) ReadAt(p []byte, off int64) (int, error) {
	if off > 0 {
		<-c.gate
	}
	return c.Cursor.ReadAt(p, off)
}

// TestFillVerdictOnlyForItsFile: when another copy of the blob is
// published while a fill runs (a put's write-through does not wait for
// fills), the fill's publish keeps that copy and drops its stage; the
// store is not told the copy there is good, since the fill never hashed
// that file: its next open is verified, not passed through.
func TestFillVerdictOnlyForItsFile(t *testing.T) {
	gate := make(chan struct{})
	f := &fixture{t: t, url: s3test.URL(t), dir: t.TempDir(),
		wrap: func(l engines.Large) engines.Large { return gated{l, gate} }}
	f.open(64 << 20)
	d, b := f.put(4<<20, 22)
	ctx := context.Background()
	r, _, err := f.st.Get(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadAt(make([]byte, 4096), 0); err != nil { // the fill starts, held at its second segment
		t.Fatal(err)
	}
	// Another copy arrives, as a put's write-through would link it.
	path := filepath.Join(f.dir, "blobs", d.String()[:2], d.String())
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o444); err != nil {
		t.Fatal(err)
	}
	close(gate)
	r.Close()
	if s := f.settled(); s.Process.Fills != 0 {
		t.Fatalf("the fill published over another copy: %+v", s.Process)
	}
	r2, _, err := f.st.Get(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if _, ok := r2.Passthrough(); ok {
		t.Fatal("a copy the fill did not hash is passed through unverified")
	}
	f.read(d)
}
