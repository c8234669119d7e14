package pkgdoc

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// Limits that keep the code readable: no function over maxFunc lines, no
// file over maxFile (a file that is one cohesive table or list may be
// named in longLists, with why).
const maxFunc, maxFile = 120, 600

var longLists = map[string]string{}

func TestSizeLimits(t *testing.T) {
	root := "../.."
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if n := fset.File(f.Pos()).LineCount(); n > maxFile && longLists[rel] == "" {
			t.Errorf("%s has %d lines (at most %d: split it by concept)", rel, n, maxFile)
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFunc {
				t.Errorf("%s: %s has %d lines (at most %d)", rel, fd.Name.Name, n, maxFunc)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
