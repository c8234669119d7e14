// Package topo generates emulated networks as nsfleet specs: routers as
// namespaces, links between them with /31 point-to-point addresses, a
// loopback address per router. The output is an ordinary spec, meant to be
// read and edited: one template per role of router, one line per link.
//
// Everything here is pure: no kernel, no files.
package topo

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"strings"
)

// Role is a group of routers named Prefix1..PrefixCount.
type Role struct {
	Prefix string
	Count  int
}

// Topology is a graph: routers numbered 1..N across the roles in order,
// and edges between them.
type Topology struct {
	Shape string // for the header: how it was made
	Roles []Role
	Edges [][2]int
}

// Routers returns the number of routers.
func (t *Topology) Routers() int {
	n := 0
	for _, r := range t.Roles {
		n += r.Count
	}
	return n
}

// Name returns router k's name (1-based, across roles).
func (t *Topology) Name(k int) string {
	for _, r := range t.Roles {
		if k <= r.Count {
			return fmt.Sprintf("%s%d", r.Prefix, k)
		}
		k -= r.Count
	}
	panic(fmt.Sprintf("topo: router %d out of range", k))
}

func one(prefix string, n int) []Role { return []Role{{Prefix: prefix, Count: n}} }

// Line: r1 - r2 - ... - rN.
func Line(prefix string, n int) (*Topology, error) {
	if n < 2 {
		return nil, errors.New("line: want at least 2 routers")
	}
	t := &Topology{Shape: fmt.Sprintf("line of %d", n), Roles: one(prefix, n)}
	for i := 1; i < n; i++ {
		t.Edges = append(t.Edges, [2]int{i, i + 1})
	}
	return t, nil
}

// Ring: a line closed by rN - r1.
func Ring(prefix string, n int) (*Topology, error) {
	if n < 3 {
		return nil, errors.New("ring: want at least 3 routers")
	}
	t, _ := Line(prefix, n)
	t.Shape = fmt.Sprintf("ring of %d", n)
	t.Edges = append(t.Edges, [2]int{n, 1})
	return t, nil
}

// Star: a hub joined to n leaves.
func Star(prefix string, n int) (*Topology, error) {
	if n < 1 {
		return nil, errors.New("star: want at least 1 leaf")
	}
	t := &Topology{Shape: fmt.Sprintf("star of %d leaves", n), Roles: []Role{{Prefix: prefix + "hub", Count: 1}, {Prefix: prefix, Count: n}}}
	for i := 1; i <= n; i++ {
		t.Edges = append(t.Edges, [2]int{1, 1 + i})
	}
	return t, nil
}

// Grid: rows x cols, each router joined to its right and lower
// neighbours; with wrap, the last column to the first and the last row to
// the first (a torus).
func Grid(prefix string, rows, cols int, wrap bool) (*Topology, error) {
	min := 1
	shape := "grid"
	if wrap {
		// Below 3 a wrap joins two neighbours twice.
		min, shape = 3, "torus"
	}
	if rows < min || cols < min || rows*cols < 2 {
		return nil, fmt.Errorf("%s: want at least %d rows and %d columns", shape, min, min)
	}
	t := &Topology{Shape: fmt.Sprintf("%s of %dx%d", shape, rows, cols), Roles: one(prefix, rows*cols)}
	id := func(r, c int) int { return r*cols + c + 1 }
	for r := range rows {
		for c := range cols {
			if c+1 < cols || wrap {
				t.Edges = append(t.Edges, [2]int{id(r, c), id(r, (c+1)%cols)})
			}
			if r+1 < rows || wrap {
				t.Edges = append(t.Edges, [2]int{id(r, c), id((r+1)%rows, c)})
			}
		}
	}
	return t, nil
}

