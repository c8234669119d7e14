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
		{[]string{"ben"}, "bench", ":4"},                                 // handed over to nsfleet-lab, which completes the rest
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

// bench, agent, cluster and sim hand over to their companion binary: it
// runs in nsfleet's place with the command's words, global flags typed
// before them included; without it, the error says how to build it.
func TestHandOver(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "companion")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho \"$0 $*\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env  string
		args []string
		want string
	}{
		{"NSFLEET_LAB_BINARY", []string{"-w", "3", "bench", "fake-router", "-n", "10"}, fake + " bench -w 3 fake-router -n 10"},
		{"NSFLEET_LAB_BINARY", []string{"-v", "bench", "list"}, fake + " bench -v list"},
		{"NSFLEET_CLUSTER_BINARY", []string{"cluster", "status", "-o", "json"}, fake + " cluster status -o json"},
	} {
		cmd := child(c.args...)
		cmd.Env = append(cmd.Env, c.env+"="+fake)
		out, err := cmd.Output()
		if got := strings.TrimSpace(string(out)); err != nil || got != c.want {
			t.Errorf("%q: %q (%v), want %q", c.args, got, err, c.want)
		}
	}
	cmd := child("bench", "list")
	cmd.Env = append(cmd.Env, "PATH="+dir, "NSFLEET_LAB_BINARY=") // not beside the test binary either
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "nsfleet-lab") || !strings.Contains(string(out), "go build") {
		t.Errorf("no lab binary: %v, %s", err, out)
	}
}
