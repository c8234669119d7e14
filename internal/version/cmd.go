package version

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// Command is `version` for nsfleet and nsfleet-cluster alike.
func Command(stdout io.Writer) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version [-o json]",
		Short: "Print the version, commit, build date, Go version and linking of this binary",
		Long: `version prints what this binary knows of its build, from the information Go
records in it: version, commit (+dirty if the tree had changes), the commit's
date, the Go version, and whether it is linked statically (no dynamic
loader). The same line is recorded with every lab run and in every agent's
node key: put it in a bug report.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			i := Get()
			switch output {
			case "json":
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(i)
			case "text":
				fmt.Fprintf(stdout, "%s %s\n", cmd.Root().Name(), i)
				return nil
			}
			return fmt.Errorf("version: -o %q: want text or json", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}
