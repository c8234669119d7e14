package clustercli

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/cluster/sim"
	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
	"github.com/nsfleet/nsfleet/topo"
)

// routerView is one router as the kernel of the node that holds it shows
// it: its interfaces by name and the /32 routes it has learned.
type routerView struct {
	node   string
	links  map[string]rtnl.Link
	routes map[netip.Prefix]bool
}

func readRouter(t *testing.T, st *sim.Cluster, node, name string) (routerView, error) {
	v := routerView{node: node, links: map[string]rtnl.Link{}, routes: map[netip.Prefix]bool{}}
	n, err := st.Node(node)
	if err != nil {
		return v, err
	}
	var h *netns.NS
	if err := netns.InMountNS(n.MntPin, func() (err error) {
		h, err = netns.OpenPath(filepath.Join(n.RunDir, name))
		return err
	}); err != nil {
		return v, err
	}
	defer h.Close()
	err = rtnl.Inside(h, rtnl.Open, func(c *rtnl.Conn) error {
		links, err := c.Links()
		for _, l := range links {
			v.links[l.Name] = l
		}
		if err != nil {
			return err
		}
		routes, err := c.Routes()
		for _, r := range routes {
			if r.To.Bits() == 32 {
				v.routes[r.To] = true
			}
		}
		return err
	})
	return v, err
}

