//go:build linux

package local_test

import (
	"errors"
	"io"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

type dataSeeker interface {
	SeekData(off int64) (start, end int64, err error)
}

// TestSeekData: a stage and the cursor of its published blob report
// where their data is (SEEK_DATA, SEEK_HOLE): the store hashes and copies
// sparse content without reading its holes.
func TestSeekData(t *testing.T) {
	ctx := t.Context()
	e := open(t, t.TempDir())
	st, err := e.Stage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Discard()
	rs := st.(engines.RandomStage)
	const size = 64 << 20
	data := make([]byte, 8<<10)
	for i := range data {
		data[i] = byte(i) | 1
	}
	if err := rs.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.WriteAt(data, 16<<20); err != nil {
		t.Fatal(err)
	}
	check := func(what string, s dataSeeker) {
		t.Helper()
		start, end, err := s.SeekData(0)
		if err != nil || start > 16<<20 || end < 16<<20+int64(len(data)) || start == 0 && end == size {
			t.Fatalf("%s: SeekData(0) = [%d, %d), %v; want the region around %d", what, start, end, err, 16<<20)
		}
		if _, _, err := s.SeekData(end); !errors.Is(err, io.EOF) {
			t.Fatalf("%s: SeekData past the only data: %v, want io.EOF", what, err)
		}
	}
	check("stage", st.(dataSeeker))
	var d blob.Digest
	d[0] = 1
	if err := st.Commit(ctx, d); err != nil {
		t.Fatal(err)
	}
	c, err := e.Open(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	check("cursor", c.(dataSeeker))
}
