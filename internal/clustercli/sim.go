package clustercli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nsfleet/nsfleet/cluster"
	"github.com/nsfleet/nsfleet/cluster/sim"
	"github.com/nsfleet/nsfleet/internal/caps"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func newSim(g *globals) *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "A whole cluster on one machine: nodes, a 3-member etcd, real agents",
		Long: `sim makes a cluster on this machine for trying nsfleet's cluster and for
its tests, as kind does for Kubernetes. Each node is a network namespace and
a mount namespace of its own (its own run dir and pins; host-side veth names
repeat across nodes as on real machines) with a real agent process inside.
The three etcd members run in a hub namespace that the nodes reach over
veths (test addresses from 198.18.0.0/15 only); DIR/etcd.env holds the
NSFLEET_ETCD that reaches them from here.`,
		Example: `  nsfleet sim up --nodes 3 --dir /tmp/sim
  export $(cat /tmp/sim/etcd.env)
  nsfleet cluster apply -f examples/fake-routers.yaml
  nsfleet cluster status
  nsfleet sim kill node-2 --dir /tmp/sim       # power loss
  nsfleet sim ls --dir /tmp/sim                # what each node really has
  nsfleet sim down --dir /tmp/sim`,
	}
	cmd.PersistentFlags().StringVar(&dir, "dir", "", "the sim's directory (required)")
	need := func(op string) error {
		if dir == "" {
			return usageError{Err: fmt.Errorf("sim %s: --dir DIR is required", op)}
		}
		return caps.Need("sim " + op)
	}
	cmd.AddCommand(simUp(g, &dir, need), simLs(g, &dir, need), simDown(g, &dir, need), simAdd(g, &dir, need),
		simNodeOp(g, &dir, need, "kill", "Power loss: kill NODE's agent and processes, remove the node with everything in it", sim.Kill),
		simRestart(g, &dir, need),
		simNodeOp(g, &dir, need, "partition", "Cut NODE's network path to etcd; its agent keeps running", sim.Partition),
		simNodeOp(g, &dir, need, "heal", "Restore NODE's network path to etcd", sim.Heal),
		simCampaign(g, &dir, need), simProxy())
	return cmd
}

