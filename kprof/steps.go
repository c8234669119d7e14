package kprof

import (
	"sort"
	"strings"
)

// Step names a part of the work by the functions its stacks pass
// through, kernel or this process's own: a sample whose stack holds a
// frame named as one of Frames, or starting with one of them followed by
// a dot (the kernel's "name.isra.0", a Go package's functions), is the
// step's.
type Step struct {
	Name   string
	Frames []string
}

// FleetSteps are the steps of making and removing a fleet as nsfleet does
// them (package fleet, netns, rtnl, sysctl), named by nsfleet's own
// functions so that the kernel's work and its lock waits are counted to
// the step that caused them, and by the kernel's for work no thread of
// nsfleet asks for (freeing namespaces).
var FleetSteps = []Step{
	{"unshare", []string{"ksys_unshare"}},
	{"lo", []string{"github.com/nsfleet/nsfleet/rtnl.(*Conn).SetLoopback"}},
	{"veth", []string{"github.com/nsfleet/nsfleet/fleet.(*worker).addVeth"}},
	{"sysctl", []string{"github.com/nsfleet/nsfleet/sysctl"}},
	{"pin", []string{"github.com/nsfleet/nsfleet/netns.(*RunDir).Pin"}},
	{"teardown", []string{"cleanup_net", "github.com/nsfleet/nsfleet/fleet.Down"}},
}

// stepOf returns the index of the first step a stack's frames belong to,
// or -1.
func stepOf(frames []string, steps []Step) int {
	best := -1
	for _, f := range frames {
		for i, st := range steps {
			if best >= 0 && i >= best {
				break
			}
			for _, want := range st.Frames {
				if f == want || strings.HasPrefix(f, want) && strings.HasPrefix(f[len(want):], ".") {
					best = i
					break
				}
			}
		}
	}
	return best
}

// StepShare is one step's part of two ranges: its share of all samples in
// each, and its kernel functions (self) whose share of all samples grows
// most between them.
type StepShare struct {
	Step        string
	First, Last float64
	Growing     []Share
}

// StepGrowth classifies the on-CPU kernel samples of ranges a and b by
// step (self is this process, whose own frames count) and returns each
// step's share, with its n most growing kernel functions.
func (r *Result) StepGrowth(a, b int, steps []Step, self, n int) []StepShare {
	per := make([]map[int]map[string]int, len(steps)) // step -> range -> leaf -> count
	stepTotal := make([]map[int]int, len(steps))
	for i := range steps {
		per[i], stepTotal[i] = map[int]map[string]int{}, map[int]int{}
	}
	totals := map[int]int{}
	for i := range r.Samples {
		s := &r.Samples[i]
		if !s.kernelOnCPU() {
			continue
		}
		k := r.rangeOf(s.Time)
		if k != a && k != b {
			continue
		}
		totals[k]++
		step := stepOf(r.frames(s, self), steps)
		if step < 0 {
			continue
		}
		if per[step][k] == nil {
			per[step][k] = map[string]int{}
		}
		per[step][k][r.syms.lookup(s.Stack[0])]++
		stepTotal[step][k]++
	}
	if totals[a] == 0 || totals[b] == 0 {
		return nil
	}
	var out []StepShare
	for i, st := range steps {
		if stepTotal[i][a]+stepTotal[i][b] == 0 {
			continue
		}
		ss := StepShare{Step: st.Name, First: float64(stepTotal[i][a]) / float64(totals[a]), Last: float64(stepTotal[i][b]) / float64(totals[b])}
		if per[i][a] == nil {
			per[i][a] = map[string]int{}
		}
		if per[i][b] == nil {
			per[i][b] = map[string]int{}
		}
		ss.Growing = growth(per[i], totals, a, b, n)
		out = append(out, ss)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Last-out[i].First > out[j].Last-out[j].First })
	return out
}
