package topo

import (
	"bytes"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nsfleet/nsfleet/spec"
)

// Every shape writes a spec that nsfleet accepts, with the routers and
// links it promises: every router's interfaces numbered from eth0, every
// link a /31 of its own, every router a loopback address of its own.
func TestShapesAreSpecs(t *testing.T) {
	type want struct{ routers, links, degree int } // degree: of every router, 0 if it varies
	cases := []struct {
		name string
		make func() (*Topology, error)
		want want
	}{
		{"line", func() (*Topology, error) { return Line("r", 5) }, want{5, 4, 0}},
		{"ring", func() (*Topology, error) { return Ring("r", 5) }, want{5, 5, 2}},
		{"star", func() (*Topology, error) { return Star("r", 4) }, want{5, 4, 0}},
		{"grid", func() (*Topology, error) { return Grid("r", 3, 4, false) }, want{12, 17, 0}},
		{"torus", func() (*Topology, error) { return Grid("r", 4, 5, true) }, want{20, 40, 4}},
		{"fat-tree", func() (*Topology, error) { return FatTree("", 4) }, want{36, 48, 0}},
		{"fat-tree 16", func() (*Topology, error) { return FatTree("", 16) }, want{1344, 3072, 0}},
		{"leaf-spine", func() (*Topology, error) { return LeafSpine("", 4, 2, 3) }, want{18, 20, 0}},
		{"random", func() (*Topology, error) { return Random("r", 50, 3, 7) }, want{50, 75, 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			top, err := c.make()
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := top.Write(&b, Options{Addressing: DefaultAddressing, MTU: 1500, NoIPv6: true}); err != nil {
				t.Fatal(err)
			}
			f, err := spec.Parse(c.name+".yaml", b.Bytes(), spec.Options{})
			if err != nil {
				t.Fatalf("%v\n%s", err, b.String()[:min(b.Len(), 2000)])
			}
			if len(f.Namespaces) != c.want.routers || len(f.Links) != c.want.links {
				t.Fatalf("%d routers, %d links; want %d, %d", len(f.Namespaces), len(f.Links), c.want.routers, c.want.links)
			}
			addrs, los := map[netip.Prefix]bool{}, map[netip.Prefix]bool{}
			for _, l := range f.Links {
				for _, e := range []spec.LinkEnd{l.A, l.B} {
					if len(e.Addrs) != 1 || e.Addrs[0].Bits() != 31 || addrs[e.Addrs[0]] {
						t.Fatalf("link %s: address %v not a /31 of its own", &l, e.Addrs)
					}
					addrs[e.Addrs[0]] = true
				}
				if l.MTU != 1500 || !l.Up {
					t.Fatalf("link %s: mtu %d up %v", &l, l.MTU, l.Up)
				}
			}
			for _, ns := range f.Namespaces {
				if len(ns.LoopbackAddrs) != 1 || los[ns.LoopbackAddrs[0]] {
					t.Fatalf("%s: loopback %v not one of its own", ns.Name, ns.LoopbackAddrs)
				}
				los[ns.LoopbackAddrs[0]] = true
				if len(ns.Sysctls) != 3 {
					t.Fatalf("%s: sysctls %v, want forwarding on and IPv6 off", ns.Name, ns.Sysctls)
				}
				if c.want.degree > 0 && len(ns.Links) != c.want.degree {
					t.Fatalf("%s has %d links, want %d", ns.Name, len(ns.Links), c.want.degree)
				}
				for k := range ns.Links {
					mine, _ := ns.Links[k].Ends(ns.Name)
					if !strings.HasPrefix(mine.Interface, "eth") {
						t.Fatalf("%s: interface %s", ns.Name, mine.Interface)
					}
				}
			}
		})
	}
}

func TestRandomIsSeeded(t *testing.T) {
	a, _ := Random("r", 100, 4, 1)
	b, _ := Random("r", 100, 4, 1)
	c, _ := Random("r", 100, 4, 2)
	if len(a.Edges) != 200 || !slices.Equal(a.Edges, b.Edges) || slices.Equal(a.Edges, c.Edges) {
		t.Fatal("the same seed must give the same graph, another seed another")
	}
}

func TestRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
	}{
		{"line of 1", second(Line("r", 1))},
		{"ring of 2", second(Ring("r", 2))},
		{"torus 2x5", second(Grid("r", 2, 5, true))},
		{"fat-tree odd", second(FatTree("", 5))},
		{"random odd", second(Random("r", 5, 3, 1))},
		{"random degree", second(Random("r", 3, 3, 1))},
	} {
		if c.err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	top, _ := Line("r", 3)
	bad := Options{Addressing: Addressing{Links: netip.MustParsePrefix("10.0.0.0/31"), Loopbacks: DefaultAddressing.Loopbacks}}
	if err := top.Write(&bytes.Buffer{}, bad); err == nil || !strings.Contains(err.Error(), "link pool") {
		t.Errorf("2 links from a /31: %v", err)
	}
}

func second(_ *Topology, err error) error { return err }

// TestBirdConfigPerRouter: with BirdHello, every router runs BIRD from a
// config of its own whose router id is its loopback address.
func TestBirdConfigPerRouter(t *testing.T) {
	top, _ := FatTree("", 4)
	var b strings.Builder
	if err := top.Write(&b, Options{Addressing: DefaultAddressing, BirdHello: 2, Processes: []string{"- {name: other, command: [sleep, '1000']}"}}); err != nil {
		t.Fatal(err)
	}
	f, err := spec.Parse("bird.yaml", []byte(b.String()), spec.Options{})
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	ids := map[string]bool{}
	for _, ns := range f.Namespaces {
		if len(ns.Processes) != 2 || ns.Processes[1].Name != "bird" {
			t.Fatalf("%s: processes %+v", ns.Name, ns.Processes)
		}
		p := ns.Processes[1]
		id := "router id " + ns.LoopbackAddrs[0].Addr().String() + ";"
		if !strings.Contains(p.Config, id) || !strings.Contains(p.Config, "hello 2; dead 8;") || ids[id] {
			t.Fatalf("%s: config\n%s", ns.Name, p.Config)
		}
		ids[id] = true
		if !slices.Contains(p.Command, spec.ConfigPlaceholder) || p.Restart != spec.RestartAlways {
			t.Fatalf("%s: %+v", ns.Name, p)
		}
	}
}
