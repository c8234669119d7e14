package clustercli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nsfleet/nsfleet/cluster"
	"github.com/nsfleet/nsfleet/internal/version"
	"github.com/nsfleet/nsfleet/spec"
	"github.com/spf13/cobra"
)

func newCluster(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Apply a spec to the cluster, show it, drain and uncordon nodes",
		Long: `cluster talks to the cluster's etcd (--etcd, NSFLEET_ETCD, or the agent's
embedded default on this machine). The cluster serves the specs applied to
it, each under a name: 'apply' stores one (after checking all of it, as
'nsfleet up' does, and against the others), the elected scheduler spreads
their namespaces over the live nodes, and every agent makes its node match.`,
	}
	cmd.AddCommand(newApply(g), newDelete(g), newStatus(g), newDrain(g), newUncordon(g), newFailover(g), newWait(g), newMigrate(g))
	return cmd
}

func readSpec(file string) ([]byte, *spec.Fleet, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	f, err := spec.Parse(file, data, spec.Options{})
	if err != nil {
		return nil, nil, err
	}
	return data, f, nil
}

func newApply(g *globals) *cobra.Command {
	var file, name string
	var dry bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "apply -f SPEC [--name NAME] [--dry-run]",
		Short: "Store a spec under a name; only what changed is written",
		Long: `apply checks the whole file (as 'nsfleet up' does) and against every other
stored spec: a namespace or host interface that another spec has is refused,
with both places. Then it compares the file with what is stored under the
spec's name (--name, default the file's base name) and writes only the
namespaces added, changed or removed, one key each: a file with one router
changed writes that router's key and the spec's record. Applying the same
file again writes nothing.

A large apply is written in several transactions (each within etcd's
defaults); agents may start on its first namespaces before the last are
written. Namespaces that leave the spec are torn down by the nodes that
serve them. Several specs live side by side; 'cluster delete NAME' removes
one.`,
		Example: `  nsfleet cluster apply -f examples/fake-routers.yaml
  nsfleet cluster apply -f routers.yaml --dry-run     # what would change
  nsfleet cluster apply -f lab.yaml --name lab-2 && nsfleet cluster wait`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" {
				return usageError{Err: fmt.Errorf("cluster apply: -f SPEC is required")}
			}
			if name == "" {
				name = cluster.DefaultSpecName(file)
			}
			if err := cluster.ValidSpecName(name); err != nil {
				return usageError{Err: fmt.Errorf("cluster apply: --name: %w", err)}
			}
			_, f, err := readSpec(file)
			if err != nil {
				return err // file:line: what is wrong; nothing stored
			}
			cli, err := g.connect(cmd.Context(), "cluster apply")
			if err != nil {
				return err
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			o := cluster.ApplyOptions{Name: name, Source: file, DryRun: dry, Version: version.String()}
			o.Progress = progress(g.stderr, "cluster apply: written")
			start := time.Now()
			res, err := cluster.Apply(ctx, cli, f, o)
			if err != nil {
				return fmt.Errorf("cluster apply: spec %s (%s): %w", name, file, err)
			}
			printApply(g.stdout, res, file, len(f.Namespaces), dry, time.Since(start))
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "spec file (YAML)")
	cmd.Flags().StringVar(&name, "name", "", "store the spec under this name (default: the file's base name)")
	cmd.Flags().BoolVar(&dry, "dry-run", false, "show what would be written; write nothing")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long")
	return cmd
}

// progress returns a callback that reports long writes about once a second.
func progress(w io.Writer, what string) func(done, total int) {
	last := time.Now()
	return func(done, total int) {
		if time.Since(last) >= time.Second && done < total {
			fmt.Fprintf(w, "%s %d of %d keys\n", what, done, total)
			last = time.Now()
		}
	}
}

func printApply(w io.Writer, r cluster.ApplyResult, file string, count int, dry bool, took time.Duration) {
	counts := fmt.Sprintf("%d added, %d changed, %d removed, %d unchanged", r.Added, r.Changed, r.Removed, r.Unchanged)
	switch {
	case r.Keys == 0:
		fmt.Fprintf(w, "cluster apply: spec %s (%s, %d namespaces) is stored as it is; nothing written\n", r.Name, file, count)
	case dry:
		fmt.Fprintf(w, "cluster apply --dry-run: spec %s (%s): %s; would write %d keys in %d transactions; nothing written\n",
			r.Name, file, counts, r.Keys, r.Txns)
	default:
		fmt.Fprintf(w, "cluster apply: spec %s (%s): %s; %d keys written in %d transactions (revision %d, %s)\n",
			r.Name, file, counts, r.Keys, r.Txns, r.Rev, took.Round(time.Millisecond))
	}
}

