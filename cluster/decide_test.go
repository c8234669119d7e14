package cluster

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nsfleet/nsfleet/spec"
)

// fleetOf parses a spec of routers r-1..r-count; extra is appended to the
// template (routes, processes).
func fleetOf(t *testing.T, count int, extra string) *spec.Fleet {
	t.Helper()
	y := fmt.Sprintf("namespaces:\n  - name: \"r-{i}\"\n    count: %d\n    veths:\n      - host: \"h-{i}\"\n        peer: p\n        peer_addresses: [\"10.{i/250}.{i%%250}.1/24\"]\n%s", count, extra)
	f, err := spec.Parse("test.yaml", []byte(y), spec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// appliedAll says every name of f was made to match f.
func appliedAll(f *spec.Fleet, names ...string) map[string]*spec.Namespace {
	m := map[string]*spec.Namespace{}
	for _, n := range names {
		m[n], _ = f.Lookup(n)
	}
	return m
}

func TestDecide(t *testing.T) {
	f3 := fleetOf(t, 3, "")
	// The same fleet with one more route for every router, and one where
	// only r-2 differs (a template of its own, declared first so that
	// every origin moves).
	withRoute := fleetOf(t, 3, "    routes:\n      - to: default\n        via: 10.0.{i}.254\n")
	oneChanged, err := spec.Parse("test.yaml", []byte(`namespaces:
  - name: "r-2"
    veths:
      - host: "h-2"
        peer: p
        peer_addresses: ["10.0.2.9/24"]
  - name: "r-{i}"
    count: 3
    start: 1
    veths:
      - host: "h-{i}"
        peer: p
        peer_addresses: ["10.0.{i}.1/24"]
`), spec.Options{})
	if err == nil {
		t.Fatal("a spec naming r-2 twice was accepted")
	}
	oneChanged, err = spec.Parse("test.yaml", []byte(`namespaces:
  - name: "r-1"
    veths:
      - host: "h-1"
        peer: p
        peer_addresses: ["10.0.1.1/24"]
  - name: "r-2"
    veths:
      - host: "h-2"
        peer: p
        peer_addresses: ["10.0.2.9/24"]
  - name: "r-3"
    veths:
      - host: "h-3"
        peer: p
        peer_addresses: ["10.0.3.1/24"]
`), spec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	procs := fleetOf(t, 3, "    processes:\n      - name: idle\n        command: [sleep, \"100\"]\n")
	all := []string{"r-1", "r-2", "r-3"}

	for _, tc := range []struct {
		name    string
		trigger Trigger
		obs     Observation
		want    Decision
	}{{
		name:    "new: nothing here yet",
		trigger: OnChange,
		obs:     Observation{Fleet: f3, Assigned: all},
		want:    Decision{Want: all, Up: all},
	}, {
		name:    "unchanged: nothing touched",
		trigger: OnChange,
		obs:     Observation{Fleet: f3, Assigned: all, Pins: all, Applied: appliedAll(f3, all...)},
		want:    Decision{Want: all},
	}, {
		name:    "changed: the spec of every router",
		trigger: OnChange,
		obs:     Observation{Fleet: withRoute, Assigned: all, Pins: all, Applied: appliedAll(f3, all...)},
		want:    Decision{Want: all, Up: all, Previous: appliedAll(f3, all...)},
	}, {
		name:    "changed: one router; the others' origins moved but they are the same",
		trigger: OnChange,
		obs:     Observation{Fleet: oneChanged, Assigned: all, Pins: all, Applied: appliedAll(f3, all...)},
		want:    Decision{Want: all, Up: []string{"r-2"}, Previous: appliedAll(f3, "r-2")},
	}, {
		name:    "a change goes before a check of everything",
		trigger: OnResync,
		obs:     Observation{Fleet: oneChanged, Assigned: all, Pins: all, Applied: appliedAll(f3, all...)},
		want:    Decision{Want: all, Up: []string{"r-2", "r-1", "r-3"}, Previous: appliedAll(f3, "r-2")},
	}, {
		name:    "not ready (failed before): tried again on any change",
		trigger: OnChange,
		obs:     Observation{Fleet: f3, Assigned: all, Pins: all, Applied: appliedAll(f3, "r-1", "r-3")},
		want:    Decision{Want: all, Up: []string{"r-2"}},
	}, {
		name:    "removed from the spec: torn down",
		trigger: OnChange,
		obs: Observation{Fleet: fleetOf(t, 2, ""), Assigned: all, Pins: all,
			Served: map[string]bool{"r-1": true, "r-2": true, "r-3": true}, Applied: appliedAll(f3, all...)},
		want: Decision{Want: []string{"r-1", "r-2"}, Teardown: []string{"r-3"}},
	}, {
		name:    "released (assigned elsewhere now): torn down, the rest untouched",
		trigger: OnChange,
		obs:     Observation{Fleet: f3, Assigned: []string{"r-1"}, Pins: all, Applied: appliedAll(f3, all...)},
		want:    Decision{Want: []string{"r-1"}, Teardown: []string{"r-2", "r-3"}},
	}, {
		name:    "foreign pins and pins of no spec nor service are never touched",
		trigger: OnResync,
		obs: Observation{Fleet: f3, Assigned: []string{"r-1"}, Pins: []string{"r-1", "r-2", "other"},
			Foreign: map[string]bool{"r-2": true}, Applied: appliedAll(f3, "r-1")},
		want: Decision{Want: []string{"r-1"}, Up: []string{"r-1"}},
	}, {
		name:    "drift: only the namespaces the kernel's events named",
		trigger: OnDrift,
		obs:     Observation{Fleet: f3, Assigned: all, Pins: all, Applied: appliedAll(f3, all...), Drifted: map[string]bool{"r-3": true}},
		want:    Decision{Want: all, Up: []string{"r-3"}},
	}, {
		name:    "drift with events lost: all",
		trigger: OnDrift,
		obs:     Observation{Fleet: f3, Assigned: all, Pins: all, Applied: appliedAll(f3, all...), AllDrifted: true},
		want:    Decision{Want: all, Up: all},
	}, {
		name:    "resync: every assigned namespace is checked",
		trigger: OnResync,
		obs:     Observation{Fleet: f3, Assigned: all, Pins: all, Applied: appliedAll(f3, all...)},
		want:    Decision{Want: all, Up: all},
	}, {
		name:    "fenced: neither creates nor tears down",
		trigger: OnChange,
		obs:     Observation{Fleet: f3, Assigned: []string{"r-1"}, Pins: all, Fenced: true},
		want:    Decision{Idle: true},
	}, {
		name:    "withdraw (rejoining): only what is not assigned here goes",
		trigger: OnWithdraw,
		obs:     Observation{Fleet: f3, Assigned: []string{"r-1"}, Pins: all, Fenced: true},
		want:    Decision{Teardown: []string{"r-2", "r-3"}},
	}, {
		name:    "spec fails to decode with one served before: the previous one is kept",
		trigger: OnChange,
		obs:     Observation{Fleet: f3, SpecErr: errors.New("bad yaml"), Assigned: all, Pins: all, Applied: appliedAll(f3, all...)},
		want:    Decision{Want: all},
	}, {
		name:    "nothing stored yet (or no value decoded): nothing created, only what was served goes",
		trigger: OnChange,
		obs:     Observation{Assigned: all, Pins: all, Served: map[string]bool{"r-1": true}},
		want:    Decision{Teardown: []string{"r-1"}},
	}, {
		name:    "assignment fails to decode: the previous one is kept, nothing torn down",
		trigger: OnChange,
		obs:     Observation{Fleet: f3, Assigned: all, AssignErr: errors.New("bad json"), Pins: all, Applied: appliedAll(f3, all...)},
		want:    Decision{Want: all},
	}, {
		name:    "processes refused: those namespaces are not served here, and go",
		trigger: OnChange,
		obs:     Observation{Fleet: procs, Assigned: all, Pins: all, Applied: appliedAll(f3, all...)},
		want:    Decision{Teardown: all, Refused: "3 namespaces assigned here run processes; this agent was started without --allow-processes"},
	}, {
		name:    "processes allowed: supervised",
		trigger: OnChange,
		obs:     Observation{Fleet: procs, Assigned: all, AllowProcesses: true, Pins: all, Applied: appliedAll(procs, all...)},
		want:    Decision{Want: all, Supervise: all},
	}, {
		name:    "run dir unreadable: nothing torn down",
		trigger: OnChange,
		obs:     Observation{Fleet: f3, Assigned: []string{"r-1"}, PinsErr: errors.New("EIO"), Applied: appliedAll(f3, "r-1")},
		want:    Decision{Want: []string{"r-1"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(tc.trigger, tc.obs)
			if d := diffDecision(got, tc.want); d != "" {
				t.Error(d)
			}
		})
	}
}

func diffDecision(got, want Decision) string {
	var out []string
	cmp := func(what string, g, w []string) {
		if !slices.Equal(g, w) {
			out = append(out, fmt.Sprintf("%s = %v, want %v", what, g, w))
		}
	}
	cmp("Want", got.Want, want.Want)
	cmp("Teardown", got.Teardown, want.Teardown)
	cmp("Up", got.Up, want.Up)
	cmp("Supervise", got.Supervise, want.Supervise)
	if len(got.Previous) != len(want.Previous) {
		out = append(out, fmt.Sprintf("Previous has %d, want %d", len(got.Previous), len(want.Previous)))
	}
	for n, p := range want.Previous {
		if got.Previous[n] != p {
			out = append(out, "Previous["+n+"] is not what was applied")
		}
	}
	if !strings.Contains(got.Refused, want.Refused) || (want.Refused == "") != (got.Refused == "") {
		out = append(out, fmt.Sprintf("Refused = %q, want %q", got.Refused, want.Refused))
	}
	if got.Idle != want.Idle {
		out = append(out, fmt.Sprintf("Idle = %v", got.Idle))
	}
	return strings.Join(out, "; ")
}

// TestMeasure: a node reports converged only when the kernel was last
// confirmed to match the spec as stored now.
func TestMeasure(t *testing.T) {
	f3 := fleetOf(t, 3, "")
	changed := fleetOf(t, 3, "    routes:\n      - to: default\n        via: 10.0.{i}.254\n")
	all := []string{"r-1", "r-2", "r-3"}
	for _, tc := range []struct {
		name       string
		obs        Observation
		teardownOK bool
		ready      int
		converged  bool
	}{
		{"all applied", Observation{Fleet: f3, Assigned: all, Applied: appliedAll(f3, all...)}, true, 3, true},
		{"applied at the old spec only", Observation{Fleet: changed, Assigned: all, Applied: appliedAll(f3, all...)}, true, 0, false},
		{"one failed", Observation{Fleet: f3, Assigned: all, Applied: appliedAll(f3, "r-1", "r-2")}, true, 2, false},
		{"teardown failed", Observation{Fleet: f3, Assigned: all, Applied: appliedAll(f3, all...)}, false, 3, false},
		{"assignment unreadable", Observation{Fleet: f3, Assigned: all, AssignErr: errors.New("x"), Applied: appliedAll(f3, all...)}, true, 3, false},
		{"spec unreadable", Observation{Fleet: f3, SpecErr: errors.New("x"), Assigned: all, Applied: appliedAll(f3, all...)}, true, 3, false},
		{"nothing assigned", Observation{Fleet: f3}, true, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(OnChange, tc.obs)
			p := Measure(tc.obs, d, tc.teardownOK)
			if p.Ready != tc.ready || p.Converged != tc.converged {
				t.Errorf("ready %d converged %v, want %d %v", p.Ready, p.Converged, tc.ready, tc.converged)
			}
		})
	}
}

// TestDecideLargeUnchanged: deciding over a large unchanged assignment
// compares specs without touching the kernel (no Up).
func TestDecideLargeUnchanged(t *testing.T) {
	f := fleetOf(t, 5000, "    routes:\n      - to: default\n        via: 10.0.{i%250}.254\n")
	names := f.Names()
	d := Decide(OnChange, Observation{Fleet: f, Assigned: names, Pins: names, Applied: appliedAll(f, names...)})
	if len(d.Up) != 0 || len(d.Want) != 5000 {
		t.Fatalf("up %d want %d", len(d.Up), len(d.Want))
	}
}
