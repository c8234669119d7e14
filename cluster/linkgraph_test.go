package cluster

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nsfleet/nsfleet/spec"
	"github.com/nsfleet/nsfleet/topo"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// torusGraph is the link graph of a rows x cols torus of routers r1...
func torusGraph(t *testing.T, rows, cols int) ([]string, Graph) {
	t.Helper()
	top, err := topo.Grid("r", rows, cols, true)
	if err != nil {
		t.Fatal(err)
	}
	g := Graph{}
	var names []string
	for k := 1; k <= top.Routers(); k++ {
		names = append(names, top.Name(k))
	}
	for _, e := range top.Edges {
		a, b := top.Name(e[0]), top.Name(e[1])
		g[a] = append(g[a], b)
		g[b] = append(g[b], a)
	}
	return names, g
}

// TestScheduleKeepsLinkedTogether: a torus placed on three nodes is cut
// into blocks (few links between nodes, where the plain least-loaded
// placement cuts nearly all), balanced; after a node is lost its routers
// go to the survivors with few more links cut.
func TestScheduleKeepsLinkedTogether(t *testing.T) {
	names, g := torusGraph(t, 20, 30) // 600 routers, 1,200 links
	s := ClusterView{Names: names, Nodes: alive("a", "b", "c"), Assign: map[string]Assignment{}, Linked: g}
	s.Assign = applyPlan(s, Schedule(s))
	checkOnce(t, s, s.Assign, 0)
	c := counts(s.Assign)
	for n, k := range c {
		if k < 195 || k > 205 {
			t.Fatalf("node %s holds %d of 600: %v", n, k, c)
		}
	}
	cut := g.Cut(Placement(s.Assign))
	plain := ClusterView{Names: names, Nodes: alive("a", "b", "c"), Assign: map[string]Assignment{}}
	plainCut := g.Cut(Placement(applyPlan(plain, Schedule(plain))))
	t.Logf("600-router torus on 3 nodes: %d of %d links cut (least-loaded alone: %d)", cut, g.Links(), plainCut)
	// Three blocks of a 20x30 torus: about 3 x 2 x 30 = 180 at best.
	if cut > 250 || plainCut < 500 {
		t.Fatalf("%d links cut, least-loaded alone %d", cut, plainCut)
	}
	if p := Schedule(s); p.Changed() {
		t.Fatalf("second plan changes %v", p.Assign)
	}
	s.Nodes["b"] = NodeView{} // lost
	s.Assign = applyPlan(s, Schedule(s))
	checkOnce(t, s, s.Assign, 0)
	after := g.Cut(Placement(s.Assign))
	t.Logf("after losing one node: %d links cut", after)
	if after > 2*cut {
		t.Fatalf("%d links cut after the failover, %d before", after, cut)
	}
}

