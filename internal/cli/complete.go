package cli

import (
	"time"

	"github.com/nsfleet/nsfleet/internal/companion"
	"github.com/nsfleet/nsfleet/internal/complete"
	"github.com/spf13/cobra"
)

// completions teaches the shells' completion (nsfleet completion SHELL)
// what each argument is: spec files, namespace names from the run dir,
// and whatever the companion binaries complete for the commands that hand
// over to them (nodes and specs; scenarios and stored run ids).
func completions(root *cobra.Command, g *globals) {
	complete.Files(root)
	names := complete.Namespaces(func() string { return g.runDir })
	for _, c := range root.Commands() {
		switch c.Name() {
		case "exec":
			c.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
				if all, _ := cmd.Flags().GetBool("all"); all || len(args) > 0 {
					return nil, cobra.ShellCompDirectiveDefault // CMD and its arguments
				}
				return names(cmd, args, toComplete)
			}
		case "ls", "down":
			_ = c.RegisterFlagCompletionFunc("prefix", names)
			c.ValidArgsFunction = noArgs
		case "agent", "cluster", "sim":
			c.ValidArgsFunction = delegate(companion.Cluster, c.Name())
		case "bench":
			c.ValidArgsFunction = delegate(companion.Lab, c.Name())
		case "up", "supervise", "doctor", "version":
			c.ValidArgsFunction = noArgs
		}
	}
}

func noArgs(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return nil, cobra.ShellCompDirectiveNoFileComp
}

// delegate completes a command that hands over to a companion binary by
// asking that binary (its hidden __complete), within 2 s.
func delegate(bin companion.Binary, name string) complete.Func {
	return complete.Delegate(bin.Find, func(args []string) []string {
		return append([]string{name}, args...)
	}, 2*time.Second)
}