// FatTree is the k-ary fat-tree of data centres (Al-Fares et al.): k pods
// of k/2 edge and k/2 aggregation switches, (k/2)² core switches, and k/2
// hosts under each edge switch: 5k²/4 switches, k³/4 hosts, 3k³/4 links.
// The roles are named prefix+"core", "agg", "edge" and "host".
func FatTree(prefix string, k int) (*Topology, error) {
	if k < 2 || k%2 != 0 {
		return nil, errors.New("fat-tree: k must be even and at least 2")
	}
	h := k / 2
	t := &Topology{Shape: fmt.Sprintf("fat-tree k=%d", k), Roles: []Role{
		{Prefix: prefix + "core", Count: h * h}, {Prefix: prefix + "agg", Count: k * h}, {Prefix: prefix + "edge", Count: k * h}, {Prefix: prefix + "host", Count: k * h * h},
	}}
	core := func(i int) int { return 1 + i }
	agg := func(pod, i int) int { return 1 + h*h + pod*h + i }
	edge := func(pod, i int) int { return 1 + h*h + k*h + pod*h + i }
	host := func(pod, e, i int) int { return 1 + h*h + 2*k*h + (pod*h+e)*h + i }
	for pod := range k {
		for e := range h {
			for i := range h {
				t.Edges = append(t.Edges, [2]int{edge(pod, e), host(pod, e, i)})
			}
			for a := range h {
				t.Edges = append(t.Edges, [2]int{agg(pod, a), edge(pod, e)})
			}
		}
		for a := range h {
			for c := range h {
				t.Edges = append(t.Edges, [2]int{core(a*h + c), agg(pod, a)})
			}
		}
	}
	return t, nil
}

// LeafSpine: every leaf joined to every spine, hosts under each leaf. The
// roles are named prefix+"spine", "leaf" and "host".
func LeafSpine(prefix string, leaves, spines, hostsPerLeaf int) (*Topology, error) {
	if leaves < 1 || spines < 1 || hostsPerLeaf < 0 {
		return nil, errors.New("leaf-spine: want at least 1 leaf and 1 spine, and no negative host count")
	}
	t := &Topology{Shape: fmt.Sprintf("leaf-spine of %d leaves, %d spines, %d hosts per leaf", leaves, spines, hostsPerLeaf),
		Roles: []Role{{Prefix: prefix + "spine", Count: spines}, {Prefix: prefix + "leaf", Count: leaves}}}
	if hostsPerLeaf > 0 {
		t.Roles = append(t.Roles, Role{Prefix: prefix + "host", Count: leaves * hostsPerLeaf})
	}
	for l := range leaves {
		for s := range spines {
			t.Edges = append(t.Edges, [2]int{1 + s, 1 + spines + l})
		}
		for h := range hostsPerLeaf {
			t.Edges = append(t.Edges, [2]int{1 + spines + l, 1 + spines + leaves + l*hostsPerLeaf + h})
		}
	}
	return t, nil
}

