package cli

import (
	"os"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/bench"
	"github.com/nsfleet/nsfleet/bench/results"
	"github.com/nsfleet/nsfleet/internal/companion"
	"github.com/nsfleet/nsfleet/internal/complete"
	"github.com/spf13/cobra"
)

// completions teaches the shells' completion (nsfleet completion SHELL)
// what each argument is: spec files, namespace names from the run dir,
// scenarios, stored run ids, and whatever nsfleet-cluster completes for
// the commands that hand over to it.
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
		case "bench":
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
		case "agent", "cluster", "sim":
			name := c.Name()
			c.ValidArgsFunction = complete.Delegate(companion.Find, func(args []string) []string {
				return append([]string{name}, args...)
			}, 2*time.Second)
		case "up", "supervise", "doctor", "version":
			c.ValidArgsFunction = noArgs
		}
	}
}

func noArgs(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return nil, cobra.ShellCompDirectiveNoFileComp
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
