package fusefs

import (
	"errors"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
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