func newDelete(g *globals) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "delete NAME | -f SPEC",
		Short: "Remove a stored spec: the nodes tear down its namespaces",
		Long: `delete removes the spec stored under NAME (or under the name -f SPEC is
applied with: its file's base name) with all its namespaces, in one
transaction. The nodes that serve them tear them down; other specs are not
touched. 'cluster status' lists the stored specs.`,
		Example: `  nsfleet cluster delete fake-routers
  nsfleet cluster delete -f examples/fake-routers.yaml`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var name string
			switch {
			case len(args) == 1 && file == "":
				name = args[0]
			case len(args) == 0 && file != "":
				name = cluster.DefaultSpecName(file)
			default:
				return usageError{Err: fmt.Errorf("cluster delete: give the spec's NAME or -f SPEC (one of them)")}
			}
			cli, err := g.connect(cmd.Context(), "cluster delete")
			if err != nil {
				return err
			}
			defer cli.Close()
			ctx, cancel := g.rpc(cmd.Context())
			defer cancel()
			res, err := cluster.Delete(ctx, cli, name)
			if err != nil {
				return fmt.Errorf("cluster delete: %w", err)
			}
			fmt.Fprintf(g.stdout, "cluster delete: spec %s removed (%d namespaces, revision %d); nodes are tearing them down (see nsfleet cluster status)\n",
				name, res.Namespaces, res.Rev)
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "the spec file (its base name is the spec's name)")
	return cmd
}

