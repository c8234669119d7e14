package bench

import (
	"bytes"
	"strings"
	"testing"
)

// TestSeedsMatchTheirScenarios: every seed table names a scenario and a
// configuration it has, and every row has its x and one number per column.
func TestSeedsMatchTheirScenarios(t *testing.T) {
	all, err := allSeeds()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 {
		t.Fatal("no seed tables")
	}
	for _, s := range all {
		sc, _ := Lookup(s.Scenario)
		if len(sc.Engines) > 1 && s.Config["engine"] == "" {
			t.Errorf("%s: the scenario has engines; the seed must name the one that runs the report's method", s.Scenario)
		}
		for _, k := range sc.Keys {
			if s.Config[k] == "" {
				t.Errorf("%s: seed config lacks %q (of the scenario's keys %v)", s.Scenario, k, sc.Keys)
			}
		}
	}
}

func TestWriteSeedTable(t *testing.T) {
	seeds, err := Seeds("veth")
	if err != nil || len(seeds) != 1 {
		t.Fatalf("veth seeds: %v %v", seeds, err)
	}
	cfg := map[string]string{"engine": "iproute2", "variant": "kernel-names"}
	run := &Run{Keys: []string{"engine", "variant"}, Samples: []Sample{
		{Config: cfg, Mark: 500, Metric: "create (cumulative)", Value: 1},
		{Config: cfg, Mark: 500, Metric: "create (cumulative)", Value: 3},
		{Config: cfg, Mark: 500, Metric: "delete (cumulative)", Value: 4},
		{Config: map[string]string{"engine": "native", "variant": "kernel-names"}, Mark: 1000, Metric: "create (cumulative)", Value: 9},
	}}
	var b bytes.Buffer
	if err := WriteSeedTable(&b, seeds[0], run); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"87txo6ewxf", "1123", "1185"} {
		if !strings.Contains(out, want) {
			t.Errorf("seed table lacks %q:\n%s", want, out)
		}
	}
	var row500, row1000 string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && f[0] == "500" {
			row500 = l
		}
		if len(f) > 0 && f[0] == "1000" {
			row1000 = l
		}
	}
	if f := strings.Fields(row500); len(f) != 5 || f[3] != "2" || f[4] != "4" {
		t.Errorf("row 500: %q, want the report's 18 26 and this run's mean 2 and 4", row500)
	}
	if f := strings.Fields(row1000); len(f) != 5 || f[3] != "-" {
		t.Errorf("row 1000: %q: another engine's figure must not be used", row1000)
	}
}
