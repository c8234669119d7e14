package bench

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/topo"
)

func TestFatTreeSizes(t *testing.T) {
	got, err := fatTreeSizes(16, 4)
	if err != nil || !slices.Equal(got, []int{4, 8, 12, 16}) {
		t.Fatalf("16 by 4: %v %v", got, err)
	}
	if got, _ := fatTreeSizes(10, 4); !slices.Equal(got, []int{4, 8, 10}) {
		t.Fatalf("10 by 4: %v", got)
	}
	for _, bad := range [][2]int{{15, 4}, {16, 3}, {0, 2}} {
		if _, err := fatTreeSizes(bad[0], bad[1]); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// TestMininetGraph: the fat-tree's hosts become Mininet hosts, the rest
// switches, every name fits an interface name (NAME-ethN) and every edge
// is kept.
func TestMininetGraph(t *testing.T) {
	ft, _ := topo.FatTree("b1234-", 16)
	g := mininetGraph(ft, "xabc")
	hosts, switches, links := g["hosts"].([]string), g["switches"].([]string), g["links"].([][2]string)
	if len(hosts) != 1024 || len(switches) != 320 || len(links) != 3072 {
		t.Fatalf("%d hosts, %d switches, %d links", len(hosts), len(switches), len(links))
	}
	for _, n := range append(hosts, switches...) {
		if len(n+"-eth16") > 15 {
			t.Fatalf("%q too long for Mininet's interface names", n)
		}
	}
	// Every host hangs under exactly one switch (an edge switch).
	under := map[string]int{}
	for _, l := range links {
		if strings.HasPrefix(l[1], "xabch") {
			under[l[1]]++
			if !strings.HasPrefix(l[0], "xabcs") {
				t.Fatalf("host link %v not from a switch", l)
			}
		}
	}
	if len(under) != 1024 {
		t.Fatalf("%d hosts linked", len(under))
	}
}

// TestTopologyScenario builds the smallest fat-tree with both tools (Mininet
// where installed), then makes Mininet pass a tiny time limit: it must stop
// there, say so, and leave nothing behind.
func TestTopologyScenario(t *testing.T) {
	nstest.RequireRoot(t)
	p := nstest.Prefix(t)
	s, _ := Lookup("topology")
	r, err := Execute(context.Background(), s, Options{N: 4, Mark: 4, Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]float64{}
	for _, x := range r.Samples {
		seen[x.Config["engine"]+" "+x.Metric] = x.Value
		if x.Mark != 36 {
			t.Errorf("mark %d, want 36 nodes", x.Mark)
		}
	}
	if seen["nsfleet rate"] <= 0 || seen["nsfleet teardown"] <= 0 {
		t.Fatalf("nsfleet samples: %v", seen)
	}
	if seen["nsfleet leftover interfaces"] != 0 || seen["nsfleet leftover namespaces"] != 0 {
		t.Fatalf("nsfleet left: %v", seen)
	}
	if topologyEngineMissing("mininet") != "" {
		t.Logf("mininet: %s", topologyEngineMissing("mininet"))
		return
	}
	if seen["mininet rate"] <= 0 || seen["mininet teardown"] <= 0 {
		t.Fatalf("mininet samples: %v (skipped %v, notes %v)", seen, r.Skipped, r.Notes)
	}
	t.Logf("k=4: nsfleet %.0f, mininet %.0f nodes+links/s", seen["nsfleet rate"], seen["mininet rate"])

	old := TopologyTimeLimit
	TopologyTimeLimit = 300 * time.Millisecond
	defer func() { TopologyTimeLimit = old }()
	r, err = Execute(context.Background(), s, Options{N: 8, Mark: 4, Engines: []string{"mininet"}, Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Samples) != 0 || !slices.ContainsFunc(r.Notes, func(n string) bool { return strings.Contains(n, "mininet stopped at k=4") }) {
		t.Fatalf("samples %d, notes %v", len(r.Samples), r.Notes)
	}
	mn := regexp.MustCompile(`^x[0-9a-f]{3}[hs][0-9]+(-eth[0-9]+)?$`)
	left, _ := hostLinks("x")
	for _, l := range left {
		if mn.MatchString(l.Name) {
			t.Errorf("left behind: %s", l.Name)
		}
	}
	if pids := processesWith("mininet:x"); len(pids) > 0 {
		t.Errorf("Mininet shells left: %v", pids)
	}
}
