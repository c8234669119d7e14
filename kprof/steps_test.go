package kprof

import (
	"math"
	"testing"
	"time"
)

// Samples are put in the step their kernel stack passes through (the
// first step listed wins), and each step's share and growing functions
// are of all samples of the range.
func TestStepGrowth(t *testing.T) {
	syms := &symbols{addr: []uint64{100, 200, 300, 400, 500, 600}, name: []string{"_raw_spin_lock", "ksys_unshare.isra.0", "cleanup_net", "dev_change_flags", "idr_for_each", "schedule"}}
	r := &Result{syms: syms, Ranges: []Range{{Label: "start"}, {Label: "1000", Start: 10 * time.Second}, {Label: "2000", Start: 20 * time.Second}}}
	add := func(at time.Duration, n int, stack ...uint64) {
		for i := 0; i < n; i++ {
			r.Samples = append(r.Samples, Sample{Time: at, PID: 1, TID: 1, Stack: stack, NKern: len(stack)})
		}
	}
	// Range 1: 10 unshare (spin lock), 10 teardown (idr), 20 other.
	add(11*time.Second, 10, 100, 200)
	add(11*time.Second, 10, 500, 400, 300) // unshare is listed first, but this stack is only teardown's
	add(11*time.Second, 20, 600)
	// Range 2: 30 unshare, 10 teardown, 0 other.
	add(21*time.Second, 30, 100, 200)
	add(21*time.Second, 10, 500, 300)
	got := r.StepGrowth(1, 2, FleetSteps, -1, 3)
	if len(got) != 2 || got[0].Step != "unshare" || got[1].Step != "teardown" {
		t.Fatalf("steps %+v", got)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if !near(got[0].First, 0.25) || !near(got[0].Last, 0.75) || got[0].Growing[0].Function != "_raw_spin_lock" {
		t.Errorf("unshare %+v", got[0])
	}
	if !near(got[1].First, 0.25) || !near(got[1].Last, 0.25) || got[1].Growing[0].Function != "idr_for_each" {
		t.Errorf("teardown %+v", got[1])
	}
	if r.StepGrowth(0, 2, FleetSteps, -1, 3) != nil {
		t.Error("a range without samples gives shares")
	}
}

func TestStepOf(t *testing.T) {
	steps := FleetSteps
	for _, c := range []struct {
		frames []string
		want   string
	}{
		{[]string{"_raw_spin_lock", "ksys_unshare.isra.0", "do_syscall_64"}, "unshare"},
		{[]string{"mutex_spin_on_owner", "rtnl_lock", "github.com/nsfleet/nsfleet/rtnl.(*sock).run", "github.com/nsfleet/nsfleet/fleet.(*worker).addVeth"}, "veth"},
		{[]string{"proc_sys_call_handler", "github.com/nsfleet/nsfleet/sysctl.(*Procfs).Write"}, "sysctl"},
		{[]string{"ksys_unshare_not"}, ""},
		{[]string{"github.com/nsfleet/nsfleet/sysctlx.Foo"}, ""},
	} {
		got := ""
		if i := stepOf(c.frames, steps); i >= 0 {
			got = steps[i].Name
		}
		if got != c.want {
			t.Errorf("%v: %q, want %q", c.frames, got, c.want)
		}
	}
}
