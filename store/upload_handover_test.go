package store_test

import (
	"bytes"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/mem"
	"github.com/alkblobfs/alkblobfs/store"
)

// TestUploadExport: an upload handed over half written (Export, then
// ImportUpload, as an upgrade does across processes) goes on in the
// importer and commits the whole content's digest, in memory or staged,
// in every layout; the exporter's Discard (the old daemon letting go)
// takes nothing from it, and no stage file is left. An exporter whose
// successor never took over goes on with its own upload as before. A
// seeded upload goes across too, reading the rest from its blob.
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
			f, e, err := old.Export()
			if err != nil {
				t.Fatalf("%s, %d bytes: export: %v", l.name, size, err)
			}
			up, err := s.ImportUpload(ctx, f, e)
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
			f, _, err = old.Export()
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

	// Seeded from a published blob (a file reopened without truncation)
	// and partly rewritten: the importer reads the rest from the blob,
	// under its own pin, even once the exporter let go of its own.
	for _, l := range layouts {
		if !l.large {
			continue
		}
		s := openStore(t, l, t.TempDir())
		base := randBytes(3<<20 + 5)
		d, pin, err := s.PutBytes(ctx, base)
		if err != nil {
			t.Fatal(err)
		}
		old, _ := s.NewUpload(ctx)
		r, _, _ := s.Get(ctx, d)
		if err := old.Seed(ctx, r, pin); err != nil {
			t.Fatal(err)
		}
		want := append([]byte(nil), base...)
		patch := randBytes(100 << 10)
		copy(want[1<<20:], patch)
		old.WriteAt(patch, 1<<20)
		f, e, err := old.Export()
		if err != nil || e.Base != d.String() {
			t.Fatalf("%s: a seeded upload's export: %+v, %v", l.name, e.Base, err)
		}
		up, err := s.ImportUpload(ctx, f, e)
		if err != nil {
			t.Fatal(err)
		}
		old.Discard()
		tail := randBytes(7000)
		want = append(want, tail...)
		up.WriteAt(tail, int64(len(base)))
		got, pin, err := up.Commit(ctx, nil)
		if err != nil || got != blob.Sum(want) {
			t.Fatalf("%s: the importer of a seeded upload committed %v, %v; want %v", l.name, got, err, blob.Sum(want))
		}
		pin.Release()

		// Seeded, then cut by a truncate below a word of Mat (4 MiB of
		// chunks): what is exported describes the shorter seed.
		big := randBytes(9<<20 + 3)
		d, pin, err = s.PutBytes(ctx, big)
		if err != nil {
			t.Fatal(err)
		}
		old, _ = s.NewUpload(ctx)
		r, _, _ = s.Get(ctx, d)
		if err := old.Seed(ctx, r, pin); err != nil {
			t.Fatal(err)
		}
		old.WriteAt(patch, 5<<20)
		if err := old.Truncate(3<<20 + 11); err != nil {
			t.Fatal(err)
		}
		want = big[:3<<20+11]
		f, e, err = old.Export()
		if err != nil {
			t.Fatalf("%s: a truncated seeded upload's export: %v", l.name, err)
		}
		up, err = s.ImportUpload(ctx, f, e)
		if err != nil {
			t.Fatalf("%s: a truncated seeded upload's import: %v", l.name, err)
		}
		old.Discard()
		got, pin, err = up.Commit(ctx, nil)
		if err != nil || got != blob.Sum(want) {
			t.Fatalf("%s: the importer of a truncated seeded upload committed %v, %v; want %v", l.name, got, err, blob.Sum(want))
		}
		pin.Release()
	}
}

// TestUploadImportOverBudget: content exported from memory and imported
// with the upload memory budget full goes into a stage file of the
// store's (counted as any spilled upload), not on in the memory file,
// whose growth no budget counts; it commits whole.
func TestUploadImportOverBudget(t *testing.T) {
	ctx := t.Context()
	s := openWith(t, store.Config{KV: mem.New(), Large: localLarge(t, t.TempDir()), UploadMemory: threshold})
	data, other := randBytes(threshold/2), randBytes(threshold-100) // the budget, full
	old, _ := s.NewUpload(ctx)
	if _, err := old.WriteAt(data[:100], 0); err != nil {
		t.Fatal(err)
	}
	filler, _ := s.NewUpload(ctx)
	if _, err := filler.WriteAt(other, 0); err != nil {
		t.Fatal(err)
	}
	defer filler.Discard()
	f, e, err := old.Export()
	if err != nil || !e.Mem {
		t.Fatalf("an upload in memory exported %+v, %v; want a memory file", e, err)
	}
	if n := residue(t, s); n != 0 {
		t.Fatalf("%d stage files before the import; want the budget to hold both uploads", n)
	}
	up, err := s.ImportUpload(ctx, f, e)
	if err != nil {
		t.Fatal(err)
	}
	old.Discard()
	if n := residue(t, s); n != 1 {
		t.Fatalf("%d stage files after an import past the memory budget; want 1, its own", n)
	}
	if _, err := up.WriteAt(data[100:], 100); err != nil {
		t.Fatal(err)
	}
	d, pin, err := up.Commit(ctx, nil)
	if err != nil || d != blob.Sum(data) {
		t.Fatalf("the import committed %v, %v; want %v", d, err, blob.Sum(data))
	}
	pin.Release()
}