// TestSimLinks: a generated network with BIRD's OSPF in every router,
// spread over three sim nodes. The links whose routers landed on two nodes
// are VXLAN tunnels (checked in each router's kernel: device, VNI, MTU),
// the others veths; placement keeps rows together; OSPF converges across
// the tunnels (every router learns every loopback, read in its kernel).
// Then a node dies: its routers come back on the survivors with their
// links, and OSPF converges again.
func TestSimLinks(t *testing.T) {
	nstest.RequireRoot(t)
	if _, err := exec.LookPath("bird"); err != nil {
		t.Skip("BIRD (Debian's bird2) is not installed")
	}
	base := t.TempDir()
	dir, st := upSimIn(t, filepath.Join(base, "sim"), 3*time.Second, "--allow-processes")
	p := nstest.Prefix(t)
	top, err := topo.Grid(p+"r", 3, 4, true) // 12 routers, 24 links
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := top.Write(&b, topo.Options{Addressing: topo.DefaultAddressing, NoIPv6: true, BirdHello: 1}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "torus.yaml")
	os.WriteFile(file, b.Bytes(), 0o644)
	f, err := spec.Parse(file, b.Bytes(), spec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	must(t, "cluster", "apply", "-f", file)
	must(t, "cluster", "wait", "--timeout", "60s")

	// tunnels checks every link end in the kernel and returns how many
	// links are tunnels.
	check := func() (int, string) {
		w := where(t, dir)
		views := map[string]routerView{}
		for i := range f.Namespaces {
			name := f.Namespaces[i].Name
			if len(w[name]) != 1 {
				return 0, fmt.Sprintf("%s on %v", name, w[name])
			}
			v, err := readRouter(t, st, w[name][0], name)
			if err != nil {
				return 0, fmt.Sprintf("%s: %v", name, err)
			}
			views[name] = v
		}
		tunnels := 0
		for _, l := range f.Links {
			a, b := views[l.A.Namespace], views[l.B.Namespace]
			la, oka := a.links[l.A.Interface]
			lb, okb := b.links[l.B.Interface]
			switch {
			case !oka || !okb:
				return 0, fmt.Sprintf("link %s: an end missing", &l)
			case a.node == b.node && (la.Type != "veth" || lb.Type != "veth"):
				return 0, fmt.Sprintf("link %s on one node: %s/%s, want veths", &l, la.Type, lb.Type)
			case a.node != b.node:
				if la.Vxlan == nil || lb.Vxlan == nil || la.Vxlan.VNI != lb.Vxlan.VNI || la.Vxlan.VNI == 0 {
					return 0, fmt.Sprintf("link %s across %s and %s: %s/%s, want one VXLAN network", &l, a.node, b.node, la.Type, lb.Type)
				}
				if la.MTU != 1450 || lb.MTU != 1450 {
					return 0, fmt.Sprintf("tunnel %s: MTU %d/%d, want 1450", &l, la.MTU, lb.MTU)
				}
				tunnels++
			}
		}
		for name, v := range views {
			for i := range f.Namespaces {
				lo := f.Namespaces[i].LoopbackAddrs[0]
				if f.Namespaces[i].Name != name && !v.routes[lo] {
					return tunnels, fmt.Sprintf("%s (on %s) has no route to %s's loopback %s", name, v.node, f.Namespaces[i].Name, lo)
				}
			}
		}
		return tunnels, ""
	}
	start := time.Now()
	var tunnels int
	waitFor(t, "OSPF across the tunnels", 90*time.Second, func() (why string) {
		tunnels, why = check()
		return why
	})
	t.Logf("12 routers, 24 links on 3 nodes: %d tunnels; every router reaches every loopback %s after the spec was ready", tunnels, time.Since(start).Round(100*time.Millisecond))
	r := status(t)
	if r.Links != 24 || r.LinksCut != tunnels || tunnels == 0 || tunnels > 16 {
		t.Fatalf("status: %d links, %d cut; the kernels show %d tunnels", r.Links, r.LinksCut, tunnels)
	}
	out := must(t, "cluster", "status")
	if !strings.Contains(out, fmt.Sprintf("links: 24, %d cut", tunnels)) {
		t.Fatalf("status does not say the links cut:\n%s", out)
	}

	// Day two: one link dropped from the spec goes from both kernels.
	dropped := f.Links[len(f.Links)-1]
	text := b.String()
	text = text[:strings.LastIndex(strings.TrimSuffix(text, "\n"), "\n")+1]
	os.WriteFile(file, []byte(text), 0o644)
	if f, err = spec.Parse(file, []byte(text), spec.Options{}); err != nil || len(f.Links) != 23 {
		t.Fatalf("spec without %s: %d links, %v", &dropped, len(f.Links), err)
	}
	must(t, "cluster", "apply", "-f", file)
	must(t, "cluster", "wait", "--timeout", "60s")
	w := where(t, dir)
	for _, e := range []spec.LinkEnd{dropped.A, dropped.B} {
		v, err := readRouter(t, st, w[e.Namespace][0], e.Namespace)
		if err != nil {
			t.Fatal(err)
		}
		if l, ok := v.links[e.Interface]; ok {
			t.Fatalf("link %s dropped from the spec, yet %s is still a %s on %s", &dropped, e, l.Type, v.node)
		}
	}

	// node-1 cut off from the others: its agent fences, and sets its
	// tunnel ends down with its host veths (the survivors make its
	// routers again; two copies must not both carry traffic). Healed, it
	// gives them up, and OSPF converges again.
	// tunnelsDown says "" once every tunnel end on node is down.
	tunnelsDown := func(node string) string {
		w, up, total := where(t, dir), 0, 0
		for i := range f.Namespaces {
			ns := &f.Namespaces[i]
			if !slices.Contains(w[ns.Name], node) {
				continue
			}
			v, err := readRouter(t, st, node, ns.Name)
			if err != nil {
				return err.Error()
			}
			for k := range ns.Links {
				mine, _ := ns.Links[k].Ends(ns.Name)
				if l := v.links[mine.Interface]; l.Vxlan != nil {
					total++
					if l.Up {
						up++
					}
				}
			}
		}
		if total == 0 || up > 0 {
			return fmt.Sprintf("%d of %s's %d tunnel ends up", up, node, total)
		}
		return ""
	}
	must(t, "sim", "partition", "node-1", "--dir", dir)
	waitFor(t, "node-1's tunnel ends down", 30*time.Second, func() string { return tunnelsDown("node-1") })
	must(t, "sim", "heal", "node-1", "--dir", dir)
	healed := time.Now()
	waitFor(t, "OSPF after the partition healed", 120*time.Second, func() string {
		_, why := check()
		return why
	})
	t.Logf("node-1 partitioned: its tunnel ends went down; healed, every loopback reached again after %s", time.Since(healed).Round(100*time.Millisecond))

	// node-3's agent stopped (SIGSTOP): its watchdog, a process of its
	// own, sets its tunnel ends down at the moment the agent would have
	// fenced; resumed, the agent brings them back.
	n3, err := st.Node("node-3")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(n3.Agent.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := true
	defer func() {
		if paused {
			syscall.Kill(n3.Agent.PID, syscall.SIGCONT)
		}
	}()
	waitFor(t, "node-3's tunnel ends down while its agent is stopped", 30*time.Second, func() string { return tunnelsDown("node-3") })
	syscall.Kill(n3.Agent.PID, syscall.SIGCONT)
	paused = false
	waitFor(t, "OSPF after node-3's agent resumed", 120*time.Second, func() string {
		_, why := check()
		return why
	})

	// node-2 dies: its routers and their links come back on the others.
	must(t, "sim", "kill", "node-2", "--dir", dir)
	killed := time.Now()
	waitFor(t, "the routers to fail over, their links and OSPF", 120*time.Second, func() string {
		if bad := exactlyOnce(where(t, dir), f.Names(), "node-2"); bad != "" {
			return bad
		}
		_, why := check()
		return why
	})
	t.Logf("node-2 killed: every router on a survivor, links re-made and every loopback reached again after %s (lease TTL 3 s)", time.Since(killed).Round(100*time.Millisecond))
}
