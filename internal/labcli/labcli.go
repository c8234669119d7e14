// Package labcli is the command line of nsfleet's lab binary, nsfleet-lab:
// `nsfleet bench` hands over to it. The lab is a binary of its own so that
// its plots (gonum), its SQLite store and its statistics stay out of the
// start-up of every other nsfleet command; it is also the init of the VMs
// that run scenarios on other kernels (bench --kernel).
package labcli

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/nsfleet/nsfleet/internal/exitcode"
	"github.com/nsfleet/nsfleet/internal/version"
	"github.com/spf13/cobra"
)

// usageError and exitError are exitcode's, by their short local names.
type (
	usageError = exitcode.UsageError
	exitError  = exitcode.Error
)

type globals struct {
	workers int
	verbose bool
	stdout  io.Writer
	stderr  io.Writer
	log     *slog.Logger
}

// Run runs the lab binary with args (without the program name) and
// returns the exit code (see package exitcode). SIGINT and SIGTERM stop
// the scenario between steps; what was measured is still shown and stored.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := &globals{stdout: stdout, stderr: stderr}
	return exitcode.Execute(ctx, newRoot(g), args, stdout, stderr)
}

// Command is the lab binary's command tree, for generated docs (man
// pages); it runs nothing.
func Command() *cobra.Command { return newRoot(&globals{stdout: io.Discard, stderr: io.Discard}) }

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "nsfleet",
		Short: "nsfleet's lab: the kernel reports' workloads, methods side by side, statistics and plots",
		Long: `The scalability lab (nsfleet bench): each scenario reproduces one kernel
report's experiment (docs/BACKGROUND.md) with competing methods side by
side, stores every run with its environment, and compares, plots and
reports runs.`,
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
	pf.IntVarP(&g.workers, "workers", "w", 0, "parallel workers of the native engine (0: one per CPU)")
	pf.BoolVarP(&g.verbose, "verbose", "v", false, "log each run")
	root.AddCommand(newBench(g), version.Command(g.stdout))
	// Completed through nsfleet's script (nsfleet asks this binary's
	// hidden __complete), so no script of its own.
	root.CompletionOptions.DisableDefaultCmd = true
	completions(root)
	return root
}
