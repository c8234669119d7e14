package labcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/bench"
	"github.com/nsfleet/nsfleet/bench/report"
	"github.com/nsfleet/nsfleet/bench/results"
	"github.com/nsfleet/nsfleet/bench/vm"
	"github.com/nsfleet/nsfleet/internal/exitcode"
	"github.com/nsfleet/nsfleet/internal/progress"
	"github.com/nsfleet/nsfleet/kprof"
	"github.com/spf13/cobra"
)

func newBench(g *globals) *cobra.Command {
	bf := &benchFlags{}
	o := &bf.o
	cmd := &cobra.Command{
		Use:   "bench SCENARIO [flags] | bench list | bench compare A B | bench plot RUN... | bench report RUN...",
		Short: "The scalability lab: reproduce the kernel reports' workloads and compare methods",
		Long: `bench runs one of the kernel reports' experiments (docs/BACKGROUND.md), with competing methods
("engines") and variants side by side in one run, repeated --runs times, and
reports throughput per mark as a table with configurations as columns (mean ±
standard deviation over the runs). Every run records its environment (kernel,
command line, CPU, memory, the kernel options the reports blame, sysctls,
run-dir propagation, iproute2 and nsfleet versions) and is stored in an SQLite
file (--db; 'nsfleet bench list' shows past runs).

Scenarios:
` + scenarioList() + `
Output: -o table (default), json, csv, or benchfmt, the Go benchmark format
that benchstat reads ('benchstat -col /engine' lays engines side by side).`,
		Example: `  nsfleet bench fake-router -n 1000 --runs 3
  nsfleet bench fake-router --engines native,iproute2 --variants add,add+2exec+2link -n 500
  nsfleet bench fake-router -o benchfmt > new.txt && benchstat -col /engine new.txt
  nsfleet bench churn --runs 5
  nsfleet bench list
  nsfleet bench compare 20261129-2201 20261129-2230
  nsfleet bench plot 20261129-2201 -o /tmp/plots
  nsfleet bench report 20261129-2201 -o report.html`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			s, err := bench.Lookup(args[0])
			if err != nil {
				return usageError{Err: err}
			}
			switch bf.output {
			case "table", "json", "csv", "benchfmt":
			default:
				return usageError{Err: fmt.Errorf("bench: -o %q: want table, json, csv or benchfmt", bf.output)}
			}
			o.Engines, o.Variants = splitList(bf.engines), splitList(bf.variants)
			o.RunDir, o.Log, o.Workers = bf.benchRunDir, g.log, g.workers
			bench.IdleMountNamespaces, bench.UeventNamespaces, bench.ChurnLimit = bf.idle, bf.listeners, bf.limit
			if bf.idle < 0 || bf.listeners < 1 || bf.limit < 2 {
				return usageError{Err: fmt.Errorf("bench: --idle >= 0, --namespaces >= 1, --limit >= 2")}
			}
			if !g.verbose {
				// The progress display says what runs; the log only what
				// goes wrong (-v: every run too).
				o.Log = slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			}
			prof, err := kprof.StartSession(bf.profileDir)
			if err != nil {
				return err
			}
			marks := &benchMarks{}
			var prog *progress.Display
			current := ""
			runs := max(o.Runs, 1)
			o.Progress = func(config string, rep, done, total int) {
				// One display per configuration and run: a bar with rate
				// and ETA on a terminal, a line every few seconds otherwise.
				if key := fmt.Sprint(config, rep); key != current {
					if prog != nil {
						prog.Finish()
					}
					current = key
					prog = progress.New(g.stderr, fmt.Sprintf("bench %s %s run %d/%d", s.Name, config, rep+1, runs), total, bf.progressMode)
				}
				prog.Set(done, total)
				if prof != nil {
					prof.Mark(marks.add(config, rep, done, total))
				}
			}
			if bf.kernels != "" {
				return benchOnKernels(cmd.Context(), g, s, *o, bf.vmOpts, splitList(bf.kernels), func(run *bench.Run, err error) error {
					return emitRun(g, s.Name, run, err, bf.noStore, bf.db, bf.output, bf.seedTable)
				})
			}
			run, err := bench.Execute(cmd.Context(), s, *o)
			if prog != nil {
				prog.Finish()
			}
			if prof != nil {
				r, perr := prof.Finish(g.stderr)
				if perr != nil {
					fmt.Fprintln(g.stderr, "nsfleet: bench: --profile:", perr)
				} else if run != nil {
					marks.growth(g.stderr, r, run)
				}
			}
			return emitRun(g, s.Name, run, err, bf.noStore, bf.db, bf.output, bf.seedTable)
		},
	}
	bf.register(cmd)
	cmd.PersistentFlags().StringVar(&bf.db, "db", results.DefaultDB(), "results database (SQLite)")
	cmd.AddCommand(benchList(&bf.db), benchShow(g, &bf.db), benchCompare(g, &bf.db), benchPlot(g, &bf.db), benchReport(g, &bf.db))
	return cmd
}

