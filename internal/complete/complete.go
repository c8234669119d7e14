// Package complete is what the shells' completion (cobra's bash, zsh and
// fish scripts, from `nsfleet completion SHELL`) asks of nsfleet beyond
// subcommand and flag names: spec files for -f, directories for --dir and
// --run-dir, namespace names from a run dir, and, for the commands that
// hand over to nsfleet-cluster, whatever that binary completes.
//
// Completion runs on every TAB, so everything here is cheap: a run dir of
// 40,000 pins is one getdents loop, filtered by prefix, and nothing here
// needs root or talks to the kernel beyond reading a directory.
package complete

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Func is cobra's completion function.
type Func = func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective)

// Files marks the flags of root's whole tree whose values are files or
// directories, by the flag's name: -f/--file a spec (YAML), --dir,
// --run-dir, --bench-run-dir, --profile and -o DIR of plot directories,
// --db, --kernel and --modules what they say.
func Files(root *cobra.Command) {
	walk(root, func(c *cobra.Command) {
		mark := func(fs *pflag.FlagSet) {
			fs.VisitAll(func(f *pflag.Flag) {
				if f.Annotations[cobra.BashCompFilenameExt] != nil || f.Annotations[cobra.BashCompSubdirsInDir] != nil {
					return
				}
				switch f.Name {
				case "file":
					_ = fs.SetAnnotation(f.Name, cobra.BashCompFilenameExt, []string{"yaml", "yml"})
				case "dir", "run-dir", "bench-run-dir", "profile", "modules":
					_ = fs.SetAnnotation(f.Name, cobra.BashCompSubdirsInDir, []string{})
				case "db", "kernel", "binary", "etcd-ca", "etcd-cert", "etcd-key":
					_ = fs.SetAnnotation(f.Name, cobra.BashCompFilenameExt, []string{})
				}
			})
		}
		mark(c.LocalNonPersistentFlags())
		mark(c.PersistentFlags())
	})
}

func walk(c *cobra.Command, fn func(*cobra.Command)) {
	fn(c)
	for _, s := range c.Commands() {
		walk(s, fn)
	}
}

// MaxListed is how many names a completion lists before it groups them:
// past it, a shell spends longer on the list than a person can read (bash
// takes 170 ms for 11,000 names), so the names are cut after the next
// character, as a file system is completed one directory at a time.
const MaxListed = 1000

// Namespaces completes namespace names from the run dir that runDir
// returns (read when the shell asks, so that --run-dir on the same command
// line counts): the pins whose names start with what is typed, sorted, or
// grouped by the next character where there are more than MaxListed.
func Namespaces(runDir func() string) Func {
	return func(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		names := Names(runDir(), toComplete)
		if len(names) <= MaxListed {
			return names, cobra.ShellCompDirectiveNoFileComp
		}
		return Group(names, len(toComplete)), cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
	}
}

// Group cuts sorted names after their first n+1 bytes (one more than is
// typed), keeping each distinct cut once, so that 11,000 names under
// "bar-1" become "bar-1", "bar-10", ..., "bar-19": still a prefix of real
// names each, and few enough to read.
func Group(sorted []string, n int) []string {
	var out []string
	for _, s := range sorted {
		g := s[:min(len(s), n+1)]
		if len(out) == 0 || out[len(out)-1] != g {
			out = append(out, g)
		}
	}
	return out
}

// Names lists the entries of dir whose names start with prefix, sorted;
// nil if dir cannot be read (no run dir yet is nothing to complete).
func Names(dir, prefix string) []string {
	d, err := os.Open(dir)
	if err != nil {
		return nil
	}
	defer d.Close()
	var out []string
	for {
		names, err := d.Readdirnames(4096)
		for _, n := range names {
			if strings.HasPrefix(n, prefix) && !strings.HasPrefix(n, ".") {
				out = append(out, n)
			}
		}
		if err != nil {
			break
		}
	}
	sort.Strings(out)
	return out
}

// Delegate completes a command that hands its arguments over to another
// binary: it runs that binary's own completion (cobra's hidden __complete
// command) with the same words and passes its answer on. bin finds the
// binary; an error, or an answer later than timeout, completes nothing.
func Delegate(bin func() (string, error), words func(args []string) []string, timeout time.Duration) Func {
	return func(_ *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		path, err := bin()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		argv := append([]string{cobra.ShellCompRequestCmd}, words(args)...)
		out, err := exec.CommandContext(ctx, path, append(argv, toComplete)...).Output()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return ParseAnswer(out)
	}
}

// ParseAnswer reads what cobra's __complete prints: one completion a line
// (with an optional tab and description), then ":DIRECTIVE".
func ParseAnswer(out []byte) ([]string, cobra.ShellCompDirective) {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) == 0 || !strings.HasPrefix(lines[len(lines)-1], ":") {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	d, err := strconv.Atoi(lines[len(lines)-1][1:])
	if err != nil || d < 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return lines[:len(lines)-1], cobra.ShellCompDirective(d)
}
