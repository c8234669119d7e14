package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/internal/exitcode"
	"github.com/nsfleet/nsfleet/kprof"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/spec"
	"github.com/spf13/cobra"
)

func newLs(g *globals) *cobra.Command {
	var file, prefix, output, profileDir string
	cmd := &cobra.Command{
		Use:   "ls [-f SPEC | --prefix P] [-o table|json]",
		Short: "List namespaces with their links and whether they match the spec",
		Long: `ls shows the namespaces in the run dir (all of them, those starting with a
prefix, or those a spec names) with each one's links and state:

  ok       pinned, made by nsfleet, and matching the spec (if one is given)
  drift    made by nsfleet, but different from the spec (see the DRIFT column)
  foreign  pinned, but not made by nsfleet (e.g. by 'ip netns add')
  stale    a pin file with no namespace mounted on it (left by a crash)
  missing  in the spec but not on the machine

A link is shown as name:up or name:down; a veth's host end follows its name
after '='.`,
		Example: `  nsfleet ls
  nsfleet ls --prefix bar- -o json | jq '.[] | select(.state != "ok")'
  nsfleet ls -f examples/fake-routers.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if file != "" && prefix != "" {
				return usageError{Err: fmt.Errorf("ls: give -f SPEC or --prefix P, not both")}
			}
			if output != "table" && output != "json" {
				return usageError{Err: fmt.Errorf("ls: -o %q: want table or json", output)}
			}
			var f *spec.Fleet
			if file != "" {
				var err error
				if f, err = loadSpec(file); err != nil {
					return err
				}
			}
			var st []fleet.Status
			rd, err := netns.OpenRunDir(g.runDir, false)
			switch {
			case errors.Is(err, os.ErrNotExist):
				// No run dir yet: nothing exists (and a spec's namespaces
				// are all missing).
				if f != nil {
					for _, n := range f.Names() {
						st = append(st, fleet.Status{Name: n, State: fleet.StateMissing})
					}
				}
			case err != nil:
				return fmt.Errorf("ls: %w", err)
			default:
				opts := fleet.ListOptions{Options: g.options(rd)}
				if missing := missingCaps(); len(missing) > 0 {
					opts.PinsOnly = true
					fmt.Fprintf(g.stderr, "ls: without %s only names and pins can be read; state, links, drift and processes need root\n", strings.Join(missing, " and "))
				}
				prof, perr := kprof.StartSession(profileDir)
				if perr != nil {
					return perr
				}
				prof.Mark("ls")
				var stream *jsonArray
				if output == "json" {
					// One status at a time: memory stays flat at any size.
					stream = newJSONArray(g.stdout)
					opts.OnStatus = stream.add
				}
				st, err = fleet.List(cmd.Context(), f, fleet.Selector{Prefix: prefix}, opts)
				if _, perr := prof.Finish(g.stderr); perr != nil {
					fmt.Fprintln(g.stderr, "nsfleet: ls: --profile:", perr)
				}
				if err != nil {
					stream.flush() // what was read, as before the error
					return err
				}
				if stream != nil {
					return stream.end()
				}
			}
			if output == "json" {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				if st == nil {
					st = []fleet.Status{}
				}
				return enc.Encode(st)
			}
			printStatusTable(g.stdout, st)
			if f != nil {
				for _, s := range st {
					if s.State == fleet.StateUnread {
						return &exitError{Code: exitcode.Failed, Err: fmt.Errorf("ls: cannot compare the machine with %s without root", file)}
					}
				}
				for _, s := range st {
					if s.State != fleet.StateOK {
						return &exitError{Code: exitcode.Failed, Err: fmt.Errorf("ls: the machine does not match %s", file)}
					}
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "compare with this spec and list its namespaces")
	cmd.Flags().StringVar(&prefix, "prefix", "", "only namespaces whose names start with P")
	cmd.Flags().StringVar(&profileDir, "profile", "", "sample kernel and nsfleet stacks (on- and off-CPU) into DIR while reading")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func printStatusTable(w io.Writer, st []fleet.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	withProcs := false
	for _, s := range st {
		withProcs = withProcs || len(s.Procs) > 0
	}
	if withProcs {
		fmt.Fprintln(tw, "NAME\tSTATE\tNSFLEET\tLINKS\tPROCESSES\tDRIFT")
	} else {
		fmt.Fprintln(tw, "NAME\tSTATE\tNSFLEET\tLINKS\tDRIFT")
	}
	counts := map[fleet.State]int{}
	for _, s := range st {
		counts[s.State]++
		var links []string
		for _, l := range s.Links {
			t := l.Name
			if l.Host != "" {
				t += "=" + l.Host
			}
			if l.Peer != "" {
				t += "=" + l.Peer
			}
			if l.Up {
				t += ":up"
			} else {
				t += ":down"
			}
			links = append(links, t)
		}
		drift := strings.Join(s.Drift, "; ")
		if s.Error != "" {
			drift = s.Error
		}
		owned := "no"
		if s.Owned {
			owned = "yes"
		}
		switch s.State {
		case fleet.StateMissing, fleet.StateStale:
			owned = "-"
		case fleet.StateUnread:
			owned = "?"
		}
		if withProcs {
			var procs []string
			for _, p := range s.Procs {
				if p.State == "running" {
					procs = append(procs, fmt.Sprintf("%s:%d(restarts %d)", p.Name, p.PID, p.Restarts))
				} else {
					procs = append(procs, p.Name+":"+strings.ReplaceAll(p.State, " ", "-"))
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.State, owned, strings.Join(links, " "), strings.Join(procs, " "), drift)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, s.State, owned, strings.Join(links, " "), drift)
	}
	tw.Flush()
	var parts []string
	for _, k := range []fleet.State{fleet.StateOK, fleet.StateDrift, fleet.StateForeign, fleet.StateStale, fleet.StateMissing, fleet.StateUnread, fleet.StateError} {
		if counts[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[k], k))
		}
	}
	if len(parts) == 0 {
		parts = []string{"no namespaces"}
	}
	fmt.Fprintf(w, "%d namespaces: %s\n", len(st), strings.Join(parts, ", "))
}

// jsonArray writes a JSON array element by element, indented as
// json.Encoder with SetIndent("", "  ") writes a whole one, through a
// buffer (a fleet's ls wrote one element per system call).
type jsonArray struct {
	w   *bufio.Writer
	buf bytes.Buffer
	enc *json.Encoder
	n   int
	err error
}

func newJSONArray(w io.Writer) *jsonArray {
	a := &jsonArray{w: bufio.NewWriterSize(w, 64<<10)}
	a.enc = json.NewEncoder(&a.buf)
	a.enc.SetIndent("  ", "  ")
	return a
}

func (a *jsonArray) add(v fleet.Status) {
	if a.err != nil {
		return
	}
	a.buf.Reset()
	if a.err = a.enc.Encode(v); a.err != nil {
		return
	}
	sep := ",\n  "
	if a.n == 0 {
		sep = "[\n  "
	}
	a.n++
	a.w.WriteString(sep)
	_, a.err = a.w.Write(bytes.TrimSuffix(a.buf.Bytes(), []byte("\n")))
}

// flush writes out what is buffered (nil: nothing to do).
func (a *jsonArray) flush() {
	if a != nil {
		a.w.Flush()
	}
}

func (a *jsonArray) end() error {
	if a.err != nil {
		a.w.Flush()
		return a.err
	}
	tail := "\n]\n"
	if a.n == 0 {
		tail = "[]\n"
	}
	a.w.WriteString(tail)
	return a.w.Flush()
}
