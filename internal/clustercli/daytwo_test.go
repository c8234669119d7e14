package clustercli

import (
	"bytes"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/cluster/sim"
	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/sysctl"
	"golang.org/x/sys/unix"
)

// router is one Neutron-shaped router of a heterogeneous spec: a template
// of its own, with its own subnet, route, forwarding and daemon.
type router struct {
	addr    string // on its qr- end, inside
	route   string // a prefix routed via .254 of its subnet; "": none
	forward string // net.ipv4.ip_forward
	sleep   string // the daemon's argument
}

// heteroSpec writes one template per router, as a real gateway's fleet is.
func heteroSpec(prefix string, rs map[int]router) string {
	var b strings.Builder
	b.WriteString("namespaces:\n")
	keys := make([]int, 0, len(rs))
	for i := range rs {
		keys = append(keys, i)
	}
	slices.Sort(keys)
	for _, i := range keys {
		r := rs[i]
		fmt.Fprintf(&b, `  - name: "%[1]sr-%[2]d"
    sysctls:
      net.ipv4.ip_forward: "%[3]s"
    veths:
      - host: "%[1]sh%[2]d"
        peer: qr
        up: true
        host_ipv6: false
        peer_addresses: ["%[4]s"]
`, prefix, i, r.forward, r.addr)
		if r.route != "" {
			gw := netip.MustParsePrefix(r.addr).Masked().Addr().As4()
			gw[3] = 254
			fmt.Fprintf(&b, "    routes:\n      - to: %s\n        via: %s\n", r.route, netip.AddrFrom4(gw))
		}
		fmt.Fprintf(&b, "    processes:\n      - name: idle\n        command: [sleep, %q]\n        restart: always\n", r.sleep)
	}
	return b.String()
}

// kernelView is what the kernel of the node that holds a router shows.
type kernelView struct {
	node    string
	addrs   []netip.Prefix // on qr
	routes  []string       // "TO via GW"
	forward string
	procs   map[int]string // pid -> command line, of processes in it
}

// inKernel reads a router's state from the kernel of the node that holds
// it; "" node: no node holds it.
func inKernel(t *testing.T, dir string, st *sim.Cluster, name string) kernelView {
	t.Helper()
	w := where(t, dir)
	var v kernelView
	if len(w[name]) != 1 {
		if len(w[name]) > 1 {
			t.Fatalf("%s on %v", name, w[name])
		}
		return v
	}
	v.node = w[name][0]
	n, err := st.Node(v.node)
	if err != nil {
		t.Fatal(err)
	}
	var h *netns.NS
	if err := netns.InMountNS(n.MntPin, func() (err error) {
		h, err = netns.OpenPath(filepath.Join(n.RunDir, name))
		return err
	}); err != nil {
		v.node = "" // went away meanwhile
		return v
	}
	defer h.Close()
	fwd, _ := sysctl.Netconf("net.ipv4.ip_forward")
	key := rtnl.NetconfKey{Family: fwd.Family, Index: fwd.Index}
	err = rtnl.Inside(h, rtnl.Open, func(c *rtnl.Conn) error {
		r, err := c.Survey([]rtnl.NetconfKey{key})
		if err != nil {
			return err
		}
		v.forward = strconv.Itoa(int(r.Netconf[key][fwd.Attr]))
		idx, ok, err := c.Index("qr")
		if err != nil || !ok {
			return fmt.Errorf("qr: %v %w", ok, err)
		}
		addrs, err := c.Addrs()
		if err != nil {
			return err
		}
		for _, a := range addrs[idx] {
			if a.Addr().Is4() {
				v.addrs = append(v.addrs, a)
			}
		}
		routes, err := c.Routes()
		for _, r := range routes {
			if r.Via.IsValid() {
				v.routes = append(v.routes, r.To.String()+" via "+r.Via.String())
			}
		}
		return err
	})
	if err != nil {
		t.Fatalf("%s on %s: %v", name, v.node, err)
	}
	v.procs = procsIn(h.Inode())
	return v
}

