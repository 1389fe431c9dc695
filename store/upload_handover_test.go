package store_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/store"
)

// TestUploadExport: an upload handed over half written (Export, then
// ImportUpload, as an upgrade does across processes) goes on in the
// importer and commits the whole content's digest, in memory or staged,
// in every layout; the exporter's Discard (the old daemon letting go)
// takes nothing from it, and no stage file is left. An exporter whose
// successor never took over goes on with its own upload as before. A
// seeded upload is refused.
func TestUploadExport(t *testing.T) {
	ctx := t.Context()
	for _, l := range layouts {
		for _, size := range []int{threshold / 2, 3*threshold + 5, 4 << 20} {
			if !l.large && size > threshold {
				continue
			}
			s := openStore(t, l, t.TempDir())
			content := randBytes(size)
			half := size / 2
			want := blob.Sum(content)

			// Handed over: the importer writes the rest.
			old, err := s.NewUpload(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := old.WriteAt(content[:half], 0); err != nil {
				t.Fatal(err)
			}
			f, err := old.Export()
			if err != nil {
				t.Fatalf("%s, %d bytes: export: %v", l.name, size, err)
			}
			up, err := s.ImportUpload(ctx, f, int64(half))
			if err != nil {
				t.Fatal(err)
			}
			old.Discard()
			if _, err := up.WriteAt(content[half:], int64(half)); err != nil {
				t.Fatal(err)
			}
			d, pin, err := up.Commit(ctx, nil)
			if err != nil || d != want {
				t.Fatalf("%s, %d bytes: the importer committed %v, %v; want %v", l.name, size, d, err, want)
			}
			pin.Release()
			if !bytes.Equal(readAll(t, s, d), content) {
				t.Fatalf("%s, %d bytes: the committed content differs", l.name, size)
			}
			if n := residue(t, s); n != 0 {
				t.Fatalf("%s, %d bytes: %d stage files left", l.name, size, n)
			}

			// Not taken over: the exporter goes on.
			old, err = s.NewUpload(ctx)
			if err != nil {
				t.Fatal(err)
			}
			old.WriteAt(content[:half], 0)
			f, err = old.Export()
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			if _, err := old.WriteAt(content[half:], int64(half)); err != nil {
				t.Fatal(err)
			}
			if d, pin, err := old.Commit(ctx, nil); err != nil || d != want {
				t.Fatalf("%s, %d bytes: the exporter went on and committed %v, %v; want %v", l.name, size, d, err, want)
			} else {
				pin.Release()
			}
		}
	}

	s := openStore(t, layouts[len(layouts)-1], t.TempDir())
	base := randBytes(2 * threshold)
	d, pin, err := s.PutBytes(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	up, _ := s.NewUpload(ctx)
	r, _, _ := s.Get(ctx, d)
	if err := up.Seed(ctx, r, pin); err != nil {
		t.Fatal(err)
	}
	if _, err := up.Export(); !errors.Is(err, store.ErrNotCarried) {
		t.Fatalf("a seeded upload's export: %v, want ErrNotCarried", err)
	}
	up.Discard()
}
