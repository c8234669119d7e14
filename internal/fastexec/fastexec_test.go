//go:build cgo && linux

package fastexec

import (
	"strings"
	"testing"

	"github.com/nsfleet/nsfleet/internal/names"
)

// The C fast path takes its name rule from package names: both must agree
// on every name, or exec would enter a namespace the Go side refuses.
func TestCNameRuleMatchesGo(t *testing.T) {
	for _, n := range []string{"", ".", "..", "...", "a", "bar-17", "a/b", "/", "a\nb", "a b", "a:b",
		strings.Repeat("x", 255), strings.Repeat("x", 256), "é", ".hidden"} {
		if c, g := cValidName(n), names.Namespace(n) == nil; c != g {
			t.Errorf("%q: C says %v, Go says %v", n, c, g)
		}
	}
}

func FuzzCNameRuleMatchesGo(f *testing.F) {
	f.Add("bar-1")
	f.Add("a/b")
	f.Fuzz(func(t *testing.T, n string) {
		if strings.ContainsRune(n, 0) {
			return // a C string ends there; argv cannot hold NUL
		}
		if c, g := cValidName(n), names.Namespace(n) == nil; c != g {
			t.Errorf("%q: C says %v, Go says %v", n, c, g)
		}
	})
}
