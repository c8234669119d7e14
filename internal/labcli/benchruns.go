package labcli

// bench's commands on stored runs: list, show, compare, plot, report.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/nsfleet/nsfleet/bench"
	"github.com/nsfleet/nsfleet/bench/report"
	"github.com/nsfleet/nsfleet/bench/results"
	"github.com/spf13/cobra"
)

func openStore(db string) (*results.Store, error) {
	if _, err := os.Stat(db); err != nil {
		return nil, fmt.Errorf("bench: no results store at %s (run a scenario first, or pass --db)", db)
	}
	return results.Open(db)
}

func benchList(db *string) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "Show stored runs with their environments",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := openStore(*db)
			if err != nil {
				return err
			}
			defer st.Close()
			runs, err := st.List()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RUN\tSCENARIO\tSTARTED\tSECONDS\tSAMPLES\tKERNEL\tPARAMETERS")
			for _, r := range runs {
				var ps []string
				for _, k := range []string{"n", "mark", "runs", "engines", "variants"} {
					if v := r.Params[k]; v != "" {
						ps = append(ps, k+"="+v)
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%d\t%s\t%s\n", r.ID, r.Scenario, r.Started.Local().Format("2006-01-02 15:04"), r.Elapsed, r.Samples, r.Kernel, strings.Join(ps, " "))
			}
			return tw.Flush()
		},
	}
}

func loadRuns(db string, refs []string) ([]*bench.Run, error) {
	st, _ := results.Open(db)
	if st != nil {
		defer st.Close()
	}
	var runs []*bench.Run
	for _, ref := range refs {
		r, err := results.LoadAny(st, ref)
		if err != nil {
			return nil, err
		}
		runs = append(runs, r)
	}
	return runs, nil
}

func benchShow(g *globals, db *string) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "show RUN [-o table|json|csv|benchfmt]",
		Short: "Print a stored run again, in any output format",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			runs, err := loadRuns(*db, args)
			if err != nil {
				return err
			}
			switch output {
			case "json":
				return report.WriteJSON(g.stdout, runs[0])
			case "csv":
				return report.WriteCSV(g.stdout, runs[0])
			case "benchfmt":
				return report.WriteBenchfmt(g.stdout, runs[0])
			case "table":
				return report.WriteTable(g.stdout, runs[0])
			}
			return usageError{Err: fmt.Errorf("bench show: -o %q: want table, json, csv or benchfmt", output)}
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table, json, csv or benchfmt")
	return cmd
}

func benchCompare(g *globals, db *string) *cobra.Command {
	var allowMixed bool
	cmd := &cobra.Command{
		Use:   "compare A B",
		Short: "Compare two runs metric by metric (Welch t-test and Mann-Whitney U test)",
		Long: `compare matches the samples of two runs (stored run ids, or files written with
-o json) by metric, configuration and mark, and prints for each: the mean ±
SD of A and B, the change, the 95% confidence interval of the difference
(Welch), the p-values of Welch's t-test and of the Mann-Whitney U test (which
assumes no normal distribution), and a verdict at alpha 0.05 (Welch decides
below 5 runs a side, the U test from 5 on). Use --runs 3 or more.

Runs made under different accelerators (natively, in a KVM VM, emulated by
TCG) are refused unless --allow-mixed: an emulated kernel runs many times
slower than the same kernel natively, so their difference says nothing
about the kernels.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			runs, err := loadRuns(*db, args)
			if err != nil {
				return err
			}
			if runs[0].Scenario != runs[1].Scenario {
				return fmt.Errorf("bench compare: %s is %s but %s is %s", runs[0].ID, runs[0].Scenario, runs[1].ID, runs[1].Scenario)
			}
			if a, b := accelOf(runs[0]), accelOf(runs[1]); a != b && !allowMixed {
				return usageError{Err: fmt.Errorf("bench compare: %s ran %s but %s ran %s: an emulated or virtualized kernel is slower for reasons of its own, so the difference would be the accelerator's, not the kernels'; --allow-mixed compares anyway", runs[0].ID, describeAccel(a), runs[1].ID, describeAccel(b))}
			}
			cs := report.Compare(runs[0], runs[1])
			if len(cs) == 0 {
				return fmt.Errorf("bench compare: the runs share no metric, configuration and mark")
			}
			w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "A = %s, B = %s\n", runs[0].ID, runs[1].ID)
			fmt.Fprintln(w, "METRIC\tCONFIG\tMARK\tA\tB\tCHANGE\t95% CI OF B-A\tP WELCH\tP U\tVERDICT")
			for _, c := range cs {
				mark := "-"
				if c.Mark > 0 {
					mark = fmt.Sprint(c.Mark)
				}
				fmt.Fprintf(w, "%s (%s)\t%s\t%s\t%.4g ± %.2g\t%.4g ± %.2g\t%+.1f%%\t[%.4g, %.4g]\t%.3f\t%.3f\t%s\n",
					c.Metric, c.Unit, c.Config, mark, c.A.Mean, c.A.SD, c.B.Mean, c.B.SD, c.Delta*100, c.DiffLo, c.DiffHi, c.PWelch, c.PU, c.Verdict)
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&allowMixed, "allow-mixed", false, "compare runs made under different accelerators (native, kvm, tcg)")
	return cmd
}

// accelOf is how a run's kernel ran: "native" (this machine), "kvm" or
// "tcg" (a VM), or several joined by "+" for a run over kernels.
func accelOf(r *bench.Run) string {
	if a := r.Params["accel"]; a != "" {
		return a
	}
	return "native"
}

func describeAccel(a string) string {
	switch a {
	case "native":
		return "natively"
	case "tcg":
		return "under TCG (emulated)"
	case "kvm":
		return "in a KVM VM"
	}
	return "on kernels run " + a
}

func benchPlot(g *globals, db *string) *cobra.Command {
	var outDir, metric string
	cmd := &cobra.Command{
		Use:   "plot RUN... [-o DIR]",
		Short: "Draw a metric per mark as SVG and PNG (colour-blind-safe, dashes and markers, labelled)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			runs, err := loadRuns(*db, args)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(outDir, 0o755); err != nil {
				return err
			}
			base := filepath.Join(outDir, runs[0].Scenario+"-"+strings.ReplaceAll(metric, " ", "_"))
			for _, format := range []string{"svg", "png"} {
				var buf bytes.Buffer
				if err := report.Plot(&buf, runs, metric, format); err != nil {
					return fmt.Errorf("bench plot: %w", err)
				}
				if err := os.WriteFile(base+"."+format, buf.Bytes(), 0o644); err != nil {
					return err
				}
				fmt.Fprintln(g.stdout, base+"."+format)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&outDir, "output", "o", ".", "directory for the SVG and PNG files")
	cmd.Flags().StringVar(&metric, "metric", "rate", "the metric to draw")
	return cmd
}

func benchReport(g *globals, db *string) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "report RUN... [-o FILE]",
		Short: "Write one HTML page with the tables, plots and environment of runs",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			runs, err := loadRuns(*db, args)
			if err != nil {
				return err
			}
			var buf bytes.Buffer
			if err := report.WriteReport(&buf, runs); err != nil {
				return err
			}
			if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, out)
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "nsfleet-report.html", "HTML file to write")
	return cmd
}
