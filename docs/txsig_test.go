package docs

import (
	"go/ast"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// TestNoTxInExportedSignatures: outside package meta, no exported
// function, method, type or field of a non-test file names *sql.Tx —
// neither as a parameter nor inside a callback's type (issue 36: "Rows,
// not transactions"). A close hands meta the rows it commits as a value,
// a delete's arbitration is one operation of meta, and SQLite's writer,
// whose jobs are transactions, is meta's: only meta, the owner of the
// shared state, hands out a transaction, and an engine sees one only as
// the job it gave meta's writer.
func TestNoTxInExportedSignatures(t *testing.T) {
	for _, name := range txSignatures(t, "..") {
		t.Errorf("%s has *sql.Tx in an exported signature: hand meta a value instead (docs/architecture.md, \"How one close commits\")", name)
	}
}

// txSignatures returns, in file order, the exported declarations of the
// non-test .go files under root, outside meta/ (and testdata, hidden
// directories, third_party), whose signature or type names *sql.Tx:
// "pkg.Func", "pkg.Type", "pkg.Type.Method", with pkg the directory.
func txSignatures(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	eachSource(t, root, func(rel string, _ *token.FileSet, f *ast.File) {
		sqlName := ""
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == "database/sql" {
				sqlName = "sql"
				if imp.Name != nil {
					sqlName = imp.Name.Name
				}
			}
		}
		if sqlName == "" || f.Name.Name == "main" {
			return
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if !decl.Name.IsExported() || !namesTx(decl.Type, sqlName) {
					continue
				}
				name := pkg + "." + decl.Name.Name
				if decl.Recv != nil {
					recv := receiverName(decl.Recv.List[0].Type)
					if !ast.IsExported(recv) {
						continue
					}
					name = pkg + "." + recv + "." + decl.Name.Name
				}
				out = append(out, name)
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					ts, ok := spec.(*ast.TypeSpec)
					if ok && ts.Name.IsExported() && namesTx(exportedPart(ts.Type), sqlName) {
						out = append(out, pkg+"."+ts.Name.Name)
					}
				}
			}
		}
	})
	return out
}

// exportedPart is what of a type declaration other packages see: a
// struct's exported fields, an interface's exported methods, else all of
// it.
func exportedPart(typ ast.Expr) ast.Node {
	var fields *ast.FieldList
	switch typ := typ.(type) {
	case *ast.StructType:
		fields = typ.Fields
	case *ast.InterfaceType:
		fields = typ.Methods
	default:
		return typ
	}
	kept := &ast.FieldList{}
	for _, f := range fields.List {
		if len(f.Names) == 0 || slices.ContainsFunc(f.Names, func(n *ast.Ident) bool { return n.IsExported() }) {
			kept.List = append(kept.List, f)
		}
	}
	return kept
}

// namesTx reports whether n mentions *sql.Tx (sqlName: the file's name
// for database/sql).
func namesTx(n ast.Node, sqlName string) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		star, ok := n.(*ast.StarExpr)
		if !ok {
			return !found
		}
		if sel, ok := star.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "Tx" {
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == sqlName {
				found = true
			}
		}
		return !found
	})
	return found
}

// receiverName is the type name of a method's receiver.
func receiverName(typ ast.Expr) string {
	for {
		switch t := typ.(type) {
		case *ast.StarExpr:
			typ = t.X
		case *ast.IndexExpr:
			typ = t.X
		case *ast.IndexListExpr:
			typ = t.X
		case *ast.Ident:
			return t.Name
		default:
			return ""
		}
	}
}

// TestTxSignaturesFinds: the check sees a *sql.Tx wherever an exported
// signature can carry one — a parameter, a callback's parameter, a
// method's, an exported field, under another name for database/sql — and
// not in meta, unexported names or tests.
func TestTxSignaturesFinds(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"store/a.go": `package store
import "database/sql"
func Put(tx *sql.Tx) {}
func With(fn func(*sql.Tx) error) {}
func unexported(tx *sql.Tx) {}
type Pool struct{}
func (Pool) Delete(tx *sql.Tx) {}
func (Pool) hidden(tx *sql.Tx) {}
type Job struct{ Tx *sql.Tx; tx *sql.Tx }
type job struct{ Tx *sql.Tx }
`,
		"gc/b.go": `package gc
import dbsql "database/sql"
type Runner interface{ Run(func(*dbsql.Tx)) }
`,
		"meta/c.go":       "package meta\nimport \"database/sql\"\nfunc Own(tx *sql.Tx) {}\n",
		"store/a_test.go": "package store\nimport \"database/sql\"\nfunc InTest(tx *sql.Tx) {}\n",
	}
	for name, src := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := txSignatures(t, root)
	slices.Sort(got)
	want := []string{"gc.Runner", "store.Job", "store.Pool.Delete", "store.Put", "store.With"}
	if !slices.Equal(got, want) {
		t.Errorf("txSignatures = %q, want %q", got, want)
	}
}
