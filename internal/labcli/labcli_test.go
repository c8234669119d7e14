package labcli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/nsfleet/nsfleet/bench/vm"
	"github.com/nsfleet/nsfleet/internal/exitcode"
	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/internal/reexec"
)

// The test binary doubles as nsfleet-lab: with NSFLEET_LAB_CHILD=1 it runs
// the command line from its arguments, and it is the init of the lab's
// VMs (bench --kernel boots this executable).
func TestMain(m *testing.M) {
	reexec.Dispatch()
	if vm.IsGuest() {
		vm.GuestMain() // does not return
	}
	if os.Getenv("NSFLEET_LAB_CHILD") == "1" {
		os.Exit(Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	nstest.Main(m)
}

func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func child(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "NSFLEET_LAB_CHILD=1")
	return cmd
}

// The lab completes scenarios (with their descriptions) and bench's
// subcommands, as nsfleet's script asks it; a stored run's id where one
// is asked for, a JSON file where a path is typed.
func TestCompletion(t *testing.T) {
	for _, c := range []struct {
		args      []string
		want      string
		directive string
	}{
		{[]string{"bench", "fake"}, "fake-router", ":4"},
		{[]string{"bench", "com"}, "compare", ":4"},
		{[]string{"bench", "show", "./"}, "json", ":8"},
	} {
		_, out, _ := run(append([]string{"__complete"}, c.args...)...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		var names []string
		for _, l := range lines[:len(lines)-1] {
			names = append(names, strings.SplitN(l, "\t", 2)[0])
		}
		if got := strings.Join(names, " "); got != c.want || lines[len(lines)-1] != c.directive {
			t.Errorf("%q: got %q %s, want %q %s", c.args, got, lines[len(lines)-1], c.want, c.directive)
		}
	}
}

// A scenario that does not exist is a usage error that names it.
func TestUnknownScenario(t *testing.T) {
	code, _, stderr := run("bench", "no-such-scenario")
	if code != exitcode.Usage || !strings.Contains(stderr, "no-such-scenario") {
		t.Errorf("exit %d, %s", code, stderr)
	}
}
