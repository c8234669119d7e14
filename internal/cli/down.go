package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/internal/exitcode"
	"github.com/nsfleet/nsfleet/internal/progress"
	"github.com/nsfleet/nsfleet/kprof"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/spf13/cobra"
)

func newDown(g *globals) *cobra.Command {
	var file, prefix, progressMode, profileDir string
	var noWait, adopt, dryRun bool
	var timeout, grace time.Duration
	cmd := &cobra.Command{
		Use:   "down (-f SPEC | --prefix P)",
		Short: "Delete a fleet in bulk and wait until the kernel has freed it",
		Long: `down deletes the namespaces a spec names (or whose names start with a
prefix) the fast way: it checks them all, then detaches and removes every
pin at once, so the kernel frees them in large batches instead of one RCU
grace period per device. It never deletes veths one by one: a veth goes with
its namespace. Supervised processes (see 'nsfleet supervise') are stopped
first: SIGTERM, then SIGKILL after --grace.

By default down then waits until the kernel has really finished: the
host-side veths are gone and the namespaces are freed. --timeout bounds the
wait and reports what is still pending (typically a namespace that a process
still holds). Namespaces nsfleet did not make are left alone unless --adopt.`,
		Example: `  nsfleet down -f examples/fake-routers.yaml
  nsfleet down --prefix bar- --timeout 10s
  nsfleet down --prefix lab- --no-wait`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if (file == "") == (prefix == "") {
				return usageError{Err: fmt.Errorf("down: give exactly one of -f SPEC or --prefix P")}
			}
			if err := needRoot("down"); err != nil {
				return err
			}
			sel := fleet.Selector{Prefix: prefix}
			if file != "" {
				f, err := loadSpec(file)
				if err != nil {
					return err
				}
				sel.Names = f.Names()
			}
			rd, lock, err := g.openRunDir(false)
			if errors.Is(err, os.ErrNotExist) {
				fmt.Fprintf(g.stdout, "down: nothing to delete (%s does not exist)\n", g.runDir)
				return nil
			}
			if err != nil {
				return fmt.Errorf("down: %w", err)
			}
			defer lock.Unlock()
			opts := fleet.DownOptions{Options: g.options(rd), DryRun: dryRun, Wait: !noWait, Timeout: timeout}
			opts.Adopt, opts.Grace = adopt, grace
			prof, err := kprof.StartSession(profileDir)
			if err != nil {
				return err
			}
			prof.Mark("check")
			dp := &downProgress{w: g.stderr, mode: progressMode, prof: prof, phase: "check"}
			opts.OnProgress = dp.on
			errs := &errorLog{w: g.stderr}
			opts.OnResult = func(r fleet.Result) {
				if r.Err != nil {
					errs.print(dp.prog, r.Err.Error())
				}
			}
			rep, err := fleet.Down(cmd.Context(), sel, opts)
			if dp.prog != nil {
				dp.prog.Finish()
			}
			if _, perr := prof.Finish(g.stderr); perr != nil {
				fmt.Fprintln(g.stderr, "nsfleet: down: --profile:", perr)
			}
			what := "-f " + file
			if file == "" {
				what = "--prefix " + prefix
			}
			errs.flush(g.stderr, "down", what)
			if err != nil {
				return err
			}
			printDownReport(g.stdout, &rep, dryRun)
			if rep.Interrupted {
				return &exitError{Code: exitcode.Interrupted, Err: fmt.Errorf("down: %w", fleet.ErrInterrupted)}
			}
			if len(rep.Pending) > 0 {
				return &exitError{Code: exitcode.Failed, Err: fmt.Errorf("down: kernel cleanup still pending: nothing freed for %s", timeout)}
			}
			if err := rep.Err(); err != nil {
				return &exitError{Code: exitcode.Failed, Err: fmt.Errorf("down: %w", err)}
			}
			if !dryRun {
				releaseRunDir(g, rd)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "spec file naming the namespaces to delete")
	cmd.Flags().StringVar(&prefix, "prefix", "", "delete the namespaces whose names start with P")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the pins are removed, without waiting for the kernel")
	cmd.Flags().DurationVar(&timeout, "timeout", 60*time.Second, "how long the kernel may go without freeing anything before down reports what is pending")
	cmd.Flags().BoolVar(&adopt, "adopt", false, "also delete matching namespaces that nsfleet did not make")
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "how long supervised processes get between SIGTERM and SIGKILL")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "say what would be deleted and change nothing")
	cmd.Flags().StringVar(&progressMode, "progress", "auto", "progress display: auto, bar, plain, none")
	cmd.Flags().StringVar(&profileDir, "profile", "", "sample kernel and nsfleet stacks (on- and off-CPU) into DIR, one range per phase (check, delete, wait)")
	return cmd
}

