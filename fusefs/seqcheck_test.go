package fusefs

import (
	"errors"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// TestSeqCheck: reads that cover the blob from 0 to its end, in any order
// within the reorder window, are checked against the digest; a seek
// stops the check.
func TestSeqCheck(t *testing.T) {
	content := randBytes(7, 1<<20)
	good := blob.Sum(content)
	const piece = 128 << 10
	order := []int{0, 2, 1, 3, 5, 4, 7, 6} // readahead arriving out of order
	feed := func(c *seqCheck, data []byte) error {
		var err error
		for _, i := range order {
			if e := c.add(data[i*piece:(i+1)*piece], int64(i*piece)); e != nil {
				err = e
			}
		}
		return err
	}
	if err := feed(newSeqCheck(good, int64(len(content))), content); err != nil {
		t.Fatalf("intact content, out of order: %v", err)
	}
	bad := append([]byte(nil), content...)
	bad[5*piece+3] ^= 1
	c := newSeqCheck(good, int64(len(bad)))
	if err := feed(c, bad); !errors.Is(err, blob.ErrVerification) {
		t.Fatalf("changed content: %v, want ErrVerification", err)
	}
	if err := c.add(bad[:10], 0); !errors.Is(err, blob.ErrVerification) {
		t.Fatalf("a read after the failure: %v, want the failure again", err)
	}

	// A re-read of hashed bytes is fine; a seek backwards into a gap
	// stops the check (the reads stay chunk-verified).
	c = newSeqCheck(good, int64(len(bad)))
	if err := c.add(bad[:piece], 0); err != nil {
		t.Fatal(err)
	}
	if err := c.add(bad[:piece], 0); err != nil {
		t.Fatalf("re-read: %v", err)
	}
	if err := c.add(bad[piece/2:piece*3/2], piece/2); err != nil {
		t.Fatalf("overlapping read: %v", err)
	}
	if c.h != nil {
		t.Fatal("an overlapping read did not stop the check")
	}
	if err := c.add(bad[piece:], piece); err != nil {
		t.Fatalf("a stopped check failed a read: %v", err)
	}

	if err := newSeqCheck(blob.Sum(nil), 0).add(nil, 0); err != nil {
		t.Fatalf("empty blob: %v", err)
	}
}

// TestVerdicts: corrupt verdicts survive any number of good ones, a
// corrupt blob whose file changed is suspect until found good, and a
// good verdict about another version of the file is forgotten.
func TestVerdicts(t *testing.T) {
	var v verdicts
	id := engines.FileID{Dev: 1, Ino: 2, Size: 3}
	other := engines.FileID{Dev: 1, Ino: 2, Size: 3, Ctime: unix.Timespec{Sec: 9}}
	bad := blob.Sum([]byte("bad"))
	v.recordCorrupt(bad, id)
	for i := range 3 * verdictsMax {
		v.recordGood(blob.Sum([]byte(fmt.Sprint(i))), id)
	}
	if s, _ := v.check(bad, id); s != corrupt || v.corrupt() != 1 {
		t.Fatalf("after %d good verdicts the corrupt one is %v (%d refused)", 3*verdictsMax, s, v.corrupt())
	}
	if s, changed := v.check(bad, other); s != suspect || !changed {
		t.Fatalf("corrupt blob whose file changed: %v, changed %v; want suspect", s, changed)
	}
	if s, _ := v.check(bad, id); s != suspect {
		t.Fatalf("a suspect blob is %v until verified, whatever its file", s)
	}
	v.recordGood(bad, other)
	if s, _ := v.check(bad, other); s != good || v.corrupt() != 0 {
		t.Fatalf("after a good verification: %v", s)
	}
	if s, changed := v.check(bad, id); s != unknown || !changed {
		t.Fatalf("good verdict about another version: %v, changed %v", s, changed)
	}
}
