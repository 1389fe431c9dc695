package namespaces_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/namespaces"
)

// FuzzValidName: the registry accepts exactly the names ValidName accepts
// (1–255 bytes of [A-Za-z0-9._-], not starting with '.'), and a refused
// name changes nothing.
func FuzzValidName(f *testing.F) {
	for _, s := range []string{"", ".", "..", ".alkblobfs", "a", "A-b_c.d", "incoming", "a/b", "a b", "é", "\x00",
		strings.Repeat("x", 255), strings.Repeat("x", 256), "-", "_", "9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := namespaces.ValidName(name)
		want := name != "" && len(name) <= 255 && name[0] != '.' &&
			strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == ""
		if (err == nil) != want {
			t.Fatalf("ValidName(%q) = %v, want valid=%v", name, err, want)
		}
		if err != nil && !errors.Is(err, namespaces.ErrBadName) {
			t.Fatalf("ValidName(%q): %v, not ErrBadName", name, err)
		}
		r := namespaces.NewMem(nil)
		cerr := r.Create(t.Context(), name)
		if (cerr == nil) != want {
			t.Fatalf("Create(%q) = %v, want ok=%v", name, cerr, want)
		}
		n := 0
		for _, err := range r.Names(t.Context(), "") {
			if err != nil {
				t.Fatal(err)
			}
			n++
		}
		if want && n != 1 || !want && n != 0 {
			t.Fatalf("after Create(%q) (%v): %d namespaces", name, cerr, n)
		}
	})
}