func newMigrate(g *globals) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "migrate [--name NAME]",
		Short: "Move a running cluster from key layout 1 to 2 (one step of an upgrade)",
		Long: `migrate moves a cluster made by a version that stored the whole spec in one
etcd value (key layout 1) to this version's layout, while it serves:

  1. run 'nsfleet cluster migrate' once, from any machine;
  2. restart the agents with this version, one node at a time.

migrate freezes layout 1 (its agents keep serving what they hold, and its
scheduler moves nothing), then copies the spec under NAME (default: its
file's base name), every node's assignment as it stands, cordons and held
failovers. Each restarted agent adopts its node's lease and assignment:
nothing moves and no namespace is re-created. Until a node is restarted,
'cluster status' shows it as legacy; if it dies meanwhile, its namespaces
fail over to the upgraded nodes. An agent of this version started before
migrate refuses to join (its node fails over as a dead one). Running
migrate again finishes a migration cut short.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if name != "" {
				if err := cluster.ValidSpecName(name); err != nil {
					return usageError{Err: fmt.Errorf("cluster migrate: --name: %w", err)}
				}
			}
			cli, err := g.connect(cmd.Context(), "cluster migrate")
			if err != nil {
				return err
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Minute)
			defer cancel()
			res, err := cluster.Migrate(ctx, cli, name, version.String())
			if err != nil {
				return fmt.Errorf("cluster migrate: %w", err)
			}
			fmt.Fprintf(g.stdout, "cluster migrate: layout 1 frozen; spec stored as %s (%d namespaces, %d keys); assignments of %d nodes (%d namespaces) copied. Now restart each agent with this version.\n",
				res.Spec, res.Apply.Added+res.Apply.Changed+res.Apply.Unchanged, res.Apply.Keys, res.Nodes, res.Assigned)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the name to store layout 1's spec under (default: its file's base name)")
	return cmd
}

func newStatus(g *globals) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Nodes, leases, assigned vs ready, and the last failovers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return usageError{Err: fmt.Errorf("cluster status: -o %q: want text or json", output)}
			}
			cli, err := g.connect(cmd.Context(), "cluster status")
			if err != nil {
				return err
			}
			defer cli.Close()
			ctx, cancel := g.rpc(cmd.Context())
			defer cancel()
			r, err := cluster.Status(ctx, cli)
			if err != nil {
				return fmt.Errorf("cluster status: %w", err)
			}
			if output == "json" {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			}
			printStatus(g.stdout, r)
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

func printStatus(w io.Writer, r *cluster.Report) {
	if len(r.Specs) == 0 {
		fmt.Fprintln(w, "specs: none applied")
	} else {
		fmt.Fprintf(w, "namespaces: %d stored (revision %d): %d assigned, %d ready, %d unassigned\n",
			r.SpecCount, r.SpecRev, r.Assigned, r.Ready, r.Unassigned)
		for _, sp := range r.Specs {
			fmt.Fprintf(w, "spec %s: %d namespaces from %s, applied %s\n", sp.Name, sp.Namespaces, sp.Source, sp.Applied.Format(time.RFC3339))
		}
		if r.Links > 0 {
			fmt.Fprintf(w, "links: %d, %d cut (their two namespaces on two nodes: a VXLAN tunnel each)\n", r.Links, r.LinksCut)
		}
	}
	if r.Scheduler != "" {
		fmt.Fprintf(w, "scheduler: %s\n", r.Scheduler)
	}
	for _, u := range r.Unreadable {
		fmt.Fprintf(w, "unreadable: %s\n", u)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tLEASE\tCAPACITY\tASSIGNED\tREADY\tSTATE\tPROCESSES")
	for _, n := range r.Nodes {
		lease := "expired"
		if n.Alive {
			lease = "alive"
			if n.LeaseTTL >= 0 {
				lease += " (" + strconv.FormatInt(n.LeaseTTL, 10) + "s)"
			}
		}
		capacity := "-"
		if n.Capacity > 0 {
			capacity = strconv.Itoa(n.Capacity)
		}
		var state []string
		switch {
		case !n.Alive && n.Held:
			state = append(state, "lost, failover held (most nodes lost at once: 'nsfleet cluster failover "+n.Name+"' moves its namespaces)")
		case !n.Alive:
			state = append(state, "lost")
		case n.Fenced:
			state = append(state, "fenced")
		case n.Converged:
			state = append(state, "ready")
		default:
			state = append(state, "converging")
		}
		if n.Cordoned {
			state = append(state, "cordoned")
		}
		if n.Releasing > 0 {
			state = append(state, fmt.Sprintf("releasing %d", n.Releasing))
		}
		if n.Failed > 0 {
			state = append(state, fmt.Sprintf("%d failed", n.Failed))
		}
		if n.Refused != "" {
			state = append(state, "refuses spec: "+n.Refused)
		}
		procs := "refused"
		if n.AllowProcesses {
			procs = "allowed"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", n.Name, lease, capacity, n.Assigned, n.Ready, strings.Join(state, ", "), procs)
	}
	tw.Flush()
	for _, n := range r.Nodes {
		for _, e := range n.Errors {
			fmt.Fprintf(w, "  %s: %s\n", n.Name, e)
		}
	}
	if len(r.Failovers) > 0 {
		fmt.Fprintln(w, "failovers (newest first):")
		for _, f := range r.Failovers {
			took := "in progress"
			if !f.Ready.IsZero() {
				took = fmt.Sprintf("all ready after %.2fs", f.Seconds)
			}
			extra := ""
			if f.Unassigned > 0 {
				extra = fmt.Sprintf(", %d without room", f.Unassigned)
			}
			fmt.Fprintf(w, "  %s  %s lost: %d namespaces moved%s, %s\n", f.Detected.Local().Format(time.DateTime), f.Node, f.Moved, extra, took)
		}
	}
}

func newDrain(g *globals) *cobra.Command {
	var reason string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "drain NODE",
		Short: "Move a node's namespaces away before maintenance; it takes none until uncordon",
		Long: `drain cordons NODE: the scheduler moves its namespaces to other nodes, each
