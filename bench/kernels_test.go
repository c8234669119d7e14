package bench

import (
	"strings"
	"testing"
)

func TestMergeKernels(t *testing.T) {
	mk := func(rate float64, params map[string]string) *Run {
		r := &Run{Scenario: "fake-router", Keys: []string{"engine", "variant"}, Params: params, Notes: []string{"a note"}, Skipped: []string{"engine=pyroute2: not installed"}}
		for rep := 0; rep < 2; rep++ {
			r.Samples = append(r.Samples, Sample{Config: map[string]string{"engine": "native", "variant": "add"}, Mark: 100, Metric: "rate", Better: "higher", Rep: rep, Value: rate})
		}
		return r
	}
	m := MergeKernels([]KernelRun{
		{Release: "6.18.0", Accel: "native", Run: mk(1000, map[string]string{"n": "200"})},
		{Release: "6.18.0", Accel: "tcg", Run: mk(100, map[string]string{"n": "200", "kernel": "6.18.0", "accel": "tcg", "vm": "2 CPUs, 4G"})},
		{Release: "6.1.0-28-cloud-amd64", Accel: "tcg", Run: mk(80, map[string]string{"n": "200", "kernel": "6.1.0-28-cloud-amd64", "accel": "tcg"})},
	}, Env{Kernel: "6.18.0 #1"})
	if m.Keys[0] != "kernel" || len(m.Samples) != 6 {
		t.Fatalf("keys %v, %d samples", m.Keys, len(m.Samples))
	}
	cols := map[string]bool{}
	for _, x := range m.Samples {
		cols[ConfigKey(x.Config, m.Keys)] = true
	}
	for _, want := range []string{"kernel=6.18.0 native/engine=native/variant=add", "kernel=6.18.0 tcg/engine=native/variant=add", "kernel=6.1.0-28-cloud-amd64 tcg/engine=native/variant=add"} {
		if !cols[want] {
			t.Errorf("no column %s in %v", want, cols)
		}
	}
	if m.Params["n"] != "200" || m.Params["kernel"] != "" || m.Params["accel"] != "native+tcg" || !strings.Contains(m.Params["kernel 6.18.0 tcg"], "vm=2 CPUs, 4G") {
		t.Errorf("params %v", m.Params)
	}
	if len(m.Skipped) != 3 || !strings.HasPrefix(m.Skipped[1], "kernel=6.18.0 tcg/") {
		t.Errorf("skipped %v", m.Skipped)
	}
	var overhead []string
	for _, n := range m.Notes {
		if strings.HasPrefix(n, "VM overhead") {
			overhead = append(overhead, n)
		}
	}
	// Only the release that ran both ways has an overhead, of 100/1000.
	if len(overhead) != 1 || !strings.Contains(overhead[0], "6.18.0 under tcg gives 0.10x its native rate") {
		t.Errorf("overhead notes: %q", overhead)
	}
}
