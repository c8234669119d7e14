package clustercli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nsfleet/nsfleet/cluster"
	"github.com/nsfleet/nsfleet/cluster/sim"
	"github.com/nsfleet/nsfleet/internal/privilege"
	"github.com/spf13/cobra"
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
			return usageError{fmt.Errorf("sim %s: --dir DIR is required", op)}
		}
		return privilege.Need("sim " + op)
	}
	cmd.AddCommand(simUp(g, &dir, need), simLs(g, &dir, need), simDown(g, &dir, need), simAdd(g, &dir, need),
		simNodeOp(g, &dir, need, "kill", "Power loss: kill NODE's agent and processes, remove the node with everything in it", sim.Kill),
		simNodeOp(g, &dir, need, "restart", "Kill NODE's agent (SIGKILL) and start a new one in the same node", sim.Restart),
		simNodeOp(g, &dir, need, "partition", "Cut NODE's network path to etcd; its agent keeps running", sim.Partition),
		simNodeOp(g, &dir, need, "heal", "Restore NODE's network path to etcd", sim.Heal),
		simProxy())
	return cmd
}

func simUp(g *globals, dir *string, need func(string) error) *cobra.Command {
	var nodes, capacity int
	var ttl, wait time.Duration
	var procs bool
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
			st, err := sim.Up(cmd.Context(), sim.Options{Dir: *dir, Nodes: nodes, Binary: self, LeaseTTL: ttl,
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
	f.DurationVar(&wait, "wait", 90*time.Second, "how long to wait for etcd and the agents")
	return cmd
}

// waitNodes waits until etcd answers through the proxy and n nodes are alive.
func waitNodes(ctx context.Context, g *globals, st *sim.State, n int, wait time.Duration) error {
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
