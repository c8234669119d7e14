// Package cli is nsfleet's command line: it turns flags into calls of the
// library packages and results into text. What logic it holds is about
// running commands: exec --all's fan-out over namespaces. The commands
// whose dependencies would weigh on every start-up (agent, cluster, sim:
// etcd; bench: the lab's plots and SQLite store) hand over to companion
// binaries (package companion).
package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/internal/exitcode"
	_ "github.com/nsfleet/nsfleet/internal/fastexec" // exec NAME -- CMD before the Go runtime starts
	"github.com/nsfleet/nsfleet/internal/version"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/spec"
	"github.com/spf13/cobra"
)

type globals struct {
	runDir   string
	workers  int
	verbose  bool
	waitLock bool
	stdout   io.Writer
	stderr   io.Writer
	log      *slog.Logger
}

// Run executes nsfleet with args (without the program name) and returns the
// process exit code (see package exitcode). SIGINT and SIGTERM cancel ctx's
// work: running commands stop starting new work, finish what is in flight,
// and print their summary.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := &globals{stdout: stdout, stderr: stderr}
	return exitcode.Execute(ctx, newRoot(g), args, stdout, stderr)
}

// usageError and exitError are exitcode's, by their short local names.
type (
	usageError = exitcode.UsageError
	exitError  = exitcode.Error
)

// Command is nsfleet's command tree, for generated docs (man pages); it
// runs nothing.
func Command() *cobra.Command { return newRoot(&globals{stdout: io.Discard, stderr: io.Discard}) }

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "nsfleet",
		Short: "Create, repair and tear down thousands of network namespaces at kernel speed",
		Long: `nsfleet declares a fleet of Linux network namespaces (with loopback state,
sysctls, veth pairs, addresses and routes) in a YAML spec, and makes the
machine match it without spawning a process per operation. Its pins are
iproute2's: 'ip netns list', 'ip -n NAME' and 'ip netns exec' see them.`,
		Example: `  # create 3,000 Neutron-style fake routers, then remove them
  nsfleet up -f examples/fake-routers.yaml
  nsfleet ls --prefix bar- | head
  nsfleet down -f examples/fake-routers.yaml

  # see what up would do, without doing it
  nsfleet up -f examples/lab.yaml --dry-run

  # work in a private run dir instead of /run/netns
  nsfleet --run-dir /tmp/lab/netns up -f examples/lab.yaml`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			level := slog.LevelInfo
			if g.verbose {
				level = slog.LevelDebug
			}
			g.log = slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: level}))
			if g.workers < 0 {
				return usageError{Err: fmt.Errorf("--workers %d: want 0 (automatic) or more", g.workers)}
			}
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.runDir, "run-dir", netns.DefaultRunDir, "directory of namespace pins (iproute2 uses /run/netns)")
	pf.IntVarP(&g.workers, "workers", "w", 0, "parallel workers (0: one per CPU, which measures fastest)")
	pf.BoolVarP(&g.verbose, "verbose", "v", false, "log each step")
	pf.BoolVar(&g.waitLock, "wait-lock", false, "wait for another nsfleet on the same run dir instead of failing")
	root.AddCommand(newUp(g), newDown(g), newLs(g), newExec(g), newSupervise(g), newDoctor(g), newTopo(g), version.Command(g.stdout))
	root.AddCommand(companionCommands()...)
	completions(root, g)
	return root
}

// openRunDir opens and locks the run dir for a command that changes it.
func (g *globals) openRunDir(create bool) (*netns.RunDir, *netns.Lock, error) {
	rd, err := netns.OpenRunDir(g.runDir, create)
	if err != nil {
		return nil, nil, err
	}
	lock, err := rd.Lock(g.waitLock)
	if err != nil {
		return nil, nil, err
	}
	return rd, lock, nil
}

// rootSpecRunDir is the start of a command that reads a spec's namespaces
// as root: -f required, root checked, the spec loaded, the run dir
// opened (not locked).
func (g *globals) rootSpecRunDir(command, file string) (*spec.Fleet, *netns.RunDir, error) {
	if file == "" {
		return nil, nil, usageError{Err: fmt.Errorf("%s: -f SPEC is required", command)}
	}
	if err := needRoot(command); err != nil {
		return nil, nil, err
	}
	f, err := loadSpec(file)
	if err != nil {
		return nil, nil, err
	}
	rd, err := netns.OpenRunDir(g.runDir, false)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", command, err)
	}
	return f, rd, nil
}

func loadSpec(path string) (*spec.Fleet, error) {
	limit := 0
	if b, err := os.ReadFile("/proc/sys/user/max_net_namespaces"); err == nil {
		limit, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	return spec.Load(path, spec.Options{MaxNamespaces: limit})
}

func (g *globals) options(rd *netns.RunDir) fleet.Options {
	return fleet.Options{RunDir: rd, Workers: g.workers, Log: g.log}
}
