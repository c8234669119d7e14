package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/internal/exitcode"
	"github.com/nsfleet/nsfleet/internal/progress"
	"github.com/nsfleet/nsfleet/kprof"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/spf13/cobra"
)

func newUp(g *globals) *cobra.Command {
	var file string
	var dryRun, adopt, marks bool
	var progressMode, profileDir string
	cmd := &cobra.Command{
		Use:   "up -f SPEC",
		Short: "Make the machine match a spec: create what is missing, repair drift",
		Long: `up reads a spec, checks all of it, and then makes the machine match it:
namespaces that are missing are created (lo, veths with their peers created
inside the namespace, sysctls, routes, then the pin), namespaces that drifted
are repaired (lo down, a sysctl changed, a veth missing), and the rest is left
alone. A second up on an unchanged machine changes nothing.

Namespaces that exist but were not made by nsfleet (for example by
'ip netns add') are reported and left alone unless --adopt is given.
Interrupted with Ctrl-C, up finishes the namespaces in flight, prints its
summary and exits with code 130; the next up carries on.`,
		Example: `  nsfleet up -f examples/fake-routers.yaml
  nsfleet up -f examples/lab.yaml --dry-run
  nsfleet up -f fleet.yaml --workers 4 --marks`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" {
				return usageError{Err: fmt.Errorf("up: -f SPEC is required")}
			}
			if err := needRoot("up"); err != nil {
				return err
			}
			f, err := loadSpec(file)
			if err != nil {
				return err
			}
			rd, lock, err := g.openForUp(dryRun)
			if err != nil {
				return fmt.Errorf("up: %w", err)
			}
			defer lock.Unlock()
			opts := fleet.UpOptions{Options: g.options(rd), DryRun: dryRun}
			opts.Adopt = adopt
			if marks {
				opts.Steps = &fleet.StepTimes{}
			}
			verb := "up"
			if dryRun {
				verb = "plan"
			}
			// With links, namespaces are tallied only once their links are
			// made: the phases tell the progress instead (OnProgress).
			mode := progressMode
			if len(f.Links) > 0 {
				mode = "none"
			}
			prog := progress.New(g.stderr, verb, len(f.Namespaces), mode)
			var failures []fleet.Result
			errs := &errorLog{w: g.stderr}
			prof, err := kprof.StartSession(profileDir)
			if err != nil {
				return err
			}
			prof.Mark("0")
			mark, done := opts.Mark, 0
			if mark <= 0 {
				mark = fleet.DefaultMark
			}
			opts.OnResult = func(r fleet.Result) {
				prog.Add(1)
				if done++; done%mark == 0 {
					prof.Mark(fmt.Sprint(done))
				}
				if r.Err != nil {
					failures = append(failures, r)
					errs.print(prog, r.Err.Error())
				}
				if dryRun && r.Action != fleet.Unchanged && r.Err == nil {
					prog.PrintAboveTo(g.stdout, fmt.Sprintf("%s %s: %s", r.Action, r.Name, strings.Join(r.Fixes, "; ")))
				}
				if g.verbose && r.Action == fleet.Repaired {
					prog.PrintAbove(fmt.Sprintf("repaired %s: %s", r.Name, strings.Join(r.Fixes, "; ")))
				}
			}
			phases := &phaseProgress{w: g.stderr, verb: verb, mode: progressMode}
			opts.OnProgress = phases.set
			sum, err := fleet.Up(cmd.Context(), f, opts)
			phases.finish()
			prog.Finish()
			if _, perr := prof.Finish(g.stderr); perr != nil {
				fmt.Fprintln(g.stderr, "nsfleet: up: --profile:", perr)
			}
			errs.flush(g.stderr, verb, "-f "+file)
			if err != nil {
				return err
			}
			printUpSummary(g.stdout, verb, &sum)
			if marks {
				printMarks(g.stdout, &sum, opts.Steps)
			}
			if serr := sum.Err(); serr != nil {
				code := exitcode.Failed
				if sum.Interrupted {
					code = exitcode.Interrupted
				}
				return &exitError{Code: code, Err: fmt.Errorf("%s: %w", verb, serr)}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "spec file (YAML)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the plan and change nothing")
	cmd.Flags().BoolVar(&adopt, "adopt", false, "take over matching namespaces that nsfleet did not make")
	cmd.Flags().BoolVar(&marks, "marks", false, "print the rate of every 250 namespaces (the 2014 report's marks)")
	cmd.Flags().StringVar(&progressMode, "progress", "auto", "progress display: auto (a bar on a terminal, lines otherwise), bar, plain, none")
	cmd.Flags().StringVar(&profileDir, "profile", "", "sample kernel and nsfleet stacks (on- and off-CPU) into DIR: pprof profile, flame graphs per mark, top kernel functions")
	return cmd
}