// Random is a random d-regular graph on n routers (every router has d
// links, no loops, no double links), drawn by pairing link stubs at
// random and starting over on a loop or a double link; the same seed gives
// the same graph.
func Random(prefix string, n, d int, seed uint64) (*Topology, error) {
	switch {
	case d < 1 || n <= d:
		return nil, errors.New("random: want a degree of at least 1 and below the number of routers")
	case n*d%2 != 0:
		return nil, errors.New("random: routers x degree must be even (each link has two ends)")
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for try := 0; try < 1000; try++ {
		if edges, ok := pairStubs(rng, n, d); ok {
			return &Topology{Shape: fmt.Sprintf("random %d-regular graph of %d, seed %d", d, n, seed), Roles: one(prefix, n), Edges: edges}, nil
		}
	}
	return nil, fmt.Errorf("random: no %d-regular graph of %d found in 1000 tries", d, n)
}

// pairStubs pairs the stubs of a random order, each link once; it gives
// up on a loop or a double link. It takes the stubs from a random router
// among those with free stubs, which keeps the tries few for large d.
func pairStubs(rng *rand.Rand, n, d int) ([][2]int, bool) {
	stubs := make([]int, 0, n*d)
	for v := 1; v <= n; v++ {
		for range d {
			stubs = append(stubs, v)
		}
	}
	rng.Shuffle(len(stubs), func(i, j int) { stubs[i], stubs[j] = stubs[j], stubs[i] })
	seen := make(map[[2]int]bool, n*d/2)
	edges := make([][2]int, 0, n*d/2)
	for i := 0; i < len(stubs); i += 2 {
		a, b := stubs[i], stubs[i+1]
		if a > b {
			a, b = b, a
		}
		if a == b || seen[[2]int{a, b}] {
			// Swap b's stub with a random later one and retry this pair.
			if i+2 >= len(stubs) {
				return nil, false
			}
			j := i + 2 + rng.IntN(len(stubs)-i-2)
			stubs[i+1], stubs[j] = stubs[j], stubs[i+1]
			i -= 2
			if len(edges) > 0 && rng.IntN(64) == 0 {
				return nil, false // stuck: start over now and then
			}
			continue
		}
		seen[[2]int{a, b}] = true
		edges = append(edges, [2]int{a, b})
	}
	return edges, true
}

// Addressing says where the generated addresses come from.
type Addressing struct {
	// Links is the pool for the links' /31s, taken in order (link k gets
	// the k-th /31).
	Links netip.Prefix
	// Loopbacks is a /16 (or longer) of IPv4 for the routers' loopback
	// addresses: router k gets the k-th address of it.
	Loopbacks netip.Prefix
}

// DefaultAddressing: links from 10.0.0.0/9, loopbacks from 10.255.0.0/16.
var DefaultAddressing = Addressing{
	Links:     netip.MustParsePrefix("10.0.0.0/9"),
	Loopbacks: netip.MustParsePrefix("10.255.0.0/16"),
}

// Options shape the spec.
type Options struct {
	Addressing Addressing
	MTU        int  // of every link; 0: the kernel's default
	NoForward  bool // leave net.ipv4.ip_forward as it is (routers forward by default)
	NoIPv6     bool // turn IPv6 off in the routers, before their links exist
	// Processes are added to every router's template, as spec YAML lines
	// (each a "- " item of the processes list); "{name}" is the router's
	// name.
	Processes []string
	// BirdHello, if above 0, runs BIRD (Debian's bird2) in every router
	// with a configuration of its own: OSPF on every link, this many
	// seconds between hellos (see BirdConfig).
	BirdHello int
}

// BirdConfig is the BIRD configuration every router gets with
// Options.BirdHello, as a spec config template ({loopback} is the
// router's own address, the OSPF router id). OSPF runs point-to-point on
// every link (eth*) and announces the loopback; only the /32 loopbacks go
// into the kernel's table: a router needs a route to every other router,
// and the links' /31s would triple the routes every router installs (the
// kernel installs them one at a time, under one lock for the machine).
func BirdConfig(hello int) string {
	return fmt.Sprintf(`log stderr all;
router id {loopback};
protocol device { scan time 10; }
protocol direct { ipv4; interface "lo"; }
protocol kernel { ipv4 { export where source = RTS_OSPF && net.len = 32; }; }
protocol ospf v2 {
  ipv4 { import all; export none; };
  area 0 {
    interface "eth*" { type ptp; hello %d; dead %d; };
    interface "lo" { stub yes; };
  };
}
`, hello, 4*hello)
}

func (o *Options) check(t *Topology) error {
	a := o.Addressing
	if !a.Links.Addr().Is4() || !a.Loopbacks.Addr().Is4() {
		return errors.New("topo: link and loopback pools must be IPv4")
	}
	if a.Loopbacks.Bits() != 16 || a.Loopbacks.Masked() != a.Loopbacks {
		return fmt.Errorf("topo: the loopback pool %s must be a /16 (its addresses are written as {i/256}.{i%%256})", a.Loopbacks)
	}
	if n := t.Routers(); n > 65534 {
		return fmt.Errorf("topo: %d routers do not fit the loopback pool %s", n, a.Loopbacks)
	}
	if need, have := uint64(len(t.Edges))*2, uint64(1)<<(32-a.Links.Bits()); need > have {
		return fmt.Errorf("topo: %d links need %d addresses; the link pool %s has %d", len(t.Edges), need, a.Links, have)
	}
	return nil
}

// Write writes t as a spec.
func (t *Topology) Write(w io.Writer, o Options) error {
	if err := o.check(t); err != nil {
		return err
	}
	b := &strings.Builder{}
	fmt.Fprintf(b, "# nsfleet topo: %s: %d routers, %d links.\n", t.Shape, t.Routers(), len(t.Edges))
	fmt.Fprintf(b, "# Links: /31s from %s in link order; loopbacks from %s in router order.\n", o.Addressing.Links, o.Addressing.Loopbacks)
	b.WriteString("namespaces:\n")
	lo := o.Addressing.Loopbacks.Addr().As4()
	off := 0
	for _, r := range t.Roles {
		fmt.Fprintf(b, "  - name: \"%s{i}\"\n", r.Prefix)
		if r.Count != 1 {
			fmt.Fprintf(b, "    count: %d\n", r.Count)
		}
		fmt.Fprintf(b, "    loopback_addresses: [\"%d.%d.{i+%d/256}.{i+%d%%256}/32\"]\n", lo[0], lo[1], off, off)
		var sysctls []string
		if !o.NoForward {
			sysctls = append(sysctls, `net.ipv4.ip_forward: "1"`)
		}
		if o.NoIPv6 {
			sysctls = append(sysctls, `net.ipv6.conf.all.disable_ipv6: "1"`, `net.ipv6.conf.default.disable_ipv6: "1"`)
		}
		if len(sysctls) > 0 {
			fmt.Fprintf(b, "    sysctls: {%s}\n", strings.Join(sysctls, ", "))
		}
		if len(o.Processes) > 0 || o.BirdHello > 0 {
			b.WriteString("    processes:\n")
			for _, p := range o.Processes {
				fmt.Fprintf(b, "      %s\n", p)
			}
		}
		if o.BirdHello > 0 {
			b.WriteString("      - name: bird\n        command: [bird, -f, -c, \"{config}\", -s, bird.ctl]\n        restart: always\n        config: |\n")
			for _, l := range strings.SplitAfter(strings.TrimSuffix(BirdConfig(o.BirdHello), "\n"), "\n") {
				b.WriteString("          " + l)
			}
			b.WriteString("\n")
		}
		off += r.Count
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if len(t.Edges) == 0 {
		return nil
	}
	mtu := ""
	if o.MTU > 0 {
		mtu = fmt.Sprintf(", mtu: %d", o.MTU)
	}
	ports := make([]int, t.Routers()+1) // next interface number of each router
	b4 := o.Addressing.Links.Masked().Addr().As4()
	base := uint32(b4[0])<<24 | uint32(b4[1])<<16 | uint32(b4[2])<<8 | uint32(b4[3])
	addr := func(v uint32) netip.Addr {
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	b.Reset()
	b.WriteString("links:\n")
	for k, e := range t.Edges {
		x := base + 2*uint32(k)
		fmt.Fprintf(b, "  - {a: \"%s:eth%d\", b: \"%s:eth%d\", a_addresses: [%s/31], b_addresses: [%s/31]%s}\n",
			t.Name(e[0]), ports[e[0]], t.Name(e[1]), ports[e[1]], addr(x), addr(x+1), mtu)
		ports[e[0]]++
		ports[e[1]]++
		if b.Len() > 1<<16 {
			if _, err := io.WriteString(w, b.String()); err != nil {
				return err
			}
			b.Reset()
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