// procsIn lists the processes whose network namespace has inode ino.
func procsIn(ino uint64) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var s unix.Stat_t
		if unix.Stat("/proc/"+e.Name()+"/ns/net", &s) != nil || s.Ino != ino {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		out[pid] = string(bytes.ReplaceAll(bytes.TrimRight(cmd, "\x00"), []byte{0}, []byte{' '}))
	}
	return out
}

// converged says what keeps cluster status from reporting every node
// converged at the stored spec, or "".
func converged(t *testing.T) string {
	r := status(t)
	for _, n := range r.Nodes {
		if n.Alive && !n.Converged {
			return n.Name + " not converged"
		}
	}
	if r.Unassigned > 0 {
		return fmt.Sprintf("%d unassigned", r.Unassigned)
	}
	return ""
}

// TestDayTwo does what an operator does after the first apply, on a
// heterogeneous fleet with a daemon per router, and checks every step in
// the kernel of the node that holds the router, never in nsfleet's status:
// change an address, a route, a sysctl and a daemon of one router; remove
// one and add one; kill a daemon; restart an agent in the middle of a
// change. Whenever status says converged, the kernel must already show it.
func TestDayTwo(t *testing.T) {
	nstest.RequireRoot(t)
	dir, st := upSim(t, 4*time.Second, "--allow-processes")

	prefix := nstest.Prefix(t)
	const count = 12
	rs := map[int]router{}
	for i := 1; i <= count; i++ {
		rs[i] = router{addr: fmt.Sprintf("10.%d.0.1/24", i), route: "198.51.100.0/24", forward: "1", sleep: "1000"}
	}
	specFile := filepath.Join(t.TempDir(), "gateway.yaml")
	apply := func(t *testing.T) {
		t.Helper()
		if err := os.WriteFile(specFile, []byte(heteroSpec(prefix, rs)), 0o644); err != nil {
			t.Fatal(err)
		}
		must(t, "cluster", "apply", "-f", specFile)
	}
	name := func(i int) string { return fmt.Sprintf("%sr-%d", prefix, i) }
	// settle waits until status says converged, then checks at once that
	// the kernel shows what check wants: status never runs ahead of it.
	settle := func(t *testing.T, what string, check func() string) {
		t.Helper()
		took := waitFor(t, what+" (in the kernel)", 15*time.Second, check)
		waitFor(t, what+": status converged", 15*time.Second, func() string { return converged(t) })
		if bad := check(); bad != "" {
			t.Fatalf("%s: status says converged, the kernel says: %s", what, bad)
		}
		t.Logf("%s: in the kernel %s after apply", what, took.Round(time.Millisecond))
	}
	view := func(i int) kernelView { return inKernel(t, dir, st, name(i)) }

	t.Run("apply", func(t *testing.T) {
		apply(t)
		// A script chains on cluster wait: when it returns, the kernels
		// hold the fleet.
		must(t, "cluster", "wait", "--timeout", "30s")
		for i := 1; i <= count; i++ {
			if v := view(i); v.node == "" || len(v.addrs) != 1 {
				t.Fatalf("cluster wait returned, but %s is %+v in the kernel", name(i), v)
			}
		}
		settle(t, "every router served once, with its daemon", func() string {
			for i := 1; i <= count; i++ {
				v := view(i)
				if v.node == "" {
					return name(i) + " on no node"
				}
				if len(v.procs) != 1 {
					return fmt.Sprintf("%s runs %d processes: %v", name(i), len(v.procs), v.procs)
				}
			}
			return ""
		})
	})

	t.Run("change one router's address", func(t *testing.T) {
		r := rs[3]
		r.addr = "10.3.0.9/24"
		rs[3] = r
		apply(t)
		must(t, "cluster", "wait", "--timeout", "30s", name(3))
		if v := view(3); !slices.Equal(v.addrs, []netip.Prefix{netip.MustParsePrefix("10.3.0.9/24")}) {
			t.Fatalf("cluster wait %s returned, but the kernel has %v", name(3), v.addrs)
		}
		settle(t, "new address, old one gone", func() string {
			v := view(3)
			if !slices.Equal(v.addrs, []netip.Prefix{netip.MustParsePrefix("10.3.0.9/24")}) {
				return fmt.Sprintf("%s has %v on qr", name(3), v.addrs)
			}
			return ""
		})
	})

	t.Run("change one router's route and sysctl", func(t *testing.T) {
		r := rs[4]
		r.route, r.forward = "203.0.113.0/24", "0"
		rs[4] = r
		apply(t)
		settle(t, "route replaced, forwarding off", func() string {
			v := view(4)
			if !slices.Equal(v.routes, []string{"203.0.113.0/24 via 10.4.0.254"}) || v.forward != "0" {
				return fmt.Sprintf("%s: routes %v, ip_forward %s", name(4), v.routes, v.forward)
			}
			return ""
		})
		// The other routers were not touched.
		if v := view(5); !slices.Equal(v.routes, []string{"198.51.100.0/24 via 10.5.0.254"}) || v.forward != "1" {
			t.Errorf("%s changed too: %+v", name(5), v)
		}
	})

	t.Run("change one router's daemon", func(t *testing.T) {
		before := view(6).procs
		r := rs[6]
		r.sleep = "2000"
		rs[6] = r
		apply(t)
		settle(t, "daemon restarted with its new command", func() string {
			v := view(6)
			if len(v.procs) != 1 || !strings.HasSuffix(slices.Collect(maps.Values(v.procs))[0], "sleep 2000") {
				return fmt.Sprintf("%s runs %v", name(6), v.procs)
			}
			return ""
		})
		for pid := range before {
			if _, alive := view(6).procs[pid]; alive {
				t.Errorf("the old daemon (pid %d) still runs", pid)
			}
		}
	})

	t.Run("kill a daemon", func(t *testing.T) {
		before := view(7).procs
		if len(before) != 1 {
			t.Fatalf("%s runs %v", name(7), before)
		}
		var pid int
		for p := range before {
			pid = p
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// The supervisor's first back-off is 1 s.
		took := waitFor(t, "daemon restarted", 2*time.Second+time.Second, func() string {
			v := view(7)
			if _, old := v.procs[pid]; old || len(v.procs) != 1 {
				return fmt.Sprintf("%s runs %v", name(7), v.procs)
			}
			return ""
		})
		t.Logf("daemon restarted %s after SIGKILL", took.Round(time.Millisecond))
		// Later, again: the supervisor outlives the reconcile that started it.
		time.Sleep(500 * time.Millisecond)
		before = view(7).procs
		for p := range before {
			pid = p
		}
		syscall.Kill(pid, syscall.SIGKILL)
		waitFor(t, "daemon restarted a second time", 8*time.Second, func() string {
			v := view(7)
			if _, old := v.procs[pid]; old || len(v.procs) != 1 {
				return fmt.Sprintf("%s runs %v", name(7), v.procs)
			}
			return ""
		})
	})

	t.Run("remove one, add one", func(t *testing.T) {
		delete(rs, 2)
		rs[count+1] = router{addr: fmt.Sprintf("10.%d.0.1/24", count+1), forward: "1", sleep: "1000"}
		apply(t)
		settle(t, "removed everywhere, added once", func() string {
			if v := view(2); v.node != "" {
				return name(2) + " still on " + v.node
			}
			v := view(count + 1)
			if v.node == "" || len(v.procs) != 1 {
				return fmt.Sprintf("%s: node %q, processes %v", name(count+1), v.node, v.procs)
			}
			return ""
		})
	})

	t.Run("restart an agent in the middle of a change", func(t *testing.T) {
		node := view(8).node
		r := rs[8]
		r.addr, r.route = "10.8.0.77/24", ""
		rs[8] = r
		// The agent is frozen while the change is stored, then replaced:
		// only its successor can apply the change.
		cur, err := sim.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		n, err := cur.Node(node)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(n.Agent.PID, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		apply(t)
		must(t, "sim", "restart", node, "--dir", dir)
		settle(t, "change applied across the restart", func() string {
			v := view(8)
			if !slices.Contains(v.addrs, netip.MustParsePrefix("10.8.0.77/24")) {
				return fmt.Sprintf("%s has %v on qr", name(8), v.addrs)
			}
			return ""
		})
		// The restart must not have cost a failover.
		if r := status(t); len(r.Failovers) != 0 {
			t.Errorf("agent restart caused a failover: %+v", r.Failovers)
		}
	})

	t.Run("a second spec beside the first, then deleted", func(t *testing.T) {
		lab := filepath.Join(t.TempDir(), "lab.yaml")
		labName := func(i int) string { return fmt.Sprintf("%slab-%d", prefix, i) }
		os.WriteFile(lab, []byte(fmt.Sprintf("namespaces:\n  - name: \"%slab-{i}\"\n    count: 4\n    veths:\n      - host: \"%sl{i}\"\n        peer: qr\n        up: true\n", prefix, prefix)), 0o644)
		if out := must(t, "cluster", "apply", "-f", lab); !strings.Contains(out, "spec lab") || !strings.Contains(out, "4 added") {
			t.Errorf("apply of a second spec: %q", out)
		}
		settle(t, "both specs served", func() string {
			for i := 1; i <= 4; i++ {
				if v := inKernel(t, dir, st, labName(i)); v.node == "" {
					return labName(i) + " on no node"
				}
			}
			if v := view(1); v.node == "" || len(v.procs) != 1 {
				return fmt.Sprintf("%s: node %q, processes %v", name(1), v.node, v.procs)
			}
			return ""
		})
		// A third file that takes a router of the first: refused, nothing
		// stored, nothing in the kernel changes.
		thief := filepath.Join(t.TempDir(), "thief.yaml")
		os.WriteFile(thief, []byte(fmt.Sprintf("namespaces:\n  - name: %s\n  - name: %sthief\n", name(1), prefix)), 0o644)
		if _, err := run(t, "cluster", "apply", "-f", thief); err == nil || !strings.Contains(err.Error(), "thief.yaml:2: namespace "+name(1)+" is also in spec gateway (") {
			t.Errorf("a name of another spec: %v", err)
		}
		if v := inKernel(t, dir, st, prefix+"thief"); v.node != "" {
			t.Errorf("a refused apply made %sthief on %s", prefix, v.node)
		}
		if out := must(t, "cluster", "delete", "lab"); !strings.Contains(out, "4 namespaces") {
			t.Errorf("delete: %q", out)
		}
		settle(t, "the second spec gone, the first untouched", func() string {
			for i := 1; i <= 4; i++ {
				if v := inKernel(t, dir, st, labName(i)); v.node != "" {
					return labName(i) + " still on " + v.node
				}
			}
			for i := range rs {
				if v := view(i); v.node == "" || len(v.procs) != 1 {
					return fmt.Sprintf("%s: node %q, processes %v", name(i), v.node, v.procs)
				}
			}
			return ""
		})
	})

	t.Run("drain and uncordon keep the daemons", func(t *testing.T) {
		must(t, "cluster", "drain", "node-1", "--wait", "30s")
		settle(t, "node-1 empty, every router and daemon elsewhere", func() string {
			for i := range rs {
				v := view(i)
				if v.node == "" || v.node == "node-1" || len(v.procs) != 1 {
					return fmt.Sprintf("%s: node %q, processes %v", name(i), v.node, v.procs)
				}
			}
			return ""
		})
		must(t, "cluster", "uncordon", "node-1")
	})
}
