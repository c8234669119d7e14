package cli

import (
	"bufio"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/internal/exitcode"
	"github.com/nsfleet/nsfleet/internal/progress"
	"github.com/nsfleet/nsfleet/topo"
	"github.com/spf13/cobra"
)

func newTopo(g *globals) *cobra.Command {
	var prefix, links, loopbacks string
	var mtu, birdHello int
	var noForward, noIPv6 bool
	var processes []string
	cmd := &cobra.Command{
		Use:   "topo SHAPE ARGS... > SPEC",
		Short: "Write the spec of an emulated network: line, ring, star, grid, torus, fat-tree, leaf-spine, random",
		Long: `topo writes a spec of routers (network namespaces) joined by links, for
'nsfleet up -f'. Each link is a veth pair whose ends are made directly in
the two routers' namespaces, with a /31 of its own; each router has a
loopback address of its own and forwards IPv4. The spec is ordinary YAML:
one template per kind of router, one line per link; edit it as you like.

Shapes and their arguments:
  line N                  r1 - r2 - ... - rN
  ring N                  a line closed by rN - r1 (N >= 3)
  star N                  a hub and N leaves
  grid ROWS COLS          each router joined to its right and lower neighbours
  torus ROWS COLS         a grid whose edges wrap around (4 links per router)
  fat-tree K              the k-ary fat-tree: (K/2)^2 core, K^2/2 aggregation
                          and K^2/2 edge switches, K^3/4 hosts (K even)
  leaf-spine L S H        L leaves each joined to all S spines, H hosts per leaf
  random N D SEED         a random D-regular graph on N routers (same SEED,
                          same graph)

Interfaces are eth0, eth1, ... on each router, in link order. Addresses:
links take /31s from --links in link order, routers their loopback
address from --loopbacks (a /16) in router order. --no-ipv6 turns IPv6
off in the routers before their links exist (an IPv4 lab is made about
10% faster).

Routing: --bird N runs BIRD in every router, OSPF on every link with
hellos every N seconds, each router with a configuration of its own made
from a template ({loopback} is its router id; see the spec's 'config'),
its control socket beside it (birdc -s
/run/.nsfleet-netns/configs/r1/bird.ctl show route, for the default run
dir). --process adds any other daemon. 'nsfleet topo wait -f SPEC'
waits until every router has a route to every other's loopback.`,
		Example: `  nsfleet topo torus 100 100 > torus.yaml && nsfleet up -f torus.yaml
  nsfleet topo fat-tree 16 > ft16.yaml
  nsfleet topo random 1000 4 42 --mtu 9000 > random.yaml
  nsfleet topo torus 10 10 --bird 1 --no-ipv6 > ospf.yaml && nsfleet up -f ospf.yaml && nsfleet topo wait -f ospf.yaml
  nsfleet topo ring 10 --process '{name: bird, command: [bird, -f, -c, /etc/lab/bird.conf, -s, "/run/lab/{name}.ctl"]}'`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := topology(prefix, args)
			if err != nil {
				return usageError{Err: err}
			}
			o := topo.Options{MTU: mtu, NoForward: noForward, NoIPv6: noIPv6, BirdHello: birdHello}
			if o.Addressing.Links, err = netip.ParsePrefix(links); err != nil {
				return usageError{Err: fmt.Errorf("--links %q: %w", links, err)}
			}
			if o.Addressing.Loopbacks, err = netip.ParsePrefix(loopbacks); err != nil {
				return usageError{Err: fmt.Errorf("--loopbacks %q: %w", loopbacks, err)}
			}
			for _, p := range processes {
				o.Processes = append(o.Processes, "- "+p)
			}
			w := bufio.NewWriter(g.stdout)
			if err := t.Write(w, o); err != nil {
				return usageError{Err: err}
			}
			return w.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&prefix, "prefix", "", "name prefix of the routers (default: r1, r2... for one kind of router; core1, agg1, edge1, host1 for fat-tree; spine1, leaf1, host1 for leaf-spine)")
	f.StringVar(&links, "links", topo.DefaultAddressing.Links.String(), "IPv4 pool of the links' /31s")
	f.StringVar(&loopbacks, "loopbacks", topo.DefaultAddressing.Loopbacks.String(), "IPv4 /16 of the routers' loopback addresses")
	f.IntVar(&mtu, "mtu", 0, "MTU of every link (0: the kernel's default, 1500)")
	f.BoolVar(&noForward, "no-forward", false, "do not set net.ipv4.ip_forward=1 in the routers")
	f.BoolVar(&noIPv6, "no-ipv6", false, "turn IPv6 off in the routers (net.ipv6.conf.{all,default}.disable_ipv6)")
	cmd.AddCommand(newTopoWait(g))
	f.IntVar(&birdHello, "bird", 0, "run BIRD (bird2) with OSPF in every router, hellos every N seconds, each router with a config of its own (router id = its loopback); 0: none")
	f.StringArrayVar(&processes, "process", nil, "a process every router runs, as a YAML flow mapping of the spec's processes list ({name} is the router's name); repeatable")
	return cmd
}

