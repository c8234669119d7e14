package cli

import (
	"fmt"
	"os"
	"syscall"

	"github.com/nsfleet/nsfleet/internal/companion"
	"github.com/spf13/cobra"
)

// newHandOver makes a command that runs a companion binary in this
// process's place (its command of the same name) with every word as
// typed. Its flags are not parsed here, and cobra hands it the global
// flags typed before its name too (nsfleet -v bench ...), which the
// companions take as their own: -v everywhere, -w and --run-dir where
// they mean the same.
func newHandOver(bin companion.Binary, name, short string) *cobra.Command {
	return &cobra.Command{
		Use:                name,
		Short:              short,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := bin.Find()
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			err = syscall.Exec(path, append([]string{path, name}, args...), os.Environ())
			return fmt.Errorf("%s: exec %s: %w", name, path, err)
		},
	}
}

// companionCommands are the commands that other binaries hold, so that
// their dependencies stay out of every other command's start-up.
func companionCommands() []*cobra.Command {
	return []*cobra.Command{
		newHandOver(companion.Cluster, "agent", "Serve this node's share of a cluster's fleet (runs nsfleet-cluster)"),
		newHandOver(companion.Cluster, "cluster", "Apply a spec to a cluster, show it, drain nodes (runs nsfleet-cluster)"),
		newHandOver(companion.Cluster, "sim", "A whole cluster on one machine, for trying and testing (runs nsfleet-cluster)"),
		newHandOver(companion.Lab, "bench", "The scalability lab: the kernel reports' workloads, methods side by side (runs nsfleet-lab)"),
	}
}
