package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
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

// TestSharedStateTables: only package meta (meta/...) names the tables of
// the pool's shared state in SQL: no non-test .go file elsewhere has a
// string literal that names gc_pins, gc_window, gc_clock, gc_corrupt,
// journal_marks,
// ns_refs, ns_pending or ns (after FROM, INTO, UPDATE, JOIN or TABLE)
// beside an SQL keyword. Statements of those tables belong in meta, which
// other packages call (or, for a statement that must carry meta's rows,
// embed meta's exported fragment). A literal that only names one, with no
// SQL in it (a configuration key such as "gc_window"), is no statement.
func TestSharedStateTables(t *testing.T) {
	for _, f := range sharedStateSQL(t, "..") {
		t.Errorf("%s names a table of package meta in SQL: %s; move the statement into meta (docs/architecture.md, \"How one close commits\")", f.pos, f.lit)
	}
}

// TestSharedStateTablesFails: the check finds a statement of a shared
// table written outside meta, and leaves alone what it should.
func TestSharedStateTablesFails(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("engines/x/x.go", "package x\n\nconst q = `DELETE FROM gc_pins WHERE owner = ?`\n")
	write("gc/y.go", "package gc\n\nvar q = \"SELECT count(*) FROM gc_corrupt\"\n")
	write("meta/m.go", "package meta\n\nconst q = `SELECT digest FROM gc_window`\n")
	write("engines/x/x_test.go", "package x\n\nconst q = `UPDATE gc_clock SET seen = 1`\n")
	write("cmd/c.go", "package main\n\nvar keys = map[string]string{\"gc_window\": \"--gc-window\"}\nconst other = `SELECT 1 FROM gc_windows_of_mine`\n")
	write("fusefs/f.go", "package fusefs\n\nconst q = `SELECT 1 FROM ns_refs_backup WHERE x = 1`\nconst msg = \"took 5 ns from the queue\"\nconst ns = \"select the ns field\"\nconst help = \"store it, link it into NS\"\n")
	write("ops/o.go", "package ops\n\nconst q = `SELECT name FROM ns WHERE name = ?`\n")
	write("store/s.go", "package store\n\nconst q = `DELETE FROM ns_pending WHERE id = ?`\n")
	got := sharedStateSQL(t, dir)
	var files []string
	for _, f := range got {
		files = append(files, strings.SplitN(f.pos, ":", 2)[0])
	}
	want := []string{"engines/x/x.go", "gc/y.go", "ops/o.go", "store/s.go"}
	if !slices.Equal(files, want) {
		t.Fatalf("found SQL of the shared tables in %v; want %v", files, want)
	}
}

// sharedTable names a table of the shared state as an SQL word: the GC's,
// the namespaces' links and intents, and their names' table ns where a
// statement reads or writes it.
var sharedTable = regexp.MustCompile(`\bgc_(pins|window|clock|corrupt)\b|\bns_(refs|pending)\b|\bjournal_marks\b|\b(?i:from|into|update|join|table)\s+ns\b`)

// sqlWord is what makes a literal SQL rather than a name.
var sqlWord = regexp.MustCompile(`(?i)\b(select|insert|update|delete|create|drop|alter|from|into|where|join|table|index)\b`)

type finding struct{ pos, lit string }

// sharedStateSQL returns the string literals of the non-test .go files
// under root, outside meta/ (and testdata, hidden directories), that name
// a shared table in SQL, in file order.
func sharedStateSQL(t *testing.T, root string) []finding {
	t.Helper()
	var out []finding
	eachSource(t, root, func(rel string, fset *token.FileSet, f *ast.File) {
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			v, err := strconv.Unquote(lit.Value)
			if err != nil {
				v = lit.Value
			}
			if sharedTable.MatchString(v) && sqlWord.MatchString(v) {
				p := fset.Position(lit.Pos())
				out = append(out, finding{pos: fmt.Sprintf("%s:%d", rel, p.Line), lit: strings.Join(strings.Fields(v), " ")})
			}
			return true
		})
	})
	return out
}

// eachSource parses each non-test .go file under root, in file order,
// outside meta/ (the owner of the shared state), third_party/, testdata
// and hidden directories, and calls fn with its path relative to root
// (slash-separated).
func eachSource(t *testing.T, root string, fn func(rel string, fset *token.FileSet, f *ast.File)) {
	t.Helper()
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "meta" || rel == "third_party" || d.Name() == "testdata" || (rel != "." && strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		fn(rel, fset, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
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
