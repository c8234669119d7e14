package cli

import (
	"fmt"
	"os"
	"syscall"

	"github.com/nsfleet/nsfleet/internal/companion"

	"github.com/spf13/cobra"
)

// newHandOver makes a command that runs the cluster binary in this
// process's place, with the arguments as given.
func newHandOver(g *globals, name, short string) *cobra.Command {
	return &cobra.Command{
		Use:                name,
		Short:              short,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			bin, err := companion.Find()
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			argv := []string{bin, name}
			if g.verbose {
				argv = append(argv, "-v")
			}
			if name == "agent" && cmd.Flags().Changed("run-dir") {
				argv = append(argv, "--run-dir", g.runDir)
			}
			argv = append(argv, args...)
			err = syscall.Exec(bin, argv, os.Environ())
			return fmt.Errorf("%s: exec %s: %w", name, bin, err)
		},
	}
}

func clusterCommands(g *globals) []*cobra.Command {
	return []*cobra.Command{
		newHandOver(g, "agent", "Serve this node's share of a cluster's fleet (runs nsfleet-cluster)"),
		newHandOver(g, "cluster", "Apply a spec to a cluster, show it, drain nodes (runs nsfleet-cluster)"),
		newHandOver(g, "sim", "A whole cluster on one machine, for trying and testing (runs nsfleet-cluster)"),
	}
}
