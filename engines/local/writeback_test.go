package local

import (
	"bytes"
	"os"
	"sync"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
)

// TestStageStartsWriteback: a stage asks the kernel to write out each
// whole writebackChunk once bytes past it were written, by Write and by
// WriteAt, each range once, so that the fsync at Commit has little left
// to wait for; the blob is still complete and durable after Commit.
func TestStageStartsWriteback(t *testing.T) {
	ctx := t.Context()
	e, err := Open(ctx, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	type span struct{ off, n int64 }
	var mu sync.Mutex
	var got []span
	e.writeback = func(f *os.File, off, n int64) {
		mu.Lock()
		got = append(got, span{off, n})
		mu.Unlock()
		startWriteback(f, off, n)
	}
	const c = writebackChunk
	content := bytes.Repeat([]byte("0123456789abcdef"), (3*c+c/2)/16)

	st, err := e.Stage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Sequential Writes of 1 MiB, then a WriteAt past the third chunk.
	for off := 0; off < 3*c; off += 1 << 20 {
		if _, err := st.Write(content[off : off+1<<20]); err != nil {
			t.Fatal(err)
		}
	}
	want := []span{{0, c}, {c, c}, {2 * c, c}}
	if len(got) != len(want) {
		t.Fatalf("after %d bytes by Write, writeback started for %v; want %v", 3*c, got, want)
	}
	rs := st.(*stage)
	if _, err := rs.WriteAt(content[3*c:], 3*c); err != nil {
		t.Fatal(err)
	}
	// Rewriting below the head starts nothing new.
	if _, err := rs.WriteAt(content[:1<<20], 0); err != nil {
		t.Fatal(err)
	}
	for i, s := range want {
		if got[i] != s {
			t.Fatalf("writeback started for %v; want %v", got, want)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("writeback started for %v; want %v (the last half chunk is left to the fsync)", got, want)
	}
	d := blob.Sum(content)
	if err := st.Commit(ctx, d); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(e.path(d))
	if err != nil || !bytes.Equal(b, content) {
		t.Fatalf("published blob: %d bytes, %v; want the %d bytes written", len(b), err, len(content))
	}
}