// topology makes the shape args name.
func topology(prefix string, args []string) (*topo.Topology, error) {
	shape, rest := args[0], args[1:]
	arity := map[string]int{"line": 1, "ring": 1, "star": 1, "grid": 2, "torus": 2, "fat-tree": 1, "leaf-spine": 3, "random": 3}
	n, ok := arity[shape]
	if !ok {
		return nil, fmt.Errorf("unknown shape %q: want line, ring, star, grid, torus, fat-tree, leaf-spine or random", shape)
	}
	if len(rest) != n {
		return nil, fmt.Errorf("%s takes %d numbers, got %d (see --help)", shape, n, len(rest))
	}
	v := make([]int, n)
	for i, a := range rest {
		x, err := strconv.Atoi(a)
		if err != nil || x < 0 {
			return nil, fmt.Errorf("%s: %q is not a count", shape, a)
		}
		v[i] = x
	}
	one := prefix // the name of a single-role shape's routers
	if one == "" {
		one = "r"
	}
	switch shape {
	case "line":
		return topo.Line(one, v[0])
	case "ring":
		return topo.Ring(one, v[0])
	case "star":
		return topo.Star(one, v[0])
	case "grid", "torus":
		return topo.Grid(one, v[0], v[1], shape == "torus")
	case "fat-tree":
		return topo.FatTree(prefix, v[0])
	case "leaf-spine":
		return topo.LeafSpine(prefix, v[0], v[1], v[2])
	default:
		return topo.Random(one, v[0], v[1], uint64(v[2]))
	}
}

func newTopoWait(g *globals) *cobra.Command {
	var file string
	var timeout, interval time.Duration
	cmd := &cobra.Command{
		Use:   "wait -f SPEC [--timeout D]",
		Short: "Wait until every router of a spec has a route to every other router's loopback address",
		Long: `wait reads the routing table of every namespace of SPEC that has a loopback
address, again and again, until each has a route (other than a default
route) to every other one's loopback address: what the routing daemons
(OSPF, BGP) of an emulated network must have taught it. It prints how far
they have come every few seconds, and the time it took. Exit code 0 once
converged, 1 at the timeout (naming the router that reaches fewest).`,
		Example: `  nsfleet up -f ospf.yaml && nsfleet topo wait -f ospf.yaml --timeout 5m`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, rd, err := g.rootSpecRunDir("topo wait", file)
			if err != nil {
				return err
			}
			start, last := time.Now(), time.Time{}
			ctx := cmd.Context()
			for {
				r, err := fleet.Learned(ctx, f, g.options(rd))
				if err != nil {
					return err
				}
				n, total := r.Converged(), len(r.Learned)+len(r.Errors)
				el := time.Since(start).Round(10 * time.Millisecond)
				if n == total && len(r.Errors) == 0 {
					fmt.Fprintf(g.stdout, "topo wait: all %d routers reach the other %d loopback addresses after %s\n", total, r.Want, el)
					return nil
				}
				why := r.Missing()
				for name, e := range r.Errors {
					why = name + ": " + e.Error()
					break
				}
				if time.Since(start) >= timeout {
					return &exitError{Code: exitcode.Failed, Err: fmt.Errorf("topo wait: %d of %d routers reach every other loopback after %s; %s", n, total, el, why)}
				}
				if time.Since(last) >= progress.PlainEvery {
					last = time.Now()
					fmt.Fprintf(g.stderr, "topo wait: %d/%d routers reach every other loopback after %s (%s)\n", n, total, el, why)
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(interval):
				}
			}
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "the spec whose routers to check")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "give up after this long")
	cmd.Flags().DurationVar(&interval, "interval", 250*time.Millisecond, "pause between two reads of every routing table")
	return cmd
}