// benchFlags are bench's flags (the scenario run's; the subcommands have
// their own).
type benchFlags struct {
	o                                              bench.Options
	engines, variants, output, db                  string
	noStore, seedTable                             bool
	benchRunDir, profileDir, progressMode, kernels string
	vmOpts                                         vm.Options
	idle, listeners, limit                         int
}

func (bf *benchFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&bf.kernels, "kernel", "", "run the scenario on these kernels, comma-separated: host (this machine's, natively) and kernel images (bzImage), each booted in a VM; two or more make one run with the kernels as columns")
	f.StringVar(&bf.vmOpts.Accel, "accel", "auto", "VM accelerator: auto (KVM when it can boot a standard kernel, else TCG, and says why), kvm, tcg")
	f.IntVar(&bf.vmOpts.CPUs, "vm-cpus", 2, "CPUs of each VM")
	f.StringVar(&bf.vmOpts.Mem, "vm-mem", "4G", "memory of each VM")
	f.StringVar(&bf.vmOpts.Modules, "modules", "", "the kernels' modules tree, holding lib/modules/RELEASE (default: this machine's /lib/modules)")
	f.StringVar(&bf.vmOpts.Cmdline, "kernel-cmdline", "", "extra kernel arguments, e.g. rcu_nocbs=0-1 rcupdate.rcu_expedited=1")
	f.DurationVar(&bf.vmOpts.Timeout, "vm-timeout", 10*time.Minute, "longest a VM may take to boot and run")
	f.StringVar(&bf.progressMode, "progress", "auto", "progress display: auto (a bar per configuration and run with rate and ETA on a terminal, plain lines otherwise), bar, plain, none")
	f.BoolVar(&bf.seedTable, "seed-table", false, "print the report's published table beside this machine's figures, in the report's shape")
	f.StringVar(&bf.profileDir, "profile", "", "sample kernel and nsfleet stacks into DIR, one range per mark: pprof profile, flame graphs, kernel functions whose share grows with N")
	f.IntVarP(&bf.o.N, "n", "n", 0, "how many (routers, pairs, iterations); 0: the scenario's default")
	f.IntVar(&bf.o.Mark, "mark", 0, "a mark every M; 0: the scenario's default")
	f.IntVar(&bf.o.Runs, "runs", 1, "repeat each configuration K times, each from a fresh state")
	f.StringVar(&bf.engines, "engines", "", "comma-separated engines (default: all the scenario knows)")
	f.StringVar(&bf.variants, "variants", "", "comma-separated variants (default: all)")
	f.StringVarP(&bf.output, "output", "o", "table", "table, json, csv or benchfmt")
	f.StringVar(&bf.benchRunDir, "bench-run-dir", "", "run dir for the native engine (default: a temporary one)")
	f.BoolVar(&bf.noStore, "no-store", false, "do not store the run")
	f.IntVar(&bf.idle, "idle", bench.IdleMountNamespaces, "mount-propagation: idle mount namespaces held open (M)")
	f.IntVar(&bf.listeners, "namespaces", bench.UeventNamespaces, "uevent: namespaces with (or without) a listener (K)")
	f.IntVar(&bf.limit, "limit", bench.ChurnLimit, "churn: user.max_<type>_namespaces inside its user namespace")
	f.DurationVar(&bench.TopologyTimeLimit, "time-limit", bench.TopologyTimeLimit, "topology: longest a tool may take to create (or tear down) one size; past it, larger sizes go without that tool")
}