// openForUp opens and locks the run dir for up; a dry run where none
// exists yet plans against an empty one (nothing exists: everything is to
// be created).
func (g *globals) openForUp(dryRun bool) (*netns.RunDir, *netns.Lock, error) {
	rd, lock, err := g.openRunDir(!dryRun)
	if dryRun && errors.Is(err, os.ErrNotExist) {
		abs, aerr := filepath.Abs(g.runDir)
		if aerr != nil {
			return nil, nil, aerr
		}
		return &netns.RunDir{Path: abs}, nil, nil
	}
	return rd, lock, err
}

// phaseProgress shows one progress display per phase of up (namespaces,
// then links), each replacing the last.
type phaseProgress struct {
	w          io.Writer
	verb, mode string
	phase      string
	prog       *progress.Display
}

func (p *phaseProgress) set(phase string, done, total int) {
	if phase != p.phase {
		p.finish()
		p.phase, p.prog = phase, progress.New(p.w, p.verb+": "+phase, total, p.mode)
	}
	p.prog.Set(done, total)
}

func (p *phaseProgress) finish() {
	if p.prog != nil {
		p.prog.Finish()
		p.prog = nil
	}
}

func printUpSummary(w io.Writer, verb string, s *fleet.Summary) {
	c := s.Counts
	if verb == "plan" {
		fmt.Fprintf(w, "plan: %d namespaces: %d to create, %d to repair, %d unchanged, %d failed, %d skipped\n",
			s.Total, c[fleet.WouldCreate], c[fleet.WouldRepair], c[fleet.Unchanged], c[fleet.Failed], c[fleet.Skipped])
		return
	}
	status := ""
	if s.Interrupted {
		status = " (interrupted)"
	}
	if c[fleet.Created]+c[fleet.Repaired] == 0 && c[fleet.Failed]+c[fleet.Skipped] == 0 && !s.Interrupted {
		fmt.Fprintf(w, "up: %d namespaces already match the spec; nothing to do (%.2fs)\n", c[fleet.Unchanged], s.Elapsed.Seconds())
		return
	}
	fmt.Fprintf(w, "up%s: %d created, %d repaired, %d unchanged, %d failed, %d skipped in %.2fs (%.0f namespaces/s)\n",
		status, c[fleet.Created], c[fleet.Repaired], c[fleet.Unchanged], c[fleet.Failed], c[fleet.Skipped],
		s.Elapsed.Seconds(), s.Rate())
	if n := s.Total - (c[fleet.Created] + c[fleet.Repaired] + c[fleet.Unchanged] + c[fleet.Failed] + c[fleet.Skipped]); n > 0 {
		fmt.Fprintf(w, "up: %d namespaces not started; run up again to continue\n", n)
	}
}

func printMarks(w io.Writer, s *fleet.Summary, steps *fleet.StepTimes) {
	rates := s.MarkRates()
	if len(rates) == 0 {
		return
	}
	var per []map[string]time.Duration
	if steps != nil {
		per = steps.PerMark()
	}
	fmt.Fprintf(w, "%8s %10s %10s", "mark", "elapsed", "ns/s")
	for _, st := range fleet.Steps {
		fmt.Fprintf(w, " %11s", st+"/us")
	}
	fmt.Fprintln(w)
	for i, r := range rates {
		fmt.Fprintf(w, "%8d %9.2fs %10.0f", (i+1)*s.Mark, s.Marks[i].Seconds(), r)
		for _, st := range fleet.Steps {
			if i < len(per) {
				fmt.Fprintf(w, " %11.0f", float64(per[i][st].Nanoseconds())/1e3)
			}
		}
		fmt.Fprintln(w)
	}
	if len(rates) > 1 {
		fmt.Fprintf(w, "last/first mark: %.0f%%\n", 100*rates[len(rates)-1]/rates[0])
	}
}
