package docs

import (
	"go/ast"
	"go/token"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// TestNoTxInExportedSignatures: outside package meta, no exported
// function, method, type or field of a non-test file names *sql.Tx —
// neither as a parameter nor inside a callback's type — but for the
// ones txStill lists (issue 36, stage 2: "Rows, not transactions"). A
// close hands meta the rows it commits as a value; only the engines,
// which open the transaction of a blob's row, and meta, which writes
// the shared rows in it, see a transaction.
func TestNoTxInExportedSignatures(t *testing.T) {
	found := txSignatures(t, "..")
	for _, name := range found {
		if _, ok := txStill[name]; !ok {
			t.Errorf("%s has *sql.Tx in an exported signature: hand meta a value instead (docs/architecture.md, \"How one close commits\")", name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(txStill)) {
		if !slices.Contains(found, name) {
			t.Errorf("%s no longer has *sql.Tx in an exported signature: remove it from txStill", name)
		}
	}
}

// txStill are the exported names outside meta that still take or hand
// out a *sql.Tx, each until the step of issue 36, stage 2 that removes
// it (docs/architecture.md, "How one close commits"). The list only
// shrinks.
var txStill = map[string]string{
	// A delete's arbitration: the collector reads the liveness sources
	// and deletes the kv rows in meta's transaction (a later step: one
	// operation of meta).
	"engines.TxDeleter":                    "DeleteManyTx",
	"engines/sqlite.Engine.DeleteManyTx":   "engines.TxDeleter",
	"engines/postgres.Engine.DeleteManyTx": "engines.TxDeleter",
	"gc.TxPool":                            "the store's pool as an engines.TxDeleter",
	"gc.TxSource":                          "LiveAmongTx",
	"gc.Table.LiveAmongTx":                 "gc.TxSource",
	"gc.AloneHost":                         "meta.SQLite.ArbitrateAlone",
	"namespaces.SQL.LiveAmongTx":           "gc.TxSource",
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