func simCampaign(g *globals, dir *string, need func(string) error) *cobra.Command {
	var o sim.CampaignOptions
	var output, faults, trace string
	cmd := &cobra.Command{
		Use:   "campaign --dir DIR [--duration D] [--seed N]",
		Short: "Random faults for a while, checked against every node's kernel",
		Long: `campaign is a nemesis: for --duration it applies random faults to the sim,
one at a time (apply, hold one to three lease TTLs, undo, wait until settled):
kill a node and add a new one, partition a node and heal it, pause an agent
and resume it, stop one etcd member, stop two (quorum lost), restart an agent,
kill an etcd member and restart it. A checker samples every node's kernel
every 100 ms (which routers have their host veth up where; not etcd) and
reports every router up on two nodes for longer than --double-bound, and
every router up on no node for longer than --absent-bound (default the lease
TTL plus 5 s). Exit 1 on any violation.

The routers are the stored spec's namespaces, each watched by its first
veth's host end: apply a spec whose veths are up first. --plant makes one
violation on purpose (a router's host veth made up by hand on a second node
for 3 s): the run succeeds only if the checker reports it.`,
		Example: `  nsfleet sim up --nodes 3 --dir /tmp/sim && export $(cat /tmp/sim/etcd.env)
  nsfleet cluster apply -f routers-up.yaml
  nsfleet sim campaign --dir /tmp/sim --duration 30m --seed 7`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := need("campaign"); err != nil {
				return err
			}
			st, err := sim.Load(*dir)
			if err != nil {
				return fmt.Errorf("sim campaign: %w", err)
			}
			if st.LeaseTTL != "" {
				if o.TTL, err = time.ParseDuration(st.LeaseTTL); err != nil {
					return fmt.Errorf("sim campaign: lease TTL %q: %w", st.LeaseTTL, err)
				}
			}
			if faults != "" {
				for _, f := range strings.Split(faults, ",") {
					if !slices.Contains(sim.AllFaults, sim.Fault(f)) {
						return usageError{Err: fmt.Errorf("sim campaign: unknown fault %q (known: %v)", f, sim.AllFaults)}
					}
					o.Faults = append(o.Faults, sim.Fault(f))
				}
			}
			cli, err := cluster.Connect(cmd.Context(), g.clientConfig([]string{"http://" + st.ProxyAddr}))
			if err != nil {
				return fmt.Errorf("sim campaign: %w", err)
			}
			defer cli.Close()
			o.Healthy = func() string { return campaignHealth(cmd.Context(), cli) }
			if o.Routers, err = campaignRouters(cmd.Context(), cli); err != nil {
				return fmt.Errorf("sim campaign: %w", err)
			}
			o.Dir = *dir
			if trace != "" {
				tf, err := os.Create(trace)
				if err != nil {
					return fmt.Errorf("sim campaign: %w", err)
				}
				defer tf.Close()
				var mu sync.Mutex
				o.Trace = func(line string) {
					mu.Lock()
					fmt.Fprintln(tf, line)
					mu.Unlock()
				}
			}
			o.Log = func(f string, a ...any) { fmt.Fprintf(g.stderr, f+"\n", a...) }
			rep, err := sim.Campaign(cmd.Context(), o)
			if rep != nil {
				if output == "json" {
					enc := json.NewEncoder(g.stdout)
					enc.SetIndent("", "  ")
					enc.Encode(rep)
				} else {
					printCampaign(g.stdout, rep, o)
				}
			}
			if err != nil {
				return err
			}
			if !rep.OK() {
				return fmt.Errorf("sim campaign: violations found")
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&o.Duration, "duration", 3*time.Minute, "how long to apply faults")
	fl.Uint64Var(&o.Seed, "seed", 1, "random seed (the same seed, the same faults)")
	fl.StringVar(&faults, "faults", "", "comma-separated faults to choose from (default all: "+fmt.Sprint(sim.AllFaults)+")")
	fl.DurationVar(&o.DoubleBound, "double-bound", time.Second, "longest a router may be up on two nodes")
	fl.DurationVar(&o.AbsentBound, "absent-bound", 0, "longest a router may be up on no node (0: lease TTL + 5s)")
	fl.BoolVar(&o.Plant, "plant", false, "plant one violation to show the checker catches it")
	fl.StringVar(&trace, "trace", "", "write every fault and every change of where a router is up, with the time, to this file")
	fl.StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

// campaignHealth says what keeps the cluster from being healthy: etcd
// answering, every namespace assigned, every live node converged.
func campaignHealth(ctx context.Context, cli *clientv3.Client) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, err := cluster.Status(ctx, cli)
	if err != nil {
		return "etcd: " + err.Error()
	}
	if r.Unassigned > 0 {
		return fmt.Sprintf("%d unassigned", r.Unassigned)
	}
	for _, n := range r.Nodes {
		if n.Alive && (!n.Converged || n.Fenced) {
			return n.Name + " not converged"
		}
	}
	return ""
}

// campaignRouters maps the first host veth of every namespace of the
// stored spec to its namespace: what the checker watches.
func campaignRouters(ctx context.Context, cli *clientv3.Client) (map[string]string, error) {
	nss, err := cluster.Namespaces(ctx, cli)
	if err != nil {
		return nil, err
	}
	if len(nss) == 0 {
		return nil, fmt.Errorf("no spec applied: apply one whose veths are up first")
	}
	routers := map[string]string{}
	for _, ns := range nss {
		if len(ns.Veths) > 0 {
			routers[ns.Veths[0].Host] = ns.Name
		}
	}
	return routers, nil
}

func printCampaign(w io.Writer, r *sim.CampaignReport, o sim.CampaignOptions) {
	var faults []string
	total := 0
	for _, f := range sim.AllFaults {
		if n := r.Faults[f]; n > 0 {
			faults = append(faults, fmt.Sprintf("%s %d", f, n))
			total += n
		}
	}
	fmt.Fprintf(w, "campaign: seed %d, %s, %d routers, %d faults (%s), %d samples\n",
		r.Seed, r.Duration.Round(time.Second), r.Routers, total, strings.Join(faults, ", "), r.Samples)
	fmt.Fprintf(w, "worst up on two nodes: %s (bound %s)\n", orNone(r.WorstDouble), o.DoubleBound)
	fmt.Fprintf(w, "worst up on no node:   %s\n", orNone(r.WorstAbsent))
	for _, f := range sim.AllFaults {
		if d, ok := r.SettleTimes[f]; ok {
			fmt.Fprintf(w, "longest settle after %s: %s\n", f, d.Round(time.Millisecond))
		}
	}
	for _, u := range r.Unsettled {
		fmt.Fprintf(w, "UNSETTLED %s\n", u)
	}
	for _, v := range r.Violations {
		fmt.Fprintf(w, "VIOLATION %s\n", v)
	}
	if r.Planted != "" {
		fmt.Fprintf(w, "planted violation on %s: caught %v\n", r.Planted, r.Caught)
	}
	verdict := "no violation"
	if !r.OK() {
		verdict = fmt.Sprintf("%d violations, %d unsettled", len(r.Violations), len(r.Unsettled))
	}
	fmt.Fprintf(w, "campaign: %s\n", verdict)
}

func orNone(w sim.Window) string {
	if w.Router == "" {
		return "none"
	}
	return w.String()
}

func simUp(g *globals, dir *string, need func(string) error) *cobra.Command {
	var nodes, capacity int
	var ttl, wait time.Duration
	var procs bool
	var agentBin string
	cmd := &cobra.Command{
		Use:   "up --nodes N --dir DIR",
		Short: "Make the sim and wait until every node has joined",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := need("up"); err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			st, err := sim.Up(cmd.Context(), sim.Options{Dir: *dir, Nodes: nodes, Binary: self, AgentBinary: agentBin, LeaseTTL: ttl,
				Capacity: capacity, AllowProcesses: procs, Log: func(f string, a ...any) { fmt.Fprintf(g.stderr, "sim: "+f+"\n", a...) }})
			if err != nil {
				return err
			}
			if err := waitNodes(cmd.Context(), g, st, nodes, wait); err != nil {
				return fmt.Errorf("sim up: %w (the sim is left up for a look: nsfleet sim down --dir %s removes it)", err, st.Dir)
			}
			fmt.Fprintf(g.stdout, "sim: %d nodes and a 3-member etcd up in %s\n", nodes, st.Dir)
			fmt.Fprintf(g.stdout, "sim: to reach it from here: export $(cat %s)\n", filepath.Join(st.Dir, "etcd.env"))
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&nodes, "nodes", 3, "number of nodes")
	f.IntVar(&capacity, "capacity", 0, "each agent's --capacity (0: no limit)")
	f.DurationVar(&ttl, "lease-ttl", 0, "each agent's --lease-ttl (0: the agent's default, 5s)")
	f.BoolVar(&procs, "allow-processes", false, "agents serve specs with processes")
	f.StringVar(&agentBin, "agent-binary", "", "run the agents from this nsfleet-cluster (another version), not this one")
	f.DurationVar(&wait, "wait", 90*time.Second, "how long to wait for etcd and the agents")
	return cmd
}

// waitNodes waits until etcd answers through the proxy and n nodes are alive.
func waitNodes(ctx context.Context, g *globals, st *sim.Cluster, n int, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	cfg := g.clientConfig([]string{"http://" + st.ProxyAddr})
	var last error
	for ctx.Err() == nil {
		cli, err := cluster.Connect(ctx, cfg)
		if err == nil {
			r, err := cluster.Status(ctx, cli)
			cli.Close()
			if err == nil {
				alive := 0
				for _, nd := range r.Nodes {
					if nd.Alive {
						alive++
					}
				}
				if alive >= n {
					return nil
				}
				last = fmt.Errorf("%d of %d nodes joined (agent logs: %s/nodes/*/agent.log)", alive, n, st.Dir)
			} else {
				last = err
			}
		} else {
			last = err
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %s: %v", wait, last)
}

func simLs(g *globals, dir *string, need func(string) error) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "ls --dir DIR",
		Short: "The namespaces each node really has (from its mount table, not from etcd)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := need("ls"); err != nil {
				return err
			}
			m, err := sim.Ls(*dir)
			if err != nil {
				return fmt.Errorf("sim ls: %w", err)
			}
			if output == "json" {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(m)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tNAMESPACES\tFIRST")
			for _, node := range sortedNodes(m) {
				names := m[node]
				first := names[:min(len(names), 5)]
				more := ""
				if len(names) > 5 {
					more = " ..."
				}
				fmt.Fprintf(tw, "%s\t%d\t%s%s\n", node, len(names), strings.Join(first, " "), more)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

func sortedNodes(m map[string][]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	// node-2 before node-10
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && less(out[j], out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func less(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

func simDown(g *globals, dir *string, need func(string) error) *cobra.Command {
	return &cobra.Command{
		Use:   "down --dir DIR",
		Short: "Remove the sim and everything in it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := need("down"); err != nil {
				return err
			}
			if err := sim.Down(*dir, nil); err != nil {
				return fmt.Errorf("sim down: %w", err)
			}
			fmt.Fprintf(g.stdout, "sim: %s removed\n", *dir)
			return nil
		},
	}
}

func simAdd(g *globals, dir *string, need func(string) error) *cobra.Command {
	return &cobra.Command{
		Use:   "add --dir DIR",
		Short: "Add a node (the scheduler moves to it what balance needs)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := need("add"); err != nil {
				return err
			}
			n, err := sim.Add(*dir)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "sim: %s added\n", n.Name)
			return nil
		},
	}
}

func simRestart(g *globals, dir *string, need func(string) error) *cobra.Command {
	var binary string
	cmd := simNodeOp(g, dir, need, "restart", "Kill NODE's agent (SIGKILL) and start a new one in the same node",
		func(dir, node string) error { return sim.Restart(dir, node, binary) })
	cmd.Long = `restart kills NODE's agent as a crash would and starts a new one in the same
node: its namespaces and processes stay, and the new agent adopts its lease.
With --binary, the new agent (and the node's next ones) is that
nsfleet-cluster: rehearse an upgrade node by node.`
	cmd.Example = `  nsfleet sim restart node-2 --dir /tmp/sim
  nsfleet sim restart node-2 --dir /tmp/sim --binary ./new/nsfleet-cluster`
	cmd.Flags().StringVar(&binary, "binary", "", "the nsfleet-cluster to run the node's agent from now on")
	return cmd
}

func simNodeOp(g *globals, dir *string, need func(string) error, op, short string, fn func(dir, node string) error) *cobra.Command {
	return &cobra.Command{
		Use:   op + " NODE --dir DIR",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := need(op); err != nil {
				return err
			}
			if err := fn(*dir, args[0]); err != nil {
				return fmt.Errorf("sim %s: %w", op, err)
			}
			fmt.Fprintf(g.stdout, "sim: %s %s\n", op, args[0])
			return nil
		},
	}
}

func simProxy() *cobra.Command {
	var hub, addrFile, to string
	cmd := &cobra.Command{
		Use:    "__sim-proxy",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return sim.Proxy(cmd.Context(), hub, addrFile, strings.Split(to, ","))
		},
	}
	cmd.Flags().StringVar(&hub, "hub", "", "hub namespace pin")
	cmd.Flags().StringVar(&addrFile, "addr-file", "", "where to write the listening address")
	cmd.Flags().StringVar(&to, "to", "", "etcd client URLs in the hub")
	return cmd
}
