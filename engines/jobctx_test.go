package engines

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestJobsUseTheirContext holds the repository to the Batcher's rule on
// contexts (see Batcher.Do) where the compiler cannot: every function
// that is given both a context and a transaction, and uses the
// transaction, uses that context — names it and refers to it — rather
// than one it captured. A Batcher job, an Arbitrate callback and meta's
// writers of a put's rows (NSRows.WriteTx) all have that shape; a job
// that dropped its context
// (func(_ context.Context, tx *sql.Tx)) and ran its statements under the
// caller's let a canceled caller interrupt a statement of a transaction
// other writers' jobs share, and SQLite then rolls all of them back.
func TestJobsUseTheirContext(t *testing.T) {
	root := filepath.Join("..")
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n != ".." && (strings.HasPrefix(n, ".") || n == "testdata" || n == "contrib") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var typ *ast.FuncType
			var body *ast.BlockStmt
			switch fn := n.(type) {
			case *ast.FuncLit:
				typ, body = fn.Type, fn.Body
			case *ast.FuncDecl:
				typ, body = fn.Type, fn.Body
			default:
				return true
			}
			if body == nil {
				return true
			}
			ctxName, txName, ok := jobParams(typ)
			if !ok || txName == "" || txName == "_" || !refers(body, txName) {
				return true
			}
			if ctxName == "" || ctxName == "_" || !refers(body, ctxName) {
				t.Errorf("%s: a function given a context and a transaction uses the transaction without its context: name it and use it", fset.Position(n.Pos()))
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// jobParams finds the names of a context.Context and a *sql.Tx parameter
// of typ ("" when unnamed); ok reports that it has both.
func jobParams(typ *ast.FuncType) (ctx, tx string, ok bool) {
	var hasCtx, hasTx bool
	for _, p := range typ.Params.List {
		name := ""
		if len(p.Names) == 1 {
			name = p.Names[0].Name
		}
		switch {
		case isSel(p.Type, "context", "Context"):
			hasCtx, ctx = true, name
		case isStar(p.Type, "sql", "Tx"):
			hasTx, tx = true, name
		}
	}
	return ctx, tx, hasCtx && hasTx
}

func isSel(e ast.Expr, pkg, name string) bool {
	s, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := s.X.(*ast.Ident)
	return ok && x.Name == pkg && s.Sel.Name == name
}

func isStar(e ast.Expr, pkg, name string) bool {
	s, ok := e.(*ast.StarExpr)
	return ok && isSel(s.X, pkg, name)
}

// refers reports whether an identifier named name appears in body.
func refers(body *ast.BlockStmt, name string) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Name == name {
			found = true
		}
		return !found
	})
	return found
}
