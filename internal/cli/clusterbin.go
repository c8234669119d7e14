package cli

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
)

// ClusterBinary is the companion binary that holds agent, cluster and sim.
// etcd's client and server cost every command start-up time and memory,
// so they live there, not here.
const ClusterBinary = "nsfleet-cluster"

// findClusterBinary looks beside this executable, then on PATH.
func findClusterBinary() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), ClusterBinary)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath(ClusterBinary); err == nil {
		return p, nil
	}
	return "", errors.New("needs the " + ClusterBinary + " binary beside nsfleet or on PATH; build both with:\n" +
		"  go build -o /usr/local/bin/ ./cmd/nsfleet ./cmd/nsfleet-cluster")
}

// newHandOver makes a command that runs the cluster binary in this
// process's place, with the arguments as given.
func newHandOver(g *globals, name, short string) *cobra.Command {
	return &cobra.Command{
		Use:                name,
		Short:              short,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			bin, err := findClusterBinary()
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
