package spec

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

const ringYAML = `namespaces:
  - name: "r{i}"
    count: 4
    loopback_addresses: ["10.255.0.{i}/32"]
    routes:
      - to: 10.0.0.0/8
        dev: e1
  - name: sw
    bridges:
      - name: br0
        ports: [p1, p2]
        addresses: ["192.0.2.1/24"]
links:
  - a: "r{i}:e1"
    b: "r{i+1}:e0"
    count: 3
    mtu: 9000
    a_addresses: ["10.0.{i}.0/31"]
    b_addresses: ["10.0.{i}.1/31"]
  # closes the ring
  - a: "r4:e1"
    b: "r1:e0"
    up: false
  - {a: "r1:sw", b: "sw:p1"}
  - {a: "r2:sw", b: "sw:p2"}
`

func TestLinks(t *testing.T) {
	f, err := Parse("ring.yaml", []byte(ringYAML), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Links) != 6 {
		t.Fatalf("%d links, want 6: %+v", len(f.Links), f.Links)
	}
	l := f.Links[1]
	if l.A.String() != "r2:e1" || l.B.Namespace != "r3" || l.MTU != 9000 || !l.Up {
		t.Errorf("second link %+v", l)
	}
	if want := netip.MustParsePrefix("10.0.2.1/31"); len(l.B.Addrs) != 1 || l.B.Addrs[0] != want {
		t.Errorf("second link's b addresses %v, want %v", l.B.Addrs, want)
	}
	if l.Origin.Line != 14 || l.Origin.Index != 2 {
		t.Errorf("second link's origin %v, want line 14 index 2", l.Origin)
	}
	if f.Links[3].Up || f.Links[3].Origin.Line != 21 {
		t.Errorf("ring's closing link %+v, want down, line 21", f.Links[3])
	}
	r1, _ := f.Lookup("r1")
	if len(r1.Links) != 3 { // e1 to r2, e0 from r4, sw to sw
		t.Fatalf("r1 has %d links, want 3", len(r1.Links))
	}
	if mine, other := r1.Links[1].Ends("r1"); mine.Interface != "e0" || other.Namespace != "r4" {
		t.Errorf("r1's second link ends: %v, %v", mine, other)
	}
	if len(r1.LoopbackAddrs) != 1 || r1.LoopbackAddrs[0].String() != "10.255.0.1/32" {
		t.Errorf("r1's loopback addresses %v", r1.LoopbackAddrs)
	}
	sw, _ := f.Lookup("sw")
	if len(sw.Bridges) != 1 || !sw.Bridges[0].Up || strings.Join(sw.Bridges[0].Ports, ",") != "p1,p2" {
		t.Errorf("sw's bridges %+v", sw.Bridges)
	}
	// A subset lists the links of its namespaces, each once.
	if sub := f.Subset([]string{"r1", "r2"}); len(sub.Links) != 5 {
		t.Errorf("subset r1, r2: %d links, want 5 (r1-r2, r2-r3, r4-r1 and the two to sw)", len(sub.Links))
	}
	// The same file in another order of the top-level lists, and in one
	// flow-style document (the whole-document parser), is the same fleet.
	i := strings.Index(ringYAML, "links:")
	swapped := ringYAML[i:] + ringYAML[:i]
	for _, text := range []string{swapped, strings.Replace(ringYAML, "namespaces:\n", "namespaces: # &anchor-free, but the ! sends it whole\n", 1)} {
		g, err := Parse("ring.yaml", []byte(text), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(g.Links) != len(f.Links) || !g.Namespaces[0].Same(&f.Namespaces[0]) {
			t.Errorf("reordered spec differs: %d links", len(g.Links))
		}
	}
	// Same: a link's origin does not count, its addresses do.
	moved, _ := Parse("ring.yaml", []byte("# a comment\n"+ringYAML), Options{})
	if m, _ := moved.Lookup("r1"); !m.Same(r1) {
		t.Error("a line added above makes r1 differ")
	}
	changed, _ := Parse("ring.yaml", []byte(strings.Replace(ringYAML, "10.0.{i}.1/31", "10.1.{i}.1/31", 1)), Options{})
	if c, _ := changed.Lookup("r1"); c.Same(r1) {
		t.Error("a changed address on r1's link leaves r1 the same")
	}
}

func TestLinksRefused(t *testing.T) {
	ns := "namespaces:\n  - name: \"r{i}\"\n    count: 3\n"
	cases := []struct{ name, yaml, want string }{
		{"no b", ns + "links:\n  - a: r1:e0\n", "both 'a' and 'b' are required"},
		{"no colon", ns + "links:\n  - {a: r1, b: r2:e0}\n", `"r1": want NAMESPACE:INTERFACE`},
		{"unknown namespace", ns + "links:\n  - {a: r1:e0, b: r9:e0}\n", `namespace "r9" is not declared`},
		{"same namespace", ns + "links:\n  - {a: r1:e0, b: r1:e1}\n", `both ends are in namespace "r1"`},
		{"interface twice", ns + "links:\n  - {a: r1:e0, b: r2:e0}\n  - {a: r1:e0, b: r3:e0}\n", "interface r1:e0 appears twice"},
		{"interface is lo", ns + "links:\n  - {a: r1:lo, b: r2:e0}\n", "interface r1:lo appears twice"},
		{"long interface", ns + "links:\n  - {a: r1:abcdefghijklmnop, b: r2:e0}\n", "above the kernel's 15"},
		{"count without {i}", ns + "links:\n  - {a: r1:e0, b: r2:e0, count: 2}\n", "no {i} placeholder"},
		{"name placeholder", ns + "links:\n  - {a: \"{name}:e0\", b: r2:e0}\n", "{name} is not available"},
		{"bad address", ns + "links:\n  - {a: r1:e0, b: r2:e0, a_addresses: [10.0.0.1]}\n", "want an address with a prefix length"},
		{"bad mtu", ns + "links:\n  - {a: r1:e0, b: r2:e0, mtu: 10}\n", "mtu 10"},
		{"unknown key", ns + "links:\n  - {a: r1:e0, b: r2:e0, c: r3:e0}\n", "field c not found"},
		{"empty link", ns + "links:\n  -\n", "empty entry in the links list"},
		{"route dev unknown", "namespaces:\n  - name: a\n    routes: [{to: default, dev: e9}]\n  - name: b\nlinks:\n  - {a: a:e0, b: b:e0}\n", `route dev "e9"`},
		{"bridge port unknown", "namespaces:\n  - name: a\n    bridges: [{name: br0, ports: [e9]}]\n", `bridge br0 port "e9" is not an interface`},
		{"bridge port twice", "namespaces:\n  - name: a\n    veths: [{host: h, peer: p}]\n    bridges: [{name: br0, ports: [p]}, {name: br1, ports: [p]}]\n", "also a port of bridge br0"},
		{"bridge of bridge", "namespaces:\n  - name: a\n    bridges: [{name: br0}, {name: br1, ports: [br0]}]\n", "a port is a veth peer or a link end"},
		{"bridge name taken", "namespaces:\n  - name: a\n    veths: [{host: h, peer: p}]\n    bridges: [{name: p}]\n", `interface "p" appears twice`},
		{"bad loopback address", "namespaces:\n  - name: a\n    loopback_addresses: [10.0.0.1]\n", "loopback_addresses"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("s.yaml", []byte(c.yaml), Options{})
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			if !strings.HasPrefix(err.Error(), "s.yaml:") {
				t.Errorf("error %q has no file:line", err)
			}
		})
	}
}
