package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/doctor"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/spf13/cobra"
)

func newDoctor(g *globals) *cobra.Command {
	var output string
	var fix bool
	cmd := &cobra.Command{
		Use:   "doctor [--run-dir DIR] [-o table|json] [--fix]",
		Short: "Find the traps that make namespaces slow or leaky, with evidence and advice",
		Long: `doctor checks this machine for what the kernel reports behind nsfleet (docs/BACKGROUND.md) learnt the hard way:
the run dir's mount and propagation, stale and double pins, mount load and
the mount namespaces every pin is copied into, namespace headroom against
user.max_net_namespaces, the /proc/sys lookup trap, RCU and kernel settings,
the neighbour table against the fleet's size, and bridges near 1,024 ports.

Each finding has a severity (ok, info, warn, fail), its evidence and advice.
The exit code is that of the worst finding: 0 for ok and info, 1 for warn,
3 for fail (2 is a usage error, as for every command).

--fix repairs only what is provably nsfleet's (stale pin files carrying its
mark, extra mounts stacked on its own pins) and prints each change.`,
		Example: `  nsfleet doctor
  nsfleet doctor -o json | jq '.findings[] | select(.severity != "ok")'
  nsfleet doctor --fix`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return usageError{Err: fmt.Errorf("doctor: -o %q: want table or json", output)}
			}
			if fix {
				if err := needRoot("doctor --fix"); err != nil {
					return err
				}
			}
			rd, err := netns.OpenRunDir(g.runDir, false)
			if err != nil {
				// A missing run dir is a finding, not an error.
				rd = &netns.RunDir{Path: g.runDir}
			}
			rep, err := doctor.Run(cmd.Context(), doctor.Options{RunDir: rd})
			if err != nil {
				return fmt.Errorf("doctor: %w", err)
			}
			if missing := missingCaps(); len(missing) > 0 {
				defer fmt.Fprintf(g.stderr, "doctor: without %s some checks read less (pin marks, namespaces of other users' processes, the sysctl lookup timing); run it as root for all of them\n", strings.Join(missing, " and "))
			}
			if fix {
				var lock *netns.Lock
				if rep.Env.RunDirExists {
					if lock, err = rd.Lock(g.waitLock); err != nil {
						return fmt.Errorf("doctor --fix: %w", err)
					}
					defer lock.Unlock()
				}
				rep.Fixed, err = doctor.Fix(rep.Env)
				if err != nil {
					return fmt.Errorf("doctor --fix: %w", err)
				}
				if len(rep.Fixed) > 0 {
					// Report the machine as it is now.
					fixed := rep.Fixed
					if rep, err = doctor.Run(cmd.Context(), doctor.Options{RunDir: rd}); err != nil {
						return fmt.Errorf("doctor: %w", err)
					}
					rep.Fixed = fixed
				}
			}
			if output == "json" {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				printReport(g.stdout, rep, g.verbose)
			}
			if code := doctor.ExitCode(rep.Worst()); code != 0 {
				return &exitError{Code: code}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().BoolVar(&fix, "fix", false, "repair what is safe and nsfleet's own, showing each change")
	return cmd
}

func printReport(w io.Writer, r *doctor.Report, verbose bool) {
	for _, f := range r.Findings {
		fmt.Fprintf(w, "%-5s %-18s %s\n", strings.ToUpper(f.Severity.String()), f.Check, f.Summary)
		if f.Severity == doctor.OK && !verbose {
			continue
		}
		for _, e := range f.Evidence {
			fmt.Fprintf(w, "      %-18s   %s\n", "", e)
		}
		if f.Advice != "" {
			fmt.Fprintf(w, "      %-18s → %s\n", "", f.Advice)
		}
		if f.Source != "" {
			fmt.Fprintf(w, "      %-18s   (report %s)\n", "", f.Source)
		}
	}
	for _, fx := range r.Fixed {
		fmt.Fprintf(w, "fix:  %s\n", fx)
	}
	counts := map[doctor.Severity]int{}
	for _, f := range r.Findings {
		counts[f.Severity]++
	}
	fmt.Fprintf(w, "doctor: %d checks in %.2fs: %d ok, %d info, %d warn, %d fail\n", len(r.Findings), time.Duration(r.Elapsed).Seconds(),
		counts[doctor.OK], counts[doctor.Info], counts[doctor.Warn], counts[doctor.Fail])
}
