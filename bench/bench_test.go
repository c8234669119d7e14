package bench

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/nsfleet/nsfleet/internal/nstest"
)

func TestMain(m *testing.M) {
	nstest.Main(m)
}

// TestFakeRouterNative runs the scenario for real, small.
func TestFakeRouterNative(t *testing.T) {
	nstest.RequireRoot(t)
	s, _ := Lookup("fake-router")
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	r, err := Execute(context.Background(), s, Options{N: 40, Mark: 20, Runs: 2, Engines: []string{"native"}, Variants: []string{"add", "add+2exec+2link"}, Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	rates := 0
	for _, x := range r.Samples {
		if x.Metric == "rate" {
			rates++
			if x.Value <= 0 {
				t.Errorf("rate %v", x)
			}
		}
	}
	if rates != 2*2*2 {
		t.Fatalf("%d rate samples, want 8", rates)
	}
	if r.Env.CPUs == 0 || r.Env.Kernel == "" {
		t.Fatalf("env not captured: %+v", r.Env)
	}
	if left := nstest.HostLinks(t, p); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// TestChurn runs the churn scenario for real, small, with a limit low
// enough that creation outruns freeing.
func TestChurn(t *testing.T) {
	nstest.RequireRoot(t)
	old := ChurnLimit
	ChurnLimit = 50
	defer func() { ChurnLimit = old }()
	s, _ := Lookup("churn")
	r, err := Execute(context.Background(), s, Options{N: 2000, Mark: 500, Variants: []string{"ipc", "net"}})
	if err != nil {
		t.Skipf("cannot run in a user namespace here: %v", err)
	}
	seen := map[string]int{}
	for _, x := range r.Samples {
		seen[x.Config["type"]+" "+x.Metric]++
	}
	for _, want := range []string{"ipc rate", "net rate", "net time to drain", "ipc ENOSPC stalls"} {
		if seen[want] == 0 {
			t.Errorf("no %q sample: %v", want, seen)
		}
	}
	if seen["net rate"] != 4 {
		t.Errorf("net rate samples: %d, want 4 marks", seen["net rate"])
	}
}

func TestVeth(t *testing.T) {
	nstest.RequireRoot(t)
	s, _ := Lookup("veth")
	r, err := Execute(context.Background(), s, Options{N: 40, Mark: 20, Variants: []string{"explicit", "kernel-names", "peer-moved", "dummy"}})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, x := range r.Samples {
		seen[x.Config["engine"]+" "+x.Config["variant"]+" "+x.Metric]++
	}
	// The report's own method (ip's loop) runs as an engine, with the
	// report's cumulative figures; the dummy control runs or says why not.
	for _, want := range []string{"native explicit create rate", "native kernel-names create rate", "native peer-moved create rate",
		"native explicit delete one by one", "native explicit delete by namespace exit",
		"iproute2 kernel-names create (cumulative)", "iproute2 kernel-names delete (cumulative)", "native kernel-names delete (cumulative)"} {
		if seen[want] == 0 {
			t.Errorf("no %q sample: %v", want, seen)
		}
	}
	dummy := seen["native dummy create (cumulative)"] > 0
	for _, sk := range r.Skipped {
		dummy = dummy || strings.Contains(sk, "variant=dummy: this kernel has no dummy device")
	}
	if !dummy {
		t.Errorf("dummy neither ran nor was skipped with a reason: %v", r.Skipped)
	}
}

func TestMountPropagation(t *testing.T) {
	nstest.RequireRoot(t)
	old := IdleMountNamespaces
	IdleMountNamespaces = 3
	defer func() { IdleMountNamespaces = old }()
	s, _ := Lookup("mount-propagation")
	nstest.SystemRunDir(t) // the iproute2 engine's ip knows no other run dir
	prefix := nstest.Prefix(t)
	r, err := Execute(context.Background(), s, Options{N: 20, Mark: 10, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, x := range r.Samples {
		seen[x.Config["engine"]+" "+x.Config["layout"]+" "+x.Metric]++
	}
	for _, l := range []string{"shared", "parent-shared", "private"} {
		if seen["native "+l+" add rate"] != 2 || seen["native "+l+" delete rate"] != 1 || seen["native "+l+" new mount namespace"] != 2 {
			t.Errorf("%s: %v", l, seen)
		}
		if seen["native "+l+" add sys"] != 1 || seen["native "+l+" delete real"] != 1 {
			t.Errorf("%s: no time(1)-like figures: %v", l, seen)
		}
	}
	// The report's own loop, as time(1) printed it.
	for _, m := range []string{"add real", "add user", "add sys", "delete real", "delete user", "delete sys"} {
		if seen["iproute2 shared "+m] != 1 {
			t.Errorf("iproute2 shared %s: %v (skipped: %v)", m, seen, r.Skipped)
		}
	}
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), prefix) {
				t.Errorf("left %s in /run/netns", e.Name())
			}
		}
	}
}

func TestUevent(t *testing.T) {
	nstest.RequireRoot(t)
	old := UeventNamespaces
	UeventNamespaces = 5
	defer func() { UeventNamespaces = old }()
	s, _ := Lookup("uevent")
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	r, err := Execute(context.Background(), s, Options{N: 200, Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, x := range r.Samples {
		if x.Metric == "transaction time p50" {
			n++
			if x.Value <= 0 {
				t.Errorf("%+v", x)
			}
		}
	}
	if n != 6 {
		t.Fatalf("%d p50 samples, want 6 (listeners, in a user namespace, none, and the report's three cases); skipped %v", n, r.Skipped)
	}
	ci := 0
	for _, x := range r.Samples {
		if strings.HasPrefix(x.Config["listeners"], "thread-") && x.Metric == "transaction time mean 95% CI half-width" && x.Value > 0 {
			ci++
		}
	}
	if ci != 3 {
		t.Errorf("%d report cases with a confidence interval, want 3", ci)
	}
	if left := nstest.HostLinks(t, p); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// TestFakeRouterEveryEngine runs the report's own methods too (the ip
// script, ip -batch, pyroute2) and the Go libraries' (netlink), small. Where python3-pyroute2 is missing
// the engine is skipped with the reason, except in CI, which installs it.
func TestFakeRouterEveryEngine(t *testing.T) {
	nstest.SystemRunDir(t) // ip and pyroute2 pin in /run/netns: leave it as found
	s, _ := Lookup("fake-router")
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	r, err := Execute(context.Background(), s, Options{N: 6, Mark: 3, Runs: 1, Engines: []string{"iproute2", "iproute2-batch", "pyroute2", "netlink", "netlink-1q"}, Variants: []string{"add+2exec+2link"}, Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	ran := map[string]int{}
	for _, x := range r.Samples {
		if x.Metric == "rate" && x.Value > 0 {
			ran[x.Config["engine"]]++
		}
	}
	for _, eng := range []string{"iproute2", "iproute2-batch", "pyroute2", "netlink", "netlink-1q"} {
		if ran[eng] != 2 {
			if eng == "pyroute2" && os.Getenv("CI") == "" && len(r.Skipped) > 0 {
				t.Logf("pyroute2 skipped here: %v", r.Skipped)
				continue
			}
			t.Errorf("engine %s: %d rate samples, want 2 (skipped: %v)", eng, ran[eng], r.Skipped)
		}
	}
	if left := nstest.HostLinks(t, p); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// TestDriftListener runs the scenario for real, small: every variant
// makes its routers, the filtered listener is handed far fewer
// notifications than the unfiltered one while still hearing some, and
// the paused one none.
func TestDriftListener(t *testing.T) {
	nstest.RequireRoot(t)
	s, _ := Lookup("drift-listener")
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	r, err := Execute(context.Background(), s, Options{N: 40, Mark: 20, Runs: 1, Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	rates := map[string]int{}
	heard := map[string]float64{}
	for _, x := range r.Samples {
		switch x.Metric {
		case "rate":
			rates[x.Config["variant"]]++
		case "notifications/router":
			heard[x.Config["variant"]] = x.Value
		}
	}
	for _, v := range s.Variants {
		if rates[v] != 2 {
			t.Errorf("variant %s: %d rate samples, want 2", v, rates[v])
		}
	}
	if heard["filtered"] == 0 || heard["filtered"] > 0.6*heard["unfiltered"] {
		t.Errorf("notifications per router: filtered %.1f, unfiltered %.1f; want some, and under 60%%", heard["filtered"], heard["unfiltered"])
	}
	if p, ok := heard["paused"]; !ok || p != 0 {
		t.Errorf("notifications per router, paused: %v (recorded: %v), want 0", p, ok)
	}
	if left := nstest.HostLinks(t, p); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
}
