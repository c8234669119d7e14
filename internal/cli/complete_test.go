package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// completeWords runs cobra's __complete as the shells' scripts do and
// returns the completions and the directive line.
func completeWords(t *testing.T, args ...string) ([]string, string) {
	t.Helper()
	_, out, _ := run(append([]string{"__complete"}, args...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[:len(lines)-1], lines[len(lines)-1]
}

// The shells complete namespace names from the run dir on the command
// line, spec files for -f, scenarios and subcommands; no root needed.
func TestCompletion(t *testing.T) {
	dir := t.TempDir()
	for i := 1; i <= 20; i++ {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("gw-%d", i)), nil, 0o644)
	}
	for _, c := range []struct {
		args      []string
		want      string
		directive string
	}{
		{[]string{"--run-dir", dir, "exec", "gw-1"}, "gw-1 gw-10 gw-11 gw-12 gw-13 gw-14 gw-15 gw-16 gw-17 gw-18 gw-19", ":4"},
		{[]string{"--run-dir", dir, "ls", "--prefix", "gw-2"}, "gw-2 gw-20", ":4"},
		{[]string{"--run-dir", dir, "down", "--prefix", "gw-2"}, "gw-2 gw-20", ":4"},
		{[]string{"--run-dir", dir, "exec", "gw-1", "--", ""}, "", ":0"}, // CMD: the shell's own completion
		{[]string{"up", "-f", ""}, "yaml yml", ":8"},                     // files with these extensions
		{[]string{"bench", "fake"}, "fake-router", ":4"},
		{[]string{"clu"}, "cluster", ":4"},
	} {
		got, directive := completeWords(t, c.args...)
		var names []string
		for _, g := range got {
			names = append(names, strings.SplitN(g, "\t", 2)[0])
		}
		if strings.Join(names, " ") != c.want || directive != c.directive {
			t.Errorf("%q: got %q %s, want %q %s", c.args, names, directive, c.want, c.directive)
		}
	}
}
