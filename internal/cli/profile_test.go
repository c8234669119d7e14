package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/nsfleet/nsfleet/internal/nstest"
)

// TestUpProfile profiles a small up and down and reads the profiles back
// with pprof's reader: one range per mark and per phase, nsfleet's own
// creation steps and the kernel's functions in the stacks.
func TestUpProfile(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	spec := writeSpec(t, p, 300)
	dir := t.TempDir()
	code, out, errs := run("--run-dir", rd.Path, "up", "-f", spec, "--progress", "none", "--profile", filepath.Join(dir, "up"))
	if code != 0 {
		t.Fatalf("up --profile: %s%s", out, errs)
	}
	if strings.Contains(errs, "perf events unavailable") || strings.Contains(errs, "needs root or kernel.perf_event_paranoid") {
		t.Skip("perf events unavailable here:", errs)
	}
	if !strings.Contains(errs, "profile: top kernel functions") {
		t.Fatalf("no profile summary:\n%s", errs)
	}
	prof := readProfile(t, filepath.Join(dir, "up", "profile.pb.gz"))
	ranges, funcs := labelsAndFuncs(prof)
	for _, want := range []string{"0", "250"} {
		if !ranges[want] {
			t.Errorf("up profile has no range %q (has %v)", want, ranges)
		}
	}
	if !hasFunc(funcs, "fleet.(*worker).create") || !hasFunc(funcs, "netns.Create") {
		t.Errorf("up profile lacks nsfleet's creation steps")
	}
	if !hasFunc(funcs, "sys_unshare") && !hasFunc(funcs, "ksys_unshare") {
		t.Errorf("up profile lacks the kernel's unshare")
	}
	for _, f := range []string{"flame.svg", "flame-01-0.svg"} {
		if b, err := os.ReadFile(filepath.Join(dir, "up", f)); err != nil || !strings.Contains(string(b), "<svg") {
			t.Errorf("%s: %v", f, err)
		}
	}

	code, out, errs = run("--run-dir", rd.Path, "down", "-f", spec, "--progress", "none", "--profile", filepath.Join(dir, "down"))
	if code != 0 {
		t.Fatalf("down --profile: %s%s", out, errs)
	}
	ranges, _ = labelsAndFuncs(readProfile(t, filepath.Join(dir, "down", "profile.pb.gz")))
	if !ranges["check"] || !ranges["delete"] {
		t.Errorf("down profile ranges %v, want check and delete", ranges)
	}
	nstest.WaitHostLinksGone(t, p, 30*time.Second)
}

func readProfile(t *testing.T, path string) *profile.Profile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	prof, err := profile.Parse(f)
	if err != nil {
		t.Fatalf("%s: pprof cannot read it: %v", path, err)
	}
	return prof
}

func labelsAndFuncs(p *profile.Profile) (map[string]bool, map[string]bool) {
	ranges, funcs := map[string]bool{}, map[string]bool{}
	for _, s := range p.Sample {
		for _, l := range s.Label["range"] {
			ranges[l] = true
		}
	}
	for _, f := range p.Function {
		funcs[f.Name] = true
	}
	return ranges, funcs
}

func hasFunc(funcs map[string]bool, part string) bool {
	for f := range funcs {
		if strings.Contains(f, part) {
			return true
		}
	}
	return false
}
