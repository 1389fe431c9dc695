package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/alkblobfs/alkblobfs"

// TestArchitectureImports: every import between this module's packages that
// go list reports is allowed by the table in architecture.md, every package
// has a row, and every row names a package that exists.
func TestArchitectureImports(t *testing.T) {
	doc, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	allowed, err := parseImportTable(doc)
	if err != nil {
		t.Fatalf("architecture.md: %v", err)
	}
	graph := goList(t)
	for _, pkg := range slices.Sorted(maps.Keys(graph)) {
		rule, ok := allowed[pkg]
		if !ok {
			t.Errorf("package %s has no row in architecture.md's import table: add one", pkg)
			continue
		}
		for _, imp := range graph[pkg] {
			if !rule.allows(imp) {
				t.Errorf("%s imports %s, which architecture.md does not allow: fix the import, or the table (and the picture) if the design changed", pkg, imp)
			}
		}
	}
	for _, pkg := range slices.Sorted(maps.Keys(allowed)) {
		if _, ok := graph[pkg]; !ok {
			t.Errorf("architecture.md has a row for %s, which go list does not show: remove it", pkg)
		}
	}
}

// TestParseImportTable: the parser reads the rows it should and refuses
// a table it cannot read, so that a broken table is not an empty one.
func TestParseImportTable(t *testing.T) {
	good := []byte("x\n<!-- imports:begin -->\n| package | may import |\n|---|---|\n| `a` | |\n| `b` | `a` `c/...` |\n<!-- imports:end -->\n")
	got, err := parseImportTable(good)
	if err != nil {
		t.Fatal(err)
	}
	b := got["b"]
	for imp, want := range map[string]bool{"a": true, "c": true, "c/d": true, "cd": false, "d": false} {
		if b.allows(imp) != want {
			t.Errorf("b allows %s = %v, want %v", imp, !want, want)
		}
	}
	if got["a"].allows("b") {
		t.Error("a row with no imports allows one")
	}
	for name, bad := range map[string]string{
		"no markers":    "| `a` | |\n",
		"no end":        "<!-- imports:begin -->\n| package | may import |\n|---|---|\n| `a` | |\n",
		"no rows":       "<!-- imports:begin -->\n| package | may import |\n|---|---|\n<!-- imports:end -->\n",
		"duplicate row": "<!-- imports:begin -->\n| package | may import |\n|---|---|\n| `a` | |\n| `a` | |\n<!-- imports:end -->\n",
		"bare name":     "<!-- imports:begin -->\n| package | may import |\n|---|---|\n| a | |\n<!-- imports:end -->\n",
		"three columns": "<!-- imports:begin -->\n| package | may import |\n|---|---|\n| `a` | `b` | x |\n<!-- imports:end -->\n",
	} {
		if _, err := parseImportTable([]byte(bad)); err == nil {
			t.Errorf("%s: parsed without an error", name)
		}
	}
}

// rule is one row: the packages (relative to the module) a package may
// import, and the prefixes ("engines/..." allows engines and below).
type rule struct {
	exact, trees []string
}

func (r rule) allows(imp string) bool {
	if slices.Contains(r.exact, imp) {
		return true
	}
	for _, t := range r.trees {
		if imp == t || strings.HasPrefix(imp, t+"/") {
			return true
		}
	}
	return false
}

// parseImportTable reads the rows between <!-- imports:begin --> and
// <!-- imports:end -->: | `pkg` | `imp` `imp/...` … |.
func parseImportTable(doc []byte) (map[string]rule, error) {
	_, rest, ok := bytes.Cut(doc, []byte("<!-- imports:begin -->"))
	if !ok {
		return nil, fmt.Errorf("no <!-- imports:begin --> marker")
	}
	table, _, ok := bytes.Cut(rest, []byte("<!-- imports:end -->"))
	if !ok {
		return nil, fmt.Errorf("no <!-- imports:end --> marker")
	}
	rules := map[string]rule{}
	sc := bufio.NewScanner(bytes.NewReader(table))
	header := 0
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if header < 2 { // | package | may import | and |---|---|
			header++
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 2 {
			return nil, fmt.Errorf("row %q: want | `package` | `import` … |", line)
		}
		pkgs, err := names(cells[0])
		if err != nil || len(pkgs) != 1 {
			return nil, fmt.Errorf("row %q: want one `package` in the first column", line)
		}
		pkg := pkgs[0]
		if _, dup := rules[pkg]; dup {
			return nil, fmt.Errorf("two rows for %s", pkg)
		}
		imps, err := names(cells[1])
		if err != nil {
			return nil, fmt.Errorf("row %q: %v", line, err)
		}
		var r rule
		for _, imp := range imps {
			if tree, ok := strings.CutSuffix(imp, "/..."); ok {
				r.trees = append(r.trees, tree)
			} else {
				r.exact = append(r.exact, imp)
			}
		}
		rules[pkg] = r
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("the import table has no rows")
	}
	return rules, nil
}

// names reads a cell of `name` `name` …; an empty cell is no names.
func names(cell string) ([]string, error) {
	var out []string
	for _, f := range strings.Fields(cell) {
		n, ok := strings.CutPrefix(f, "`")
		if n, ok = strings.CutSuffix(n, "`"); !ok || n == "" {
			return nil, fmt.Errorf("%q is not a `package`", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// goList returns each package of the module and the module's packages it
// imports (not in tests), both relative to the module path.
func goList(t *testing.T) map[string][]string {
	t.Helper()
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		if gobin, err = exec.LookPath("go"); err != nil {
			t.Fatalf("no go command to list the packages with: %v", err)
		}
	}
	cmd := exec.Command(gobin, "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...")
	cmd.Dir = ".."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	graph := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		pkg, ok := rel(f[0])
		if !ok {
			t.Fatalf("go list ./... named %s, outside module %s", f[0], module)
		}
		graph[pkg] = nil
		for _, imp := range f[1:] {
			if r, ok := rel(imp); ok {
				graph[pkg] = append(graph[pkg], r)
			}
		}
	}
	if len(graph) == 0 {
		t.Fatal("go list ./... listed no packages")
	}
	return graph
}

func rel(path string) (string, bool) {
	if path == module {
		return ".", true
	}
	return strings.CutPrefix(path, module+"/")
}
