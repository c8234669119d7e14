package complete

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

func TestNamesAndGroup(t *testing.T) {
	dir := t.TempDir()
	for i := 1; i <= 3000; i++ {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("bar-%d", i)), nil, 0o644)
	}
	os.WriteFile(filepath.Join(dir, ".lock"), nil, 0o644)
	if got := Names(dir, "bar-119"); !slices.Equal(got, []string{"bar-119", "bar-1190", "bar-1191", "bar-1192", "bar-1193", "bar-1194", "bar-1195", "bar-1196", "bar-1197", "bar-1198", "bar-1199"}) {
		t.Errorf("Names(bar-119) = %v", got)
	}
	if got := Names(dir, ""); len(got) != 3000 {
		t.Errorf("Names() has %d, want 3000 (no dot files)", len(got))
	}
	if got := Names(filepath.Join(dir, "none"), ""); got != nil {
		t.Errorf("a missing run dir completes %v", got)
	}
	// Over MaxListed: grouped by the next character, each group a prefix
	// of real names, the exact name kept.
	got, d := Namespaces(func() string { return dir })(nil, nil, "bar-1")
	want := []string{"bar-1", "bar-10", "bar-11", "bar-12", "bar-13", "bar-14", "bar-15", "bar-16", "bar-17", "bar-18", "bar-19"}
	if !slices.Equal(got, want) || d&cobra.ShellCompDirectiveNoSpace == 0 {
		t.Errorf("grouped: %v (directive %d), want %v with no space", got, d, want)
	}
	got, d = Namespaces(func() string { return dir })(nil, nil, "bar-11")
	if len(got) != 111 || d&cobra.ShellCompDirectiveNoSpace != 0 {
		t.Errorf("under MaxListed: %d names, directive %d", len(got), d)
	}
}

func TestParseAnswer(t *testing.T) {
	got, d := ParseAnswer([]byte("node-1\nnode-2\tlive\n:4\n"))
	if !slices.Equal(got, []string{"node-1", "node-2\tlive"}) || d != cobra.ShellCompDirectiveNoFileComp {
		t.Errorf("got %q %d", got, d)
	}
	for _, bad := range []string{"", "node-1\n", "x\n:-1\n", "x\n:abc\n"} {
		if got, d := ParseAnswer([]byte(bad)); got != nil || d != cobra.ShellCompDirectiveNoFileComp {
			t.Errorf("%q: got %q %d, want nothing", bad, got, d)
		}
	}
}

func TestDelegate(t *testing.T) {
	sh := filepath.Join(t.TempDir(), "companion")
	os.WriteFile(sh, []byte("#!/bin/sh\nfor a; do echo \"$a\"; done\necho :4\n"), 0o755)
	f := Delegate(func() (string, error) { return sh, nil }, func(args []string) []string { return append([]string{"cluster"}, args...) }, time.Second)
	got, d := f(nil, []string{"drain"}, "no")
	if !slices.Equal(got, []string{"__complete", "cluster", "drain", "no"}) || d != cobra.ShellCompDirectiveNoFileComp {
		t.Errorf("delegate passed %q (%d)", got, d)
	}
	slow := filepath.Join(t.TempDir(), "slow")
	os.WriteFile(slow, []byte("#!/bin/sh\nexec sleep 5\n"), 0o755)
	start := time.Now()
	if got, _ := Delegate(func() (string, error) { return slow, nil }, func(a []string) []string { return a }, 100*time.Millisecond)(nil, nil, ""); got != nil || time.Since(start) > 2*time.Second {
		t.Errorf("a slow companion: %q after %s", got, time.Since(start))
	}
}

func FuzzParseAnswer(f *testing.F) {
	f.Add([]byte("a\nb\tdesc\n:4\n"))
	f.Add([]byte(":0"))
	f.Add([]byte("\n\n:99999999999999999999\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, d := ParseAnswer(b)
		if d < 0 {
			t.Fatalf("negative directive %d", d)
		}
		for _, g := range got {
			if len(g) > len(b) {
				t.Fatalf("completion %q longer than the answer", g)
			}
		}
	})
}