func scenarioList() string {
	var b strings.Builder
	for _, n := range bench.Names() {
		s, _ := bench.Lookup(n)
		fmt.Fprintf(&b, "  %-18s %s (default -n %d, --mark %d)\n", n, s.Describe, s.N, s.Mark)
		if e := s.Engines; len(e) > 1 {
			fmt.Fprintf(&b, "  %-18s engines: %s\n", "", strings.Join(e, ", "))
		}
		if v := s.Variants; len(v) > 1 {
			fmt.Fprintf(&b, "  %-18s variants: %s\n", "", strings.Join(v, ", "))
		}
	}
	return b.String()
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// benchMarks remembers which profile range is which configuration's mark.
type benchMarks struct {
	ranges []benchRange // index k+1 is profile range k+1 (range 0 is "start")
}

type benchRange struct {
	config      string
	rep         int
	done, total int
}

func (b *benchMarks) add(config string, rep, done, total int) string {
	b.ranges = append(b.ranges, benchRange{config, rep, done, total})
	return fmt.Sprintf("%s run %d from %d", config, rep+1, done)
}

// growth prints, per configuration and run, the kernel functions whose
// share grows most from its first mark to its last (the range after the
// last mark is teardown and is left out), and notes them in the run.
func (b *benchMarks) growth(w io.Writer, r *kprof.Result, run *bench.Run) {
	type key struct {
		config string
		rep    int
	}
	first, last := map[key]int{}, map[key]int{}
	var order []key
	for i, br := range b.ranges {
		k := key{br.config, br.rep}
		idx := i + 1
		if br.done >= br.total {
			continue
		}
		if _, ok := first[k]; !ok {
			first[k] = idx
			order = append(order, k)
		}
		last[k] = idx
	}
	for _, k := range order {
		if first[k] == last[k] {
			continue
		}
		shares := r.GrowthBetween(first[k], last[k], 5)
		if len(shares) == 0 {
			continue
		}
		fmt.Fprintf(w, "profile: %s run %d: kernel functions whose share grows from mark %d to mark %d:\n",
			k.config, k.rep+1, b.ranges[first[k]-1].done, b.ranges[last[k]-1].done)
		var parts []string
		for _, s := range shares {
			fmt.Fprintf(w, "  %5.1f%% -> %5.1f%%  %s\n", 100*s.First, 100*s.Last, s.Function)
			parts = append(parts, fmt.Sprintf("%s %.1f%%->%.1f%%", s.Function, 100*s.First, 100*s.Last))
		}
		run.Notes = append(run.Notes, fmt.Sprintf("profile %s run %d, growing kernel functions: %s", k.config, k.rep+1, strings.Join(parts, ", ")))
		for _, st := range r.StepGrowth(first[k], last[k], kprof.FleetSteps, os.Getpid(), 3) {
			var grow []string
			for _, s := range st.Growing {
				grow = append(grow, fmt.Sprintf("%s %.1f%%->%.1f%%", s.Function, 100*s.First, 100*s.Last))
			}
			line := fmt.Sprintf("step %s: %.1f%% -> %.1f%% of all samples; growing most: %s", st.Step, 100*st.First, 100*st.Last, strings.Join(grow, ", "))
			fmt.Fprintf(w, "  %s\n", line)
			run.Notes = append(run.Notes, fmt.Sprintf("profile %s run %d, %s", k.config, k.rep+1, line))
		}
	}
}

// writeSeedTables prints the scenario's seed tables after a table output.
func writeSeedTables(g *globals, scenario string, run *bench.Run, output string) error {
	seeds, err := bench.Seeds(scenario)
	if err != nil {
		return err
	}
	if len(seeds) == 0 {
		why := map[string]string{
			"churn":    "report 004 published stacks and the ENOSPC failure, not a table of figures",
			"failover": "the 2014 report published creation rates (see fake-router's seed tables), not failover times",
		}[scenario]
		if why == "" {
			why = "none is typed in yet"
		}
		fmt.Fprintf(g.stderr, "bench: --seed-table: no published table for %s: %s\n", scenario, why)
		return nil
	}
	if output != "table" {
		fmt.Fprintln(g.stderr, "bench: --seed-table goes with -o table; left out")
		return nil
	}
	for _, s := range seeds {
		if !ranConfig(run, s.Config) {
			fmt.Fprintf(g.stderr, "bench: --seed-table: report %s's %q needs %s, which this run did not run\n", s.Report, s.Title, bench.ConfigKey(s.Config, run.Keys))
			continue
		}
		fmt.Fprintln(g.stdout)
		if err := bench.WriteSeedTable(g.stdout, s, run); err != nil {
			return err
		}
	}
	return nil
}

// ranConfig reports whether run has a sample of the configuration.
func ranConfig(run *bench.Run, cfg map[string]string) bool {
	for _, x := range run.Samples {
		if x.Matches(cfg) {
			return true
		}
	}
	return false
}

// emitRun stores a run and prints it as asked; err is the run's own
// failure (reported, exit 1, after what was measured is shown).
func emitRun(g *globals, scenario string, run *bench.Run, err error, noStore bool, db, output string, seedTable bool) error {
	if run == nil {
		return err
	}
	if err != nil {
		fmt.Fprintln(g.stderr, "nsfleet:", err)
	}
	if !noStore && len(run.Samples) > 0 {
		st, serr := results.Open(db)
		if serr == nil {
			serr = st.Save(run)
			st.Close()
		}
		if serr != nil {
			fmt.Fprintln(g.stderr, "nsfleet: bench: not stored:", serr)
		} else {
			fmt.Fprintf(g.stderr, "bench: stored as run %s in %s\n", run.ID, db)
		}
	}
	var werr error
	switch output {
	case "json":
		werr = report.WriteJSON(g.stdout, run)
	case "csv":
		werr = report.WriteCSV(g.stdout, run)
	case "benchfmt":
		werr = report.WriteBenchfmt(g.stdout, run)
	default:
		werr = report.WriteTable(g.stdout, run)
	}
	if seedTable && werr == nil {
		werr = writeSeedTables(g, scenario, run, output)
	}
	if err != nil {
		return &exitError{Code: exitcode.Failed}
	}
	return werr
}

// benchOnKernels runs the scenario on each kernel: "host" is this
// machine's, run natively in this process; any other is a kernel image
// booted in a VM of its own. A kernel that fails (panic, no network
// namespaces, missing module, hang) is reported with its last console
// lines and the others still run. One image alone is emitted as its own
// run; otherwise the kernels' runs are merged into one whose columns are
// the kernels (bench.MergeKernels).
func benchOnKernels(ctx context.Context, g *globals, s *bench.Scenario, o bench.Options, vo vm.Options, kernels []string, emit func(*bench.Run, error) error) error {
	for _, k := range kernels {
		if k != "host" {
			if _, err := os.Stat(k); err != nil {
				return usageError{Err: fmt.Errorf("bench: --kernel %s: %w (give kernel images, or host for this machine's kernel)", k, err)}
			}
		}
	}
	var parts []bench.KernelRun
	var errs []error
	failed := 0
	for _, k := range kernels {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var run *bench.Run
		var err error
		var accel string
		if k == "host" {
			run, err = bench.Execute(ctx, s, o)
			accel = "native"
		} else {
			vo := vo
			vo.Kernel = k
			vo.Log = func(f string, a ...any) { fmt.Fprintf(g.stderr, "bench: "+f+"\n", a...) }
			vo.Job = vm.Job{Scenario: s.Name, N: o.N, Mark: o.Mark, Runs: o.Runs, Engines: o.Engines, Variants: o.Variants,
				Prefix: o.Prefix, Workers: o.Workers,
				Globals: map[string]int{"idle": bench.IdleMountNamespaces, "namespaces": bench.UeventNamespaces, "limit": bench.ChurnLimit}}
			run, err = vm.Boot(ctx, vo)
			if run != nil {
				accel = run.Params["accel"]
			}
		}
		if run == nil {
			fmt.Fprintf(g.stderr, "nsfleet: bench: kernel %s: %v\n", k, err)
			failed++
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("kernel %s: %w", k, err))
		}
		parts = append(parts, bench.KernelRun{Release: run.Env.KernelRelease(), Accel: accel, Run: run})
	}
	var err error
	switch {
	case len(parts) == 0:
	case len(kernels) == 1 && kernels[0] != "host":
		err = emit(parts[0].Run, errors.Join(errs...))
	default:
		err = emit(bench.MergeKernels(parts, bench.CaptureEnv(o.RunDir)), errors.Join(errs...))
	}
	if err != nil && failed == 0 {
		return err
	}
	if failed > 0 {
		return &exitError{Code: exitcode.Failed, Err: fmt.Errorf("bench: %d of %d kernels failed", failed, len(kernels))}
	}
	return nil
}