one torn down on NODE before it is created elsewhere, and gives NODE no new
ones until 'nsfleet cluster uncordon NODE'. With --wait, drain returns when
NODE serves nothing (or the wait ends, exit 1).`,
		Example: `  nsfleet cluster drain gw-2 --wait 5m && systemctl reboot`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			node := args[0]
			cli, err := g.connect(cmd.Context(), "cluster drain")
			if err != nil {
				return err
			}
			defer cli.Close()
			ctx, cancel := g.rpc(cmd.Context())
			err = cluster.Drain(ctx, cli, node, reason)
			cancel()
			if err != nil {
				return fmt.Errorf("cluster drain: %w", err)
			}
			fmt.Fprintf(g.stdout, "cluster drain: %s cordoned; its namespaces are moving\n", node)
			if wait <= 0 {
				return nil
			}
			wctx, wcancel := context.WithTimeout(cmd.Context(), wait)
			defer wcancel()
			for {
				r, err := cluster.Status(wctx, cli)
				if err == nil {
					left := 0
					for _, n := range r.Nodes {
						if n.Name == node {
							left = n.Assigned + n.Releasing
						}
					}
					if left == 0 {
						fmt.Fprintf(g.stdout, "cluster drain: %s serves nothing\n", node)
						return nil
					}
				}
				select {
				case <-wctx.Done():
					return fmt.Errorf("cluster drain: %s still serves namespaces after %s", node, wait)
				case <-time.After(250 * time.Millisecond):
				}
			}
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, shown in status")
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long until the node serves nothing")
	return cmd
}

func newUncordon(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "uncordon NODE",
		Short: "Let a drained node take namespaces again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cli, err := g.connect(cmd.Context(), "cluster uncordon")
			if err != nil {
				return err
			}
			defer cli.Close()
			ctx, cancel := g.rpc(cmd.Context())
			defer cancel()
			was, err := cluster.Uncordon(ctx, cli, args[0])
			if err != nil {
				return fmt.Errorf("cluster uncordon: %w", err)
			}
			if !was {
				fmt.Fprintf(g.stdout, "cluster uncordon: %s was not cordoned\n", args[0])
				return nil
			}
			fmt.Fprintf(g.stdout, "cluster uncordon: %s takes namespaces again\n", args[0])
			return nil
		},
	}
}

func newFailover(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "failover NODE",
		Short: "Move a lost node's namespaces although most nodes are lost at once",
		Long: `When more than half of the nodes lose their leases at once, the scheduler
moves none of their namespaces: that is far likelier a network or etcd failure
than half the gateways dying together, and moving everything would turn it
into an outage when they come back ('cluster status' shows "failover held").
If NODE is really gone, failover orders its namespaces moved to the live nodes
now. It refuses a node that is alive (drain it instead).`,
		Example: `  nsfleet cluster status          # node-2 lost, failover held
  nsfleet cluster failover node-2`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cli, err := g.connect(cmd.Context(), "cluster failover")
			if err != nil {
				return err
			}
			defer cli.Close()
			ctx, cancel := g.rpc(cmd.Context())
			defer cancel()
			if err := cluster.ForceFailover(ctx, cli, args[0]); err != nil {
				return fmt.Errorf("cluster failover: %w", err)
			}
			fmt.Fprintf(g.stdout, "cluster failover: %s's namespaces are moving to the live nodes\n", args[0])
			return nil
		},
	}
}

func newWait(g *globals) *cobra.Command {
	var timeout time.Duration
	var what string
	cmd := &cobra.Command{
		Use:   "wait [NAMESPACE...] [--timeout D]",
		Short: "Wait until every stored namespace, or the named ones, is ready in the kernels",
		Long: `wait returns when every stored namespace (of every spec; or each one named)
is ready: held by a live node that reports, from its kernel, that it
matches what is stored and assigned as of the last apply. Status is written
by a node only after the engine confirmed every namespace it holds, so a
script can chain on it: apply, wait, then use the routers.

Exit 0 when ready, 1 at the timeout (saying what is still pending).`,
		Example: `  nsfleet cluster apply -f fleet.yaml && nsfleet cluster wait --timeout 2m
  nsfleet cluster wait qrouter-17 qrouter-18`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if what != "ready" {
				return usageError{Err: fmt.Errorf("cluster wait: --for %q: only ready is known", what)}
			}
			cli, err := g.connect(cmd.Context(), "cluster wait")
			if err != nil {
				return err
			}
			defer cli.Close()
			start := time.Now()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			last := ""
			for {
				rctx, rcancel := g.rpc(ctx)
				readStart := time.Now()
				snap, err := cluster.Read(rctx, cli)
				rcancel()
				// Each read is every namespace's name: at 40,000 it costs
				// etcd tens of ms, so poll less often than that costs.
				pause := max(100*time.Millisecond, 5*time.Since(readStart))
				if err == nil {
					if last = cluster.Pending(snap, args); last == "" {
						what := "every stored namespace"
						if len(args) > 0 {
							what = fmt.Sprintf("%d namespaces", len(args))
						}
						fmt.Fprintf(g.stdout, "cluster wait: %s ready (revision %d) after %s\n", what, snap.SpecRev, time.Since(start).Round(time.Millisecond))
						return nil
					}
				} else {
					last = err.Error()
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("cluster wait: not ready after %s: %s", timeout, last)
				case <-time.After(pause):
				}
			}
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "give up after this long (exit 1)")
	cmd.Flags().StringVar(&what, "for", "ready", "the condition (ready)")
	return cmd
}
