package sqlite_test

import (
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/enginetest"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
)

func TestEngine(t *testing.T) {
	enginetest.Run(t, func(t *testing.T) engines.Engine { return open(t, filepath.Join(t.TempDir(), "kv.db")) })
}

func open(t *testing.T, path string) *sqlite.Engine {
	t.Helper()
	e, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestReopen: blobs and the delete window are durable across a close.
func TestReopen(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "kv.db")
	e := open(t, path)
	v := []byte("durable")
	d := blob.Sum(v)
	if _, err := e.Put(ctx, d, v); err != nil {
		t.Fatal(err)
	}
	when := time.Unix(1_800_000_000, 42)
	w := blob.Sum([]byte("window"))
	if err := e.WindowStage(ctx, []engines.Candidate{{Digest: w, VisibleAfter: when}}); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	e = open(t, path)
	defer e.Close()
	if n, err := e.Size(ctx, d); n != int64(len(v)) || err != nil {
		t.Fatalf("Size after reopen = %d, %v; want %d", n, err, len(v))
	}
	c, err := e.Open(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, len(v))
	if n, err := c.ReadAt(p, 0); n != len(v) || (err != nil && err != io.EOF) || string(p) != string(v) {
		t.Fatalf("ReadAt after reopen = %d, %v, %q", n, err, p)
	}
	c.Close()
	cs, err := e.WindowDue(ctx, when, blob.Digest{}, 10)
	if err != nil || len(cs) != 1 || cs[0].Digest != w || !cs[0].VisibleAfter.Equal(when) {
		t.Fatalf("WindowDue after reopen = %v, %v; want the staged row", cs, err)
	}
	if e.Name() != "sqlite:"+path {
		t.Fatalf("Name = %q", e.Name())
	}
}

// TestOpenBadPath: a directory that does not exist is an error, not a panic.
func TestOpenBadPath(t *testing.T) {
	_, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "no", "such", "kv.db"))
	if err == nil {
		t.Fatal("Open in a missing directory succeeded")
	}
}

// TestPathNeedsEscaping: '?' and '#' are legal in file names and must not
// be read as URI syntax.
func TestPathNeedsEscaping(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a?b#c%20d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	e := open(t, filepath.Join(dir, "kv.db"))
	defer e.Close()
	if _, err := os.Stat(filepath.Join(dir, "kv.db")); err != nil {
		t.Fatalf("database not created at the literal path: %v", err)
	}
}
