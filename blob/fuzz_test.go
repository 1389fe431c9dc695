package blob_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
)

// FuzzParse: Parse accepts exactly 64 hex digits, round-trips them to the
// lowercase form, and rejects everything else with ErrKeyInvalid;
// IsDigestName accepts exactly the lowercase form.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", "0", strings.Repeat("a", 64), strings.Repeat("A", 64), strings.Repeat("g", 64),
		blob.Sum(nil).String(), strings.ToUpper(blob.Sum([]byte("x")).String()),
		strings.Repeat("0", 63), strings.Repeat("0", 65), "incoming", "\x00\xff",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := blob.Parse(s)
		if err != nil {
			if !errors.Is(err, blob.ErrKeyInvalid) {
				t.Fatalf("Parse(%q): %v, not ErrKeyInvalid", s, err)
			}
			if blob.IsDigestName(s) {
				t.Fatalf("IsDigestName(%q) but Parse fails: %v", s, err)
			}
			return
		}
		if got := d.String(); got != strings.ToLower(s) {
			t.Fatalf("Parse(%q).String() = %q", s, got)
		}
		if blob.IsDigestName(s) != (s == strings.ToLower(s)) {
			t.Fatalf("IsDigestName(%q) = %v", s, blob.IsDigestName(s))
		}
		if d2, err := blob.Parse(d.String()); err != nil || d2 != d {
			t.Fatalf("round trip of %q: %v, %v", s, d2, err)
		}
	})
}
