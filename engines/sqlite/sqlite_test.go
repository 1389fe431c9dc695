package sqlite_test

import (
	"os"
	"path/filepath"
	"testing"

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
	path := filepath.Join(t.TempDir(), "kv.db")
	enginetest.Reopen(t, func(t *testing.T) engines.Engine { return open(t, path) })
	if e := open(t, path); e.Name() != "sqlite:"+path {
		t.Fatalf("Name = %q", e.Name())
	} else {
		e.Close()
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

// TestPrivateFiles: the database, its WAL and shared-memory files are 0600
// whatever existed before.
func TestPrivateFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	e := open(t, path)
	defer e.Close()
	if _, err := e.Put(t.Context(), blob.Sum([]byte("x")), []byte("x")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %#o; want 0600", filepath.Base(p), fi.Mode().Perm())
		}
	}
}
