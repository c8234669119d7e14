package version

import (
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	i := Info{Version: "v1.2.3", Commit: "0123456789abcdef", Dirty: true, Date: "2026-12-01T10:00:00Z", Go: "go1.26.8", Linking: "static"}
	if got, want := i.String(), "v1.2.3 0123456789ab+dirty (2026-12-01T10:00:00Z, go1.26.8, static)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	// The test binary itself: a version, its Go, and how it is linked.
	g := Get()
	if g.Version == "" || !strings.HasPrefix(g.Go, "go") || (g.Linking != "static" && g.Linking != "dynamic") {
		t.Errorf("Get() = %+v", g)
	}
}
