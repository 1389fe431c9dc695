package ops

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"testing"
)

// TestTokenLookupConstantTime holds Tokens.lookup to the shape that makes
// docs/security.md's "compares tokens in constant time" true, since no
// timing measurement on a loaded machine could: the presented token is
// read once, hashed (sha256), and its digest is compared with every
// entry's by crypto/subtle alone. A plain comparison (==, bytes.Equal, a
// switch, a map of the tokens themselves) or a loop that stops at the
// match fails it.
func TestTokenLookupConstantTime(t *testing.T) {
	fset := gotoken.NewFileSet()
	f, err := parser.ParseFile(fset, "auth.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var fn *ast.FuncDecl
	for _, d := range f.Decls {
		if d, ok := d.(*ast.FuncDecl); ok && d.Name.Name == "lookup" && d.Recv != nil {
			fn = d
		}
	}
	if fn == nil || len(fn.Type.Params.List) != 1 || len(fn.Type.Params.List[0].Names) != 1 {
		t.Fatal("auth.go has no method lookup(tok string)")
	}
	tok := fn.Type.Params.List[0].Names[0].Name
	at := func(n ast.Node) string { return fset.Position(n.Pos()).String() }
	// name is a call's function as written: "sha256.Sum256", "t.fileEntries".
	name := func(c *ast.CallExpr) string {
		switch f := c.Fun.(type) {
		case *ast.Ident:
			return f.Name
		case *ast.SelectorExpr:
			if x, ok := f.X.(*ast.Ident); ok {
				return x.Name + "." + f.Sel.Name
			}
		case *ast.ArrayType:
			return "[]byte" // a conversion
		}
		return "?"
	}
	recv := fn.Recv.List[0].Names[0].Name
	allowed := map[string]bool{
		"sha256.Sum256": true, "subtle.ConstantTimeCompare": true, "[]byte": true,
		recv + ".fileEntries": true,
	}
	uses, hashed := 0, false
	var walk func(n ast.Node, inLoop bool)
	walk = func(n ast.Node, inLoop bool) {
		ast.Inspect(n, func(m ast.Node) bool {
			switch m := m.(type) {
			case *ast.RangeStmt, *ast.ForStmt:
				if m != n {
					walk(m, true)
					return false
				}
			case *ast.Ident:
				if m.Name == tok {
					uses++
				}
			case *ast.CallExpr:
				if !allowed[name(m)] {
					t.Errorf("%s: lookup calls %s: only sha256.Sum256 and subtle.ConstantTimeCompare may touch the token and the digests", at(m), name(m))
				}
				if name(m) == "sha256.Sum256" && len(m.Args) == 1 {
					if conv, ok := m.Args[0].(*ast.CallExpr); ok && name(conv) == "[]byte" && len(conv.Args) == 1 {
						if id, ok := conv.Args[0].(*ast.Ident); ok && id.Name == tok {
							hashed = true
						}
					}
				}
			case *ast.BinaryExpr:
				if m.Op == gotoken.EQL || m.Op == gotoken.NEQ {
					for _, x := range []ast.Expr{m.X, m.Y} {
						if !constantTimeOperand(x) {
							t.Errorf("%s: lookup compares %s with %s: a plain comparison stops at the first byte that differs", at(m), m.Op, exprString(x))
						}
					}
				}
			case *ast.SwitchStmt, *ast.TypeSwitchStmt:
				t.Errorf("%s: lookup switches: a switch on a token or digest is a plain comparison", at(m))
			case *ast.IndexExpr:
				if !isIdent(m.Index, "") {
					t.Errorf("%s: lookup indexes by %s: a map of tokens compares them plainly", at(m), exprString(m.Index))
				}
			case *ast.BranchStmt, *ast.ReturnStmt:
				if inLoop {
					t.Errorf("%s: lookup leaves its loop early: the time taken would say which entry matched", at(m))
				}
			}
			return true
		})
	}
	walk(fn.Body, false)
	if !hashed || uses != 1 {
		t.Errorf("lookup uses its token %d times and hashed=%v: it must read it once, as sha256.Sum256([]byte(%s))", uses, hashed, tok)
	}
}

// constantTimeOperand: an operand of == or != in lookup may be a literal,
// a subtle.ConstantTimeCompare result, or a plain counter (an identifier
// compared with a literal).
func constantTimeOperand(x ast.Expr) bool {
	switch x := x.(type) {
	case *ast.BasicLit:
		return true
	case *ast.Ident:
		return x.Name == "ok"
	case *ast.CallExpr:
		s, ok := x.Fun.(*ast.SelectorExpr)
		return ok && isIdent(s.X, "subtle") && s.Sel.Name == "ConstantTimeCompare"
	}
	return false
}

// isIdent: x is identifier name, or any identifier for "".
func isIdent(x ast.Expr, name string) bool {
	id, ok := x.(*ast.Ident)
	return ok && (name == "" || id.Name == name)
}

func exprString(n ast.Node) string {
	switch n := n.(type) {
	case *ast.Ident:
		return n.Name
	case *ast.SelectorExpr:
		return exprString(n.X) + "." + n.Sel.Name
	case *ast.IndexExpr:
		return exprString(n.X) + "[" + exprString(n.Index) + "]"
	case *ast.CallExpr:
		return exprString(n.Fun) + "(…)"
	}
	return "an expression"
}
