package fleet_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
)

// ringSpec: n routers in a ring (r{i}:e1 to r{i+1}:e0), a loopback
// address each and a route through e1, and a switch namespace whose
// bridge joins r1 and r2.
func ringSpec(t *testing.T, p string, n int) *spec.Fleet {
	t.Helper()
	return parseRing(t, ringYAML(p, n))
}

func parseRing(t *testing.T, y string) *spec.Fleet {
	t.Helper()
	f, err := spec.Parse("ring.yaml", []byte(y), spec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func ringYAML(p string, n int) string {
	return fmt.Sprintf(`namespaces:
  - name: "%[1]sr{i}"
    count: %[2]d
    loopback_addresses: ["10.255.0.{i}/32"]
    routes: [{to: 10.9.0.0/16, dev: e1}]
  - name: "%[1]ssw"
    bridges: [{name: br0, ports: [p1, p2], addresses: ["192.0.2.1/24"]}]
links:
  - a: "%[1]sr{i}:e1"
    b: "%[1]sr{i+1}:e0"
    count: %[3]d
    mtu: 9000
    a_addresses: ["10.0.{i}.0/31"]
    b_addresses: ["10.0.{i}.1/31"]
  - {a: "%[1]sr%[2]d:e1", b: "%[1]sr1:e0", mtu: 9000}
  - {a: "%[1]sr1:sw", b: "%[1]ssw:p1"}
  - {a: "%[1]sr2:sw", b: "%[1]ssw:p2"}
`, p, n, n-1)
}

// linkEnd reads an interface of a namespace: the link, its addresses,
// and the id the namespace has for its veth peer's namespace.
type kernelEnd struct {
	link  rtnl.Link
	addrs []netip.Prefix
	found bool
}

func readEnd(t *testing.T, rd *netns.RunDir, ns, ifname string) kernelEnd {
	t.Helper()
	var e kernelEnd
	inside(t, rd, ns, func(c *rtnl.Conn) error {
		l, err := c.LinkByName(ifname)
		if err != nil {
			return nil // missing
		}
		e.link, e.found = l, true
		a, err := c.AddrsOf([]int{l.Index})
		e.addrs = a[l.Index]
		return err
	})
	return e
}

// checkLinks checks every link of f in the kernel: each end there, a veth
// whose peer is the other end, in the other namespace, up, with its MTU
// and addresses.
func checkLinks(t *testing.T, rd *netns.RunDir, f *spec.Fleet) {
	t.Helper()
	for _, l := range f.Links {
		a, b := readEnd(t, rd, l.A.Namespace, l.A.Interface), readEnd(t, rd, l.B.Namespace, l.B.Interface)
		if !a.found || !b.found {
			t.Errorf("link %s: ends found %v/%v", &l, a.found, b.found)
			continue
		}
		if a.link.Type != "veth" || a.link.PeerIndex != b.link.Index || b.link.PeerIndex != a.link.Index {
			t.Errorf("link %s: not each other's peers: %+v %+v", &l, a.link, b.link)
		}
		hb, err := rd.Open(l.B.Namespace)
		if err != nil {
			t.Fatal(err)
		}
		inside(t, rd, l.A.Namespace, func(c *rtnl.Conn) error {
			id, err := c.NsID(hb.Fd())
			if err != nil || id != a.link.PeerNsID {
				t.Errorf("link %s: a's peer is in namespace id %d, b's namespace has id %d (%v)", &l, a.link.PeerNsID, id, err)
			}
			return nil
		})
		hb.Close()
		for _, e := range []struct {
			k    kernelEnd
			want spec.LinkEnd
		}{{a, l.A}, {b, l.B}} {
			if !e.k.link.Up || l.MTU != 0 && e.k.link.MTU != l.MTU {
				t.Errorf("%s: up %v mtu %d, want up, mtu %d", e.want, e.k.link.Up, e.k.link.MTU, l.MTU)
			}
			for _, p := range e.want.Addrs {
				if !slices.Contains(e.k.addrs, p) {
					t.Errorf("%s: address %s missing (has %v)", e.want, p, e.k.addrs)
				}
			}
		}
	}
}

func TestLinksBridgesRepair(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	f := ringSpec(t, p, 5)
	opts := fleet.Options{RunDir: rd}
	if s := up(t, f, opts); s.Counts[fleet.Created] != 6 || s.Err() != nil {
		t.Fatalf("first up: %+v %v", s.Counts, s.Err())
	}
	t.Cleanup(func() { down(t, fleet.Selector{Prefix: p}, opts) })
	checkLinks(t, rd, f)
	bridgePorts := func() map[string]int {
		out := map[string]int{}
		inside(t, rd, p+"sw", func(c *rtnl.Conn) error {
			ports, err := c.BridgePorts()
			br, _ := c.LinkByName("br0")
			for _, name := range []string{"p1", "p2"} {
				if l, err := c.LinkByName(name); err == nil && ports[l.Index] == br.Index {
					out[name] = br.Index
				}
			}
			return err
		})
		return out
	}
	if ports := bridgePorts(); len(ports) != 2 {
		t.Errorf("bridge ports enslaved: %v, want p1 and p2", ports)
	}
	// The route through a link and the loopback address were made after it.
	inside(t, rd, p+"r3", func(c *rtnl.Conn) error {
		rs, err := c.Routes()
		if !slices.ContainsFunc(rs, func(r rtnl.Route) bool { return r.To == netip.MustParsePrefix("10.9.0.0/16") }) {
			t.Errorf("r3: route through e1 missing: %v", rs)
		}
		a, _ := c.AddrsOf([]int{rtnl.LoopbackIndex})
		if !slices.Contains(a[rtnl.LoopbackIndex], netip.MustParsePrefix("10.255.0.3/32")) {
			t.Errorf("r3: loopback address missing: %v", a)
		}
		return err
	})
	if m := states(t, f, opts); m[fleet.StateOK] != 6 {
		t.Fatalf("ls after up: %v", m)
	}
	if s := up(t, f, opts); s.Counts[fleet.Unchanged] != 6 {
		t.Fatalf("second up: %+v", s.Counts)
	}

	// Drift: one end of a link deleted (the pair goes), one end replaced
	// by a bridge of its name, an address and a loopback address removed,
	// a bridge port freed.
	inside(t, rd, p+"r1", func(c *rtnl.Conn) error {
		l, err := c.LinkByName("e1")
		if err != nil {
			return err
		}
		return c.DeleteLink(l.Index)
	})
	inside(t, rd, p+"r3", func(c *rtnl.Conn) error {
		l, err := c.LinkByName("e1")
		if err != nil {
			return err
		}
		if err := c.DeleteLink(l.Index); err != nil {
			return err
		}
		if err := c.AddBridge("e1", 0); err != nil {
			return err
		}
		return c.DeleteAddr(rtnl.LoopbackIndex, netip.MustParsePrefix("10.255.0.3/32"))
	})
	inside(t, rd, p+"r5", func(c *rtnl.Conn) error {
		l, err := c.LinkByName("e0")
		if err != nil {
			return err
		}
		return c.DeleteAddr(l.Index, netip.MustParsePrefix("10.0.4.1/31"))
	})
	inside(t, rd, p+"sw", func(c *rtnl.Conn) error {
		l, err := c.LinkByName("p1")
		if err != nil {
			return err
		}
		return c.SetMaster(l.Index, 0)
	})
	if m := states(t, f, opts); m[fleet.StateDrift] != 6 { // r1, r2 (its e0), r3, r4 (its e0), r5, sw
		t.Fatalf("ls after drift: %v", m)
	}
	s := up(t, f, opts)
	if s.Err() != nil || s.Counts[fleet.Repaired] < 4 {
		t.Fatalf("repair: %+v %v", s.Counts, s.Err())
	}
	checkLinks(t, rd, f)
	if ports := bridgePorts(); len(ports) != 2 {
		t.Errorf("bridge ports after repair: %v", ports)
	}
	if m := states(t, f, opts); m[fleet.StateOK] != 6 {
		t.Fatalf("ls after repair: %v", m)
	}
	// Down removes the namespaces, and the links with them.
	r := down(t, fleet.Selector{Names: f.Names()}, opts)
	if r.Counts[fleet.Deleted] != 6 {
		t.Fatalf("down: %+v", r.Counts)
	}
}

// A dry run plans the links of namespaces still to make, and makes
// nothing.
func TestLinksDryRun(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	f := ringSpec(t, p, 3)
	s, err := fleet.Up(context.Background(), f, fleet.UpOptions{Options: fleet.Options{RunDir: rd}, DryRun: true})
	if err != nil || s.Counts[fleet.WouldCreate] != 4 || s.Err() != nil {
		t.Fatalf("dry run: %+v %v %v", s.Counts, err, s.Err())
	}
	if pins, _ := rd.List(); len(pins) != 0 {
		t.Fatalf("a dry run made %v", pins)
	}
}

// A namespace of the spec that another tool made (no mark on lo) gets no
// link: nothing is made or deleted inside it, and the link is reported.
func TestLinksLeaveForeignAlone(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	h, err := netns.Create(nil) // what `ip netns add` does
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rd.Setup(); err != nil {
		t.Fatal(err)
	}
	if err := rd.Pin(p+"r2", h); err != nil {
		t.Fatal(err)
	}
	h.Close()
	opts := fleet.Options{RunDir: rd}
	t.Cleanup(func() {
		down(t, fleet.Selector{Prefix: p}, opts)
		rd.Unpin(p + "r2")
	})
	f := ringSpec(t, p, 3)
	s := up(t, f, opts)
	if s.Counts[fleet.Skipped] != 1 {
		t.Fatalf("up: %+v, want the foreign namespace skipped", s.Counts)
	}
	if e := readEnd(t, rd, p+"r2", "e0"); e.found {
		t.Fatalf("a link end was made in the foreign namespace: %+v", e.link)
	}
	if e := readEnd(t, rd, p+"r1", "e1"); e.found {
		t.Fatalf("a link into the foreign namespace was made: %+v", e.link)
	}
	if e := readEnd(t, rd, p+"r3", "e1"); !e.found {
		t.Fatal("the link between two namespaces of nsfleet's (r3-r1) was not made")
	}
}

// Day two: the spec's links change (MTU, an address more on each end);
// up applies it to the links in the kernel, and leaves them otherwise.
func TestLinksSpecChange(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	opts := fleet.Options{RunDir: rd}
	y := ringYAML(p, 3)
	up(t, parseRing(t, y), opts)
	t.Cleanup(func() { down(t, fleet.Selector{Prefix: p}, opts) })
	y = strings.ReplaceAll(y, "mtu: 9000", "mtu: 8000")
	y = strings.Replace(y, `a_addresses: ["10.0.{i}.0/31"]`, `a_addresses: ["10.0.{i}.0/31", "10.1.{i}.0/31"]`, 1)
	f := parseRing(t, y)
	s := up(t, f, opts)
	if s.Err() != nil || s.Counts[fleet.Repaired] != 3 {
		t.Fatalf("up of the changed spec: %+v %v", s.Counts, s.Err())
	}
	checkLinks(t, rd, f) // MTU 8000 and the new addresses, in the kernel
	if s := up(t, f, opts); s.Counts[fleet.Unchanged] != 4 {
		t.Fatalf("again: %+v", s.Counts)
	}
}