func TestGraphCut(t *testing.T) {
	g := Graph{"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}
	if g.Links() != 2 {
		t.Fatalf("links %d", g.Links())
	}
	if n := g.Cut(map[string]string{"a": "x", "b": "x", "c": "y"}); n != 1 {
		t.Fatalf("cut %d, want 1", n)
	}
	if n := g.Cut(map[string]string{"a": "x", "b": "y"}); n != 1 {
		t.Fatalf("cut %d with c unplaced, want 1", n)
	}
}

// TestDecideLinkPlaces: a namespace whose link peer comes here or leaves
// is brought up again (the link changes form), and so is one with a
// tunnel end when the nodes it floods to change; an unchanged one is not.
func TestDecideLinkPlaces(t *testing.T) {
	f, err := spec.Parse("ring.yaml", []byte(`namespaces:
  - {name: "r{i}", count: 3}
links:
  - {a: "r1:eth0", b: "r2:eth0"}
  - {a: "r2:eth1", b: "r3:eth0"}
`), spec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r1, _ := f.Lookup("r1")
	base := Observation{Fleet: f, Assigned: []string{"r1", "r2"}, Applied: appliedAll(f, "r1", "r2"), Tunnels: "198.19.2.2 "}
	base.Placed = map[string]string{
		"r1": LinkPlaces(r1, []string{"r1", "r2"}, base.Tunnels),
		"r2": LinkPlaces(must(f.Lookup("r2")), []string{"r1", "r2"}, base.Tunnels),
	}
	if d := Decide(OnChange, base); len(d.Up) != 0 {
		t.Fatalf("nothing moved, Up %v", d.Up)
	}
	if p := Measure(base, Decide(OnChange, base), true); p.Ready != 2 || !p.Converged {
		t.Fatalf("nothing moved: %+v", p)
	}
	// r2 leaves: r1's link to it becomes a tunnel; until it is, r1 is not
	// ready.
	o := base
	o.Assigned = []string{"r1"}
	d := Decide(OnChange, o)
	if !slices.Equal(d.Up, []string{"r1"}) || d.Places["r1"] == base.Placed["r1"] {
		t.Fatalf("r2 gone: Up %v places %q", d.Up, d.Places)
	}
	if p := Measure(o, d, true); p.Ready != 0 || p.Converged {
		t.Fatalf("r1's link not changed yet, yet %+v", p)
	}
	// r3 arrives: r2's tunnel to it becomes a veth; r1 is untouched.
	o = base
	o.Assigned = []string{"r1", "r2", "r3"}
	if d := Decide(OnChange, o); !slices.Equal(d.Up, []string{"r2", "r3"}) {
		t.Fatalf("r3 here: Up %v", d.Up)
	}
	// A node joins: r2 (a tunnel end, to r3) floods to it too; r1 has none.
	o = base
	o.Tunnels = "198.19.2.2 198.19.3.2 "
	if d := Decide(OnChange, o); !slices.Equal(d.Up, []string{"r2"}) {
		t.Fatalf("a node joined: Up %v", d.Up)
	}
}

func must(ns *spec.Namespace, ok bool) *spec.Namespace {
	if !ok {
		panic("no such namespace")
	}
	return ns
}

// TestAllocateVNIs: links get VNIs from the counter, keep them across
// applies (a link identified by its two ends), and new links take the
// next ones; both namespaces of a link carry its VNI.
func TestAllocateVNIs(t *testing.T) {
	parse := func(n int) *spec.Fleet {
		var b strings.Builder
		fmt.Fprintf(&b, "namespaces:\n  - {name: \"r{i}\", count: %d}\nlinks:\n  - {a: \"r{i}:eth1\", b: \"r{i+1}:eth0\", count: %d}\n", n, n-1)
		f, err := spec.Parse("line.yaml", []byte(b.String()), spec.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := parse(4)
	op, err := allocateVNIs(f, nil, []*mvccpb.KeyValue{{Value: []byte("10")}})
	if err != nil || op == nil || string(op.ValueBytes()) != "13" {
		t.Fatalf("counter update %v %v", op, err)
	}
	stored := map[string][]byte{}
	for i := range f.Namespaces {
		ns := &f.Namespaces[i]
		for _, l := range ns.Links {
			if l.VNI < 10 || l.VNI > 12 {
				t.Fatalf("%s: link %s VNI %d", ns.Name, &l, l.VNI)
			}
		}
		stored[ns.Name], _ = EncodeNamespace(ns)
	}
	r2, _ := f.Lookup("r2")
	if r2.Links[0].VNI != 10 || r2.Links[1].VNI != 11 {
		t.Fatalf("r2's links: %+v", r2.Links)
	}
	// Applied again with one more router: the old links keep theirs.
	g := parse(5)
	op, err = allocateVNIs(g, stored, []*mvccpb.KeyValue{{Value: []byte("13")}})
	if err != nil || op == nil || string(op.ValueBytes()) != "14" {
		t.Fatalf("counter update %v %v", op, err)
	}
	r4, _ := g.Lookup("r4")
	if r4.Links[0].VNI != 12 || r4.Links[1].VNI != 13 {
		t.Fatalf("r4's links: %+v", r4.Links)
	}
	// Nothing new: no counter write.
	if op, err := allocateVNIs(parse(4), stored, []*mvccpb.KeyValue{{Value: []byte("14")}}); op != nil || err != nil {
		t.Fatalf("nothing new, yet %v %v", op, err)
	}
	if _, err := allocateVNIs(parse(4), nil, []*mvccpb.KeyValue{{Value: []byte(fmt.Sprint(MaxVNI))}}); err == nil {
		t.Fatal("VNIs past 24 bits given out")
	}
}
