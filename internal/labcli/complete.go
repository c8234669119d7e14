package labcli

import (
	"os"
	"strings"

	"github.com/nsfleet/nsfleet/bench"
	"github.com/nsfleet/nsfleet/bench/results"
	"github.com/nsfleet/nsfleet/internal/complete"
	"github.com/spf13/cobra"
)

// completions teaches cobra's __complete, which nsfleet's script asks,
// the lab's arguments: scenarios with their descriptions, stored run ids,
// JSON run files, and files for -f-like flags.
func completions(root *cobra.Command) {
	complete.Files(root)
	for _, c := range root.Commands() {
		if c.Name() != "bench" {
			continue
		}
		c.ValidArgsFunction = func(_ *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var out []string
			for _, n := range bench.Names() {
				if s, _ := bench.Lookup(n); strings.HasPrefix(n, toComplete) {
					out = append(out, n+"\t"+s.Describe)
				}
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		}
		for _, sub := range c.Commands() {
			switch sub.Name() {
			case "show", "compare", "plot", "report":
				sub.ValidArgsFunction = runIDs
			}
		}
	}
}

// runIDs completes the ids of stored runs (newest first, with their
// scenario), or a JSON file where what is typed looks like a path.
func runIDs(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if strings.ContainsAny(toComplete, "./") {
		return []string{"json"}, cobra.ShellCompDirectiveFilterFileExt
	}
	db, _ := cmd.Flags().GetString("db")
	if db == "" {
		db = results.DefaultDB()
	}
	if _, err := os.Stat(db); err != nil {
		return nil, cobra.ShellCompDirectiveDefault
	}
	st, err := results.Open(db)
	if err != nil {
		return nil, cobra.ShellCompDirectiveDefault
	}
	defer st.Close()
	runs, err := st.List()
	if err != nil {
		return nil, cobra.ShellCompDirectiveDefault
	}
	var out []string
	for _, r := range runs {
		if strings.HasPrefix(r.ID, toComplete) {
			out = append(out, r.ID+"\t"+r.Scenario+" "+r.Started.Local().Format("2006-01-02 15:04"))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
