package kprof

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
)

// Session is one --profile DIR of a command: sampling from StartSession,
// ranges cut by Mark, the profiles written into DIR by Finish. A nil
// Session (no --profile) does nothing.
type Session struct {
	dir string
	p   *Profiler
}

// StartSession starts sampling for --profile DIR; "" profiles nothing
// (a nil Session).
func StartSession(dir string) (*Session, error) {
	if dir == "" {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--profile: %w", err)
	}
	p, err := Start(Options{})
	if err != nil {
		return nil, err
	}
	return &Session{dir: dir, p: p}, nil
}

// Mark starts a new range (nil-safe).
func (pr *Session) Mark(label string) {
	if pr != nil {
		pr.p.Mark(label)
	}
}

var unsafeFile = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// Finish stops sampling, writes DIR/profile.pb.gz, DIR/flame.svg and one
// flame graph per range, prints the top kernel functions to w and returns
// the samples (nil-safe: nil, nil).
func (pr *Session) Finish(w io.Writer) (*Result, error) {
	if pr == nil {
		return nil, nil
	}
	r, err := pr.p.Stop()
	if err != nil {
		return nil, err
	}
	return r, pr.write(w, r)
}

func (pr *Session) write(w io.Writer, r *Result) error {
	self := os.Getpid()
	write := func(name string, fn func(io.Writer) error) error {
		f, err := os.Create(filepath.Join(pr.dir, name))
		if err != nil {
			return err
		}
		if err := fn(f); err != nil {
			f.Close()
			return fmt.Errorf("%s: %w", name, err)
		}
		return f.Close()
	}
	if err := write("profile.pb.gz", func(f io.Writer) error { return r.WritePprof(f, self) }); err != nil {
		return err
	}
	if err := write("flame.svg", func(f io.Writer) error { return r.WriteFlame(f, -1, "whole run", self) }); err != nil {
		return err
	}
	for k, rg := range r.Ranges {
		name := fmt.Sprintf("flame-%02d-%s.svg", k, unsafeFile.ReplaceAllString(rg.Label, "_"))
		if err := write(name, func(f io.Writer) error { return r.WriteFlame(f, k, "range "+rg.Label, self) }); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "profile: %d samples, %d ranges; %s (go tool pprof -top %s)\n", len(r.Samples), len(r.Ranges), pr.dir, filepath.Join(pr.dir, "profile.pb.gz"))
	for _, n := range r.Notes {
		fmt.Fprintln(w, "profile: note:", n)
	}
	fmt.Fprintln(w, "profile: top kernel functions (self, share of all samples):")
	for _, s := range r.Top(-1, 8) {
		fmt.Fprintf(w, "  %5.1f%%  %s\n", 100*s.Last, s.Function)
	}
	if len(r.Ranges) > 2 {
		fmt.Fprintf(w, "profile: share growing most from range %q to the last:\n", r.Ranges[0].Label)
		for _, s := range r.Growth(6) {
			fmt.Fprintf(w, "  %5.1f%% -> %5.1f%%  %s\n", 100*s.First, 100*s.Last, s.Function)
		}
	}
	return nil
}
