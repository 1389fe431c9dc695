package docs

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// The pages a user reads: the README and every page here. Their links must
// lead somewhere, the tests they cite must exist, and nothing may point
// outside the repository.

// pages returns the README and docs/*.md, as paths from this directory.
func pages(t *testing.T) []string {
	t.Helper()
	md, err := filepath.Glob("*.md")
	if err != nil || len(md) == 0 {
		t.Fatalf("no pages in docs/: %v", err)
	}
	return append([]string{"../README.md"}, md...)
}

var (
	// [text](target): inline links. Images and reference links are not
	// used by these pages.
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// A test the prose cites: TestXxx, as the pages write them.
	citedTest = regexp.MustCompile(`\bTest[A-Z][A-Za-z0-9_]*`)
	fenced    = regexp.MustCompile("(?ms)^```.*?^```")
)

// TestDocLinks: every relative link of the README and docs/ names a file of
// the repository, and a #fragment names a heading of that page.
func TestDocLinks(t *testing.T) {
	for _, page := range pages(t) {
		text := read(t, page)
		for _, m := range mdLink.FindAllStringSubmatch(string(fenced.ReplaceAll(text, nil)), -1) {
			if err := checkLink(page, m[1]); err != "" {
				t.Errorf("%s: link %s: %s", page, m[1], err)
			}
		}
	}
}

// checkLink returns what is wrong with target, linked from page, or "".
func checkLink(page, target string) string {
	if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return ""
	}
	file, frag, _ := strings.Cut(target, "#")
	path := page
	if file != "" {
		if filepath.IsAbs(file) {
			return "an absolute path: link within the repository"
		}
		path = filepath.Join(filepath.Dir(page), file)
		root, _ := filepath.Abs("..")
		abs, _ := filepath.Abs(path)
		if rel, err := filepath.Rel(root, abs); err != nil || strings.HasPrefix(rel, "..") {
			return "leads outside the repository"
		}
		if _, err := os.Stat(path); err != nil {
			return "no such file"
		}
	}
	if frag == "" || !strings.HasSuffix(path, ".md") {
		return ""
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if !slices.Contains(anchors(b), frag) {
		return "no heading #" + frag + " in " + path
	}
	return ""
}

// anchors returns the fragments GitHub gives a page's headings: lower
// case, punctuation other than - and _ dropped, spaces as -, and -1, -2, …
// after a repeated one.
func anchors(page []byte) []string {
	var out []string
	seen := map[string]int{}
	for _, l := range strings.Split(string(fenced.ReplaceAll(page, nil)), "\n") {
		if !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out = append(out, a+"-"+strconv.Itoa(n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}

// TestAnchors: the fragments are GitHub's, so that a link the test accepts
// works on the rendered page.
func TestAnchors(t *testing.T) {
	page := []byte("# Non-root mounts: /dev/fuse and user_allow_other\n## A local cache (`--cache` and `--cache-size`)\n## Put by path\n```\n# not a heading\n```\n## Put by path\n")
	want := []string{"non-root-mounts-devfuse-and-user_allow_other", "a-local-cache---cache-and---cache-size", "put-by-path", "put-by-path-1"}
	if got := anchors(page); !slices.Equal(got, want) {
		t.Fatalf("anchors: %q; want %q", got, want)
	}
	for target, bad := range map[string]bool{"troubleshooting.md#a-blob-that-is-eio": false, "troubleshooting.md#no-such": true,
		"nosuch.md": true, "../../outside.md": true, "#the-tree": true, "https://example.com/x": false} {
		if got := checkLink("troubleshooting.md", target) != ""; got != bad {
			t.Errorf("checkLink(%s) found a fault: %v; want %v", target, got, bad)
		}
	}
}

// TestDocsCiteRealTests: every TestXxx the pages name as the test behind
// a sentence is a test function of the repository, so a renamed or
// deleted test cannot leave a promise that only looks tested.
func TestDocsCiteRealTests(t *testing.T) {
	tests := testFuncs(t)
	for _, page := range pages(t) {
		seen := map[string]bool{}
		for _, name := range citedTest.FindAllString(string(read(t, page)), -1) {
			if !tests[name] && !seen[name] {
				t.Errorf("%s cites %s, which no _test.go file of the repository defines", page, name)
			}
			seen[name] = true
		}
	}
}

// testFuncs returns the names of the repository's test functions.
func testFuncs(t *testing.T) map[string]bool {
	t.Helper()
	decl := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]*)\(`)
	out := map[string]bool{}
	err := filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "bin" || strings.HasPrefix(d.Name(), ".")) && p != ".." {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllSubmatch(b, -1) {
			out[string(m[1])] = true
		}
		return nil
	})
	if err != nil || len(out) < 100 {
		t.Fatalf("reading the repository's tests: %d found, %v", len(out), err)
	}
	return out
}

// TestNothingPointsOutside: the pages, and the repository's Go files, name
// no design record outside the repository: a reader has only the
// repository.
func TestNothingPointsOutside(t *testing.T) {
	// Spelled in pieces, so that this file does not itself hold them.
	shared := "sha" + "red"
	outside := [][]byte{[]byte("../" + shared), []byte("/work/" + shared), []byte("DES" + "IGN.md"), []byte("STY" + "LE.md")}
	err := filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "bin" || strings.HasPrefix(d.Name(), ".")) && p != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !(strings.HasSuffix(p, ".go") || strings.HasSuffix(p, ".md") || strings.HasSuffix(p, ".sh") ||
			strings.HasSuffix(p, ".yaml") || d.Name() == "Makefile") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, o := range outside {
			if i := bytes.Index(b, o); i >= 0 {
				t.Errorf("%s:%d names %s, which is not in the repository", p, bytes.Count(b[:i], []byte("\n"))+1, o)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
