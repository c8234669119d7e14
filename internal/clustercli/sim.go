package clustercli

import "github.com/spf13/cobra"

func newSim(g *globals) *cobra.Command {
	return &cobra.Command{Use: "sim", Short: "A cluster on one machine"}
}
