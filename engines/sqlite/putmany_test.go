package sqlite_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
)

// TestPutMany: a bulk load (scripts/mkpool) inserts every blob it is
// given, on either layout, and counts a blob already there as no insert.
func TestPutMany(t *testing.T) {
	for _, layout := range []int{1, 2} {
		t.Run(fmt.Sprint("layout", layout), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kv.db")
			if layout == 1 {
				inlineDatabase(t, path)
			}
			e := open(t, path)
			if e.Layout() != layout {
				t.Fatalf("opened as layout %d, want %d", e.Layout(), layout)
			}
			var ds []blob.Digest
			var values [][]byte
			for i := range 3 {
				v := []byte(fmt.Sprint("bulk ", i))
				ds, values = append(ds, sha256.Sum256(v)), append(values, v)
			}
			if _, err := e.Put(t.Context(), ds[1], values[1]); err != nil {
				t.Fatal(err)
			}
			n, err := e.PutMany(t.Context(), ds, values)
			if err != nil || n != 2 {
				t.Fatalf("PutMany of 3 blobs, 1 there already: %d inserted, %v; want 2", n, err)
			}
			for i, d := range ds {
				if got := get(t, e, d); !bytes.Equal(got, values[i]) {
					t.Errorf("blob %d reads %q, want %q", i, got, values[i])
				}
			}

			if _, err := e.PutMany(t.Context(), ds, values[:2]); err == nil {
				t.Error("PutMany of 3 digests and 2 values succeeded")
			}
		})
	}
}

// get reads d's whole value from e.
func get(t *testing.T, e *sqlite.Engine, d blob.Digest) []byte {
	t.Helper()
	r, err := e.Open(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b := make([]byte, r.Len())
	if _, err := r.ReadAt(b, 0); err != nil && len(b) > 0 {
		t.Fatal(err)
	}
	return b
}
