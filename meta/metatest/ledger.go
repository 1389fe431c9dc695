package metatest

import (
	"bytes"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Ledger checks the meta.Ledger contract on the ledger of the engines
// share opens: a mark is read
// back as written, replaced by a later one, cleared only while it still
// names the file it was cleared for, listed in digest order, and seen by a
// second engine over the same storage (another process). share opens the
// same storage on every call; an engine whose ledger lives in the process
// (mem) returns the same engine each time. The suite closes what share
// returns.
func Ledger(t *testing.T, share func(t *testing.T) engines.Engine) {
	ledger := func(t *testing.T) meta.Ledger {
		t.Helper()
		e := share(t)
		t.Cleanup(func() { e.Close() })
		l := state(t, e).Ledger
		if l == nil {
			t.Fatalf("%s keeps no meta.Ledger", e.Name())
		}
		// Subtests share the storage: start each from no marks.
		ms, err := l.CorruptMarks(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if _, err := l.ClearCorrupt(t.Context(), m.Digest, m.File); err != nil {
				t.Fatal(err)
			}
		}
		return l
	}
	t.Run("Marks", func(t *testing.T) { testCorruptMarks(t, ledger(t)) })
	t.Run("Shared", func(t *testing.T) { testCorruptShared(t, ledger(t), ledger(t)) })
}

func mark(t *testing.T, l meta.Ledger, d blob.Digest) (meta.Mark, bool) {
	t.Helper()
	m, ok, err := l.CorruptMark(t.Context(), d)
	if err != nil {
		t.Fatalf("CorruptMark %s: %v", d.Short(), err)
	}
	return m, ok
}

func testCorruptMarks(t *testing.T, l meta.Ledger) {
	ctx := t.Context()
	a, b, c := blob.Sum([]byte("a")), blob.Sum([]byte("b")), blob.Sum([]byte("c"))
	if _, ok := mark(t, l, a); ok {
		t.Fatal("a digest never marked has a mark")
	}
	fileA := []byte{1, 2, 3, 4}
	if err := l.MarkCorrupt(ctx, a, fileA, "chunk 3 fails its checksum"); err != nil {
		t.Fatal(err)
	}
	// An empty identity (a blob that is no file) is a value, not "any".
	if err := l.MarkCorrupt(ctx, b, nil, "hashes to something else"); err != nil {
		t.Fatal(err)
	}
	m, ok := mark(t, l, a)
	if !ok || m.Digest != a || !bytes.Equal(m.File, fileA) || m.Reason != "chunk 3 fails its checksum" || m.Marked.IsZero() {
		t.Fatalf("mark of a = %+v, %v; want what was written, with a time", m, ok)
	}
	if m, ok := mark(t, l, b); !ok || len(m.File) != 0 {
		t.Fatalf("mark of b = %+v, %v; want an empty file identity", m, ok)
	}
	// A later mark replaces the earlier one.
	fileA2 := []byte{5, 6}
	if err := l.MarkCorrupt(ctx, a, fileA2, "again"); err != nil {
		t.Fatal(err)
	}
	if m, _ := mark(t, l, a); !bytes.Equal(m.File, fileA2) || m.Reason != "again" {
		t.Fatalf("after a second mark: %+v; want the second", m)
	}
	// A clear for another version of the file leaves the mark.
	if ok, err := l.ClearCorrupt(ctx, a, fileA); ok || err != nil {
		t.Fatalf("ClearCorrupt with a stale identity = %v, %v; want false, nil", ok, err)
	}
	if _, ok := mark(t, l, a); !ok {
		t.Fatal("a clear for a stale file identity removed the mark")
	}
	if ok, err := l.ClearCorrupt(ctx, c, nil); ok || err != nil {
		t.Fatalf("ClearCorrupt of a digest without a mark = %v, %v; want false, nil", ok, err)
	}
	if err := l.MarkCorrupt(ctx, c, []byte{9}, "c"); err != nil {
		t.Fatal(err)
	}
	ms, err := l.CorruptMarks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []blob.Digest{a, b, c}
	sortDigests(want)
	if len(ms) != 3 || ms[0].Digest != want[0] || ms[1].Digest != want[1] || ms[2].Digest != want[2] {
		t.Fatalf("CorruptMarks = %v; want a, b and c in digest order", ms)
	}
	for _, m := range ms {
		if m.Digest == a && !bytes.Equal(m.File, fileA2) {
			t.Fatalf("listed mark of a: %+v", m)
		}
	}
	if ok, err := l.ClearCorrupt(ctx, a, fileA2); !ok || err != nil {
		t.Fatalf("ClearCorrupt with the current identity = %v, %v; want true, nil", ok, err)
	}
	if ok, err := l.ClearCorrupt(ctx, b, []byte{}); !ok || err != nil {
		t.Fatalf("ClearCorrupt of an empty identity = %v, %v; want true, nil", ok, err)
	}
	if _, ok := mark(t, l, a); ok {
		t.Fatal("a cleared mark is still there")
	}
	if ms, err := l.CorruptMarks(ctx); err != nil || len(ms) != 1 || ms[0].Digest != c {
		t.Fatalf("CorruptMarks after the clears = %v, %v; want c alone", ms, err)
	}
}

func testCorruptShared(t *testing.T, one, two meta.Ledger) {
	ctx := t.Context()
	d := blob.Sum([]byte("shared"))
	if err := one.MarkCorrupt(ctx, d, []byte{7}, "found by one"); err != nil {
		t.Fatal(err)
	}
	if m, ok := mark(t, two, d); !ok || m.Reason != "found by one" {
		t.Fatalf("the other engine reads %+v, %v; want the mark one wrote", m, ok)
	}
	if ok, err := two.ClearCorrupt(ctx, d, []byte{7}); !ok || err != nil {
		t.Fatalf("ClearCorrupt by the other engine = %v, %v", ok, err)
	}
	if _, ok := mark(t, one, d); ok {
		t.Fatal("a mark the other engine cleared is still read")
	}
}