func printDownReport(w io.Writer, r *fleet.DownReport, dryRun bool) {
	c := r.Counts
	if r.Total == 0 {
		fmt.Fprintln(w, "down: nothing to delete")
		return
	}
	if dryRun {
		fmt.Fprintf(w, "down (dry run): would delete %d namespaces", c[fleet.WouldDelete])
		if n := c[fleet.Skipped] + c[fleet.Failed]; n > 0 {
			fmt.Fprintf(w, "; %d would be left (not nsfleet's, or failing)", n)
		}
		fmt.Fprintln(w)
		return
	}
	fmt.Fprintf(w, "down: %d deleted, %d skipped, %d failed; pins removed in %.2fs\n",
		c[fleet.Deleted], c[fleet.Skipped], c[fleet.Failed], r.Unpinned.Seconds())
	if r.StaleRemove > 0 {
		fmt.Fprintf(w, "down: %d of them were pin files with no namespace (left by a crash)\n", r.StaleRemove)
	}
	if !r.Waited {
		return
	}
	if len(r.Pending) > 0 {
		fmt.Fprintf(w, "down: still pending:\n")
		for i, p := range r.Pending {
			if i == 20 {
				fmt.Fprintf(w, "  ... and %d more\n", len(r.Pending)-20)
				break
			}
			fmt.Fprintf(w, "  %s\n", p)
		}
		return
	}
	fmt.Fprintf(w, "down: kernel finished in %.2fs: %d host veths gone at %.2fs, namespaces freed at %.2fs\n",
		r.Freed.Seconds(), r.HostVeths, r.LinksGone.Seconds(), r.Freed.Seconds())
}

// releaseRunDir turns a private run dir left empty back into a plain
// directory, so that removing it just works (netns.RunDir.Release).
func releaseRunDir(g *globals, rd *netns.RunDir) {
	if released, err := rd.Release(); err != nil {
		fmt.Fprintln(g.stderr, "nsfleet: down:", err)
	} else if released {
		fmt.Fprintf(g.stdout, "down: run dir %s is empty: nsfleet's bind mount on it removed\n", rd.Path)
	}
}

// downProgress shows down's phases: a bar while the pins are removed,
// then one line while the kernel frees them (it unregisters a whole batch
// of devices under one lock, so there is nothing finer to show); each
// phase is a range of --profile.
type downProgress struct {
	w       io.Writer
	mode    string
	prof    *kprof.Session
	phase   string
	prog    *progress.Display
	waiting bool
}

func (d *downProgress) on(ph string, done, total int) {
	if ph != d.phase {
		d.phase = ph
		d.prof.Mark(ph)
	}
	switch {
	case ph == "delete":
		if d.prog == nil {
			d.prog = progress.New(d.w, "down: unpin", total, d.mode)
		}
		d.prog.Set(done, total)
	case !d.waiting && d.mode != "none":
		d.waiting = true
		if d.prog != nil {
			d.prog.Finish()
		}
		fmt.Fprintf(d.w, "down: waiting for the kernel to free them (%d host veths left)\n", total-done)
	}
}
