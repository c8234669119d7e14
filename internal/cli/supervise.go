package cli

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/nsfleet/nsfleet/internal/exitcode"
	"github.com/nsfleet/nsfleet/process"
	"github.com/spf13/cobra"
)

func newSupervise(g *globals) *cobra.Command {
	var file string
	var backoff, maxBackoff, tick time.Duration
	cmd := &cobra.Command{
		Use:   "supervise -f SPEC",
		Short: "Keep the spec's processes running, restarting them with back-off",
		Long: `supervise runs until interrupted and keeps the processes declared in the
spec running inside their namespaces: a process that exits is restarted
after a delay that doubles with each quick exit (--backoff up to
--max-backoff), as its restart policy says (always, on-failure, never).

Each process writes to its own log file, under the store beside the run dir
(for /run/netns: /run/.nsfleet-netns/logs/NAMESPACE/PROCESS.log). Processes
keep running when supervise stops; a new supervise adopts the ones still
running instead of starting duplicates. 'nsfleet down' stops them (SIGTERM,
then SIGKILL after --grace) before it deletes their namespaces. Only one
supervise runs per run dir.`,
		Example: `  nsfleet up -f examples/dhcp.yaml        # creates the namespaces, starts the processes
  nsfleet supervise -f examples/dhcp.yaml  # keeps them running (Ctrl-C to stop supervising)
  nsfleet ls -f examples/dhcp.yaml         # PID, state and restarts of each process`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, rd, err := g.rootSpecRunDir("supervise", file)
			if err != nil {
				return err
			}
			store := process.StoreFor(rd)
			n, nns := 0, 0
			for _, ns := range f.Namespaces {
				if len(ns.Processes) > 0 {
					n += len(ns.Processes)
					nns++
				}
			}
			if n == 0 {
				return &exitError{Code: exitcode.Failed, Err: fmt.Errorf("supervise: %s declares no processes", file)}
			}
			fmt.Fprintf(g.stderr, "supervise: %d processes in %d namespaces; logs in %s\n", n, nns, filepath.Join(store.Dir, "logs", "NAMESPACE", "PROCESS.log"))
			err = store.Supervise(cmd.Context(), f, rd, process.SuperviseOptions{Tick: tick, Backoff: backoff, MaxBackoff: maxBackoff, Log: g.log})
			if err != nil {
				return fmt.Errorf("supervise: %w", err)
			}
			fmt.Fprintln(g.stderr, "supervise: stopped; the processes keep running")
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "spec file (YAML)")
	cmd.Flags().DurationVar(&backoff, "backoff", time.Second, "first restart delay; doubles with each quick exit")
	cmd.Flags().DurationVar(&maxBackoff, "max-backoff", time.Minute, "longest restart delay")
	cmd.Flags().DurationVar(&tick, "tick", 500*time.Millisecond, "how often processes are checked")
	return cmd
}
