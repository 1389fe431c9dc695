package enginetest

import (
	"testing"

	"github.com/alkblobfs/alkblobfs/engines"
)

// testFileCursor checks that a FileCursor's descriptor reads the blob.
func (s *suite) testFileCursor(t *testing.T) {
	e := s.engine(t)
	v := value(150<<10, 12)
	d := put(t, e, v)
	c, err := e.Open(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer closeCursor(t, c)
	fc, ok := c.(engines.FileCursor)
	if !ok {
		t.Skipf("%s cursors are not engines.FileCursor", e.Name())
	}
	f := fc.File()
	if f == nil || f.Name() == "" {
		t.Fatalf("File() = %v; want a named file", f)
	}
	checkFd(t, f.Fd(), v)
	// The cursor still reads after its descriptor was used directly.
	p := make([]byte, 100)
	if n, err := c.ReadAt(p, 1000); n != 100 || err != nil || string(p) != string(v[1000:1100]) {
		t.Fatalf("ReadAt after fd use = %d, %v", n, err)
	}
}
