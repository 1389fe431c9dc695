package clitest

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const (
	SmallSize = 1000      // kv tier at the default 128 KiB threshold
	LargeSize = 300 << 10 // large tier
)

type StatJSON struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
	Tier   string `json:"tier"`
}

func (c *CLI) Stat(d string) StatJSON {
	c.T.Helper()
	var s StatJSON
	if err := json.Unmarshal([]byte(c.OK("stat", "--json", d)), &s); err != nil {
		c.T.Fatal(err)
	}
	return s
}

// RoundTrip puts a small and a large blob and reads them back every way.
// kvPersists is false for a mem: kv tier, which is gone once put exits.
func RoundTrip(t *testing.T, c *CLI, kvPersists bool) {
	dir := t.TempDir()
	smallPath, small, smallD := WriteFile(t, dir, SmallSize, 1)
	largePath, large, largeD := WriteFile(t, dir, LargeSize, 2)

	if got := Lines(c.OK("put", smallPath, largePath)); !slices.Equal(got, []string{smallD, largeD}) {
		t.Fatalf("put printed %q, want %q", got, []string{smallD, largeD})
	}
	// A re-put dedups and prints the same digest.
	if got := strings.TrimSpace(c.OK("put", largePath)); got != largeD {
		t.Fatalf("re-put printed %q, want %s", got, largeD)
	}

	want := map[string][]byte{largeD: large}
	if kvPersists {
		want[smallD] = small
	} else {
		c.Fail(1, "blob missing", "stat", smallD)
	}
	for d, content := range want {
		s := c.Stat(d)
		wantTier := "large"
		if len(content) == SmallSize {
			wantTier = "kv"
		}
		if s.Digest != d || s.Size != int64(len(content)) || s.Tier != wantTier {
			t.Errorf("stat %s = %+v, want size %d tier %s", d, s, len(content), wantTier)
		}
		human := c.OK("stat", d)
		if !strings.Contains(human, "tier    "+wantTier) {
			t.Errorf("stat %s printed %q", d, human)
		}
		if got := c.OK("cat", d); got != string(content) {
			t.Errorf("cat %s: %d bytes differ from the %d put", d, len(got), len(content))
		}
		if got := c.OK("get", d); got != string(content) {
			t.Errorf("get %s to stdout: wrong content", d)
		}
		out := filepath.Join(dir, "out-"+d[:8])
		if got := c.OK("get", d, "-o", out); got != "" {
			t.Errorf("get -o printed %q on stdout", got)
		}
		if b, err := os.ReadFile(out); err != nil || !bytes.Equal(b, content) {
			t.Errorf("get -o %s: wrong content (err %v)", d, err)
		}
	}

	listed := Lines(c.OK("ls"))
	wantList := slices.Sorted(func(yield func(string) bool) {
		for d := range want {
			if !yield(d) {
				return
			}
		}
	})
	if !slices.Equal(listed, wantList) {
		t.Fatalf("ls = %q, want %q", listed, wantList)
	}
	if got := c.OK("ls", "-l"); !strings.Contains(got, largeD+" 307200\n") {
		t.Errorf("ls -l = %q", got)
	}

	rm := []string{"rm"}
	if !kvPersists {
		// No namespaces, so nothing can prove the blob unreferenced: rm
		// refuses unless forced.
		c.Fail(1, "no liveness source", "rm", largeD)
		rm = append(rm, "--force")
	}
	c.OK(append(rm, largeD)...)
	c.Fail(1, "blob missing", append(rm, largeD)...)
	c.Fail(1, "blob missing", "get", largeD, "-o", filepath.Join(dir, "gone"))
	if _, err := os.Stat(filepath.Join(dir, "gone")); !os.IsNotExist(err) {
		t.Errorf("get -o of a missing blob left a file: %v", err)
	}
	if kvPersists {
		if got := Lines(c.OK("ls")); !slices.Equal(got, []string{smallD}) {
			t.Fatalf("ls after rm = %q, want [%s]", got, smallD)
		}
	}
}
