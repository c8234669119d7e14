package kprof

import (
	"fmt"
	"html"
	"io"
	"math"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/pprof/profile"
)

// frames names s's stack, leaf first: kernel functions from kallsyms,
// this process's functions from its own symbol table, and any other
// process as one frame "[comm]".
func (r *Result) frames(s *Sample, self int) []string {
	out := make([]string, 0, len(s.Stack)+1)
	for i, ip := range s.Stack {
		if i < s.NKern {
			out = append(out, r.syms.lookup(ip))
			continue
		}
		if s.PID != self {
			break
		}
		if f := runtime.FuncForPC(uintptr(ip)); f != nil {
			out = append(out, f.Name())
		}
	}
	comm := r.comms[s.PID]
	if s.PID != self || len(out) == s.NKern {
		out = append(out, "["+comm+"]")
	}
	return out
}

// rangeOf returns the index of the range a time falls in.
func (r *Result) rangeOf(t time.Duration) int {
	i := sort.Search(len(r.Ranges), func(i int) bool { return r.Ranges[i].Start > t }) - 1
	return max(i, 0)
}

// WritePprof writes a gzipped pprof profile: sample types "samples"
// (count), "cpu" and "off-cpu" (nanoseconds); labels "range" (the mark),
// "comm" and "kind" (on-cpu or off-cpu).
func (r *Result) WritePprof(w io.Writer, self int) error {
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}, {Type: "off-cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:     int64(time.Second) / int64(max(r.Frequency, 1)),
		Comments:   r.Notes,
	}
	if len(r.Ranges) > 0 {
		p.TimeNanos = time.Now().Add(-(r.End - r.Ranges[0].Start)).UnixNano()
		p.DurationNanos = int64(r.End - r.Ranges[0].Start)
	}
	funcs := map[string]*profile.Function{}
	locs := map[string]*profile.Location{}
	loc := func(name string) *profile.Location {
		if l, ok := locs[name]; ok {
			return l
		}
		f := &profile.Function{ID: uint64(len(funcs) + 1), Name: name, SystemName: name}
		funcs[name] = f
		p.Function = append(p.Function, f)
		l := &profile.Location{ID: uint64(len(locs) + 1), Line: []profile.Line{{Function: f}}}
		locs[name] = l
		p.Location = append(p.Location, l)
		return l
	}
	for i := range r.Samples {
		s := &r.Samples[i]
		ps := &profile.Sample{Label: map[string][]string{
			"range": {r.Ranges[r.rangeOf(s.Time)].Label},
			"comm":  {r.comms[s.PID]},
		}}
		for _, name := range r.frames(s, self) {
			ps.Location = append(ps.Location, loc(name))
		}
		if s.OffCPU > 0 {
			ps.Value = []int64{0, 0, int64(s.OffCPU)}
			ps.Label["kind"] = []string{"off-cpu"}
		} else {
			ps.Value = []int64{1, p.Period, 0}
			ps.Label["kind"] = []string{"on-cpu"}
		}
		p.Sample = append(p.Sample, ps)
	}
	if err := p.CheckValid(); err != nil {
		return err
	}
	return p.Write(w)
}

// Share is one kernel function's share of the on-CPU samples in the first
// and the last range.
type Share struct {
	Function    string
	First, Last float64 // fractions of all samples in that range
}

// Growth lists the kernel functions (self time: the leaf of on-CPU
// samples) whose share of the samples grows most from the first range
// with samples to the last, at most n.
func (r *Result) Growth(n int) []Share {
	counts, totals := r.leafCounts()
	var ks []int
	for k := range totals {
		ks = append(ks, k)
	}
	if len(ks) == 0 {
		return nil
	}
	sort.Ints(ks)
	return growth(counts, totals, ks[0], ks[len(ks)-1], n)
}

// GrowthBetween is Growth from range a to range b.
func (r *Result) GrowthBetween(a, b, n int) []Share {
	counts, totals := r.leafCounts()
	if totals[a] == 0 || totals[b] == 0 {
		return nil
	}
	return growth(counts, totals, a, b, n)
}

// kernelOnCPU reports whether s is an on-CPU sample with kernel frames,
// not of the idle task: what the kernel-function tables count.
func (s *Sample) kernelOnCPU() bool {
	return s.OffCPU == 0 && s.NKern > 0 && !(s.PID == 0 && s.TID == 0)
}

// leafCounts counts on-CPU samples with a kernel leaf, per range and
// function, leaving out the idle task.
func (r *Result) leafCounts() (map[int]map[string]int, map[int]int) {
	per := map[int]map[string]int{}
	totals := map[int]int{}
	for i := range r.Samples {
		s := &r.Samples[i]
		if !s.kernelOnCPU() {
			continue
		}
		k := r.rangeOf(s.Time)
		if per[k] == nil {
			per[k] = map[string]int{}
		}
		per[k][r.syms.lookup(s.Stack[0])]++
		totals[k]++
	}
	return per, totals
}

func growth(per map[int]map[string]int, totals map[int]int, first, last, n int) []Share {
	var out []Share
	names := map[string]bool{}
	for f := range per[first] {
		names[f] = true
	}
	for f := range per[last] {
		names[f] = true
	}
	for f := range names {
		out = append(out, Share{Function: f,
			First: float64(per[first][f]) / float64(totals[first]),
			Last:  float64(per[last][f]) / float64(totals[last])})
	}
	sort.Slice(out, func(i, j int) bool {
		gi, gj := out[i].Last-out[i].First, out[j].Last-out[j].First
		if gi != gj {
			return gi > gj
		}
		return out[i].Function < out[j].Function
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// Top lists the kernel functions with the most self samples in range k
// (-1: all), at most n, with their fraction.
func (r *Result) Top(k, n int) []Share {
	counts := map[string]int{}
	total := 0
	for i := range r.Samples {
		s := &r.Samples[i]
		if s.OffCPU > 0 || (k >= 0 && r.rangeOf(s.Time) != k) {
			continue
		}
		total++
		if s.NKern > 0 && !(s.PID == 0 && s.TID == 0) {
			counts[r.syms.lookup(s.Stack[0])]++
		}
	}
	var out []Share
	for f, c := range counts {
		out = append(out, Share{Function: f, Last: float64(c) / float64(total)})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Last != out[j].Last {
			return out[i].Last > out[j].Last
		}
		return out[i].Function < out[j].Function
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// node is one frame of a flame graph.
type node struct {
	name     string
	value    float64
	children map[string]*node
}

func (n *node) child(name string) *node {
	if n.children == nil {
		n.children = map[string]*node{}
	}
	c, ok := n.children[name]
	if !ok {
		c = &node{name: name}
		n.children[name] = c
	}
	return c
}

// WriteFlame writes a flame graph (SVG) of range k (-1: all). On-CPU
// samples count one sample period each, off-CPU intervals their length,
// so both are in time; off-CPU stacks sit under an "off-cpu" root.
func (r *Result) WriteFlame(w io.Writer, k int, title string, self int) error {
	root := &node{name: "all"}
	period := float64(time.Second) / float64(max(r.Frequency, 1))
	for i := range r.Samples {
		s := &r.Samples[i]
		if k >= 0 && r.rangeOf(s.Time) != k {
			continue
		}
		if s.PID == 0 && s.TID == 0 && s.OffCPU == 0 {
			continue // idle
		}
		v := period
		n := root
		if s.OffCPU > 0 {
			v = float64(s.OffCPU)
			n = n.child("off-cpu")
		} else {
			n = n.child("on-cpu")
		}
		fr := r.frames(s, self)
		n.value += v
		for j := len(fr) - 1; j >= 0; j-- {
			n = n.child(fr[j])
			n.value += v
		}
		root.value += v
	}
	const width, rowH = 1200.0, 16.0
	depth := 0
	var measure func(n *node, d int)
	measure = func(n *node, d int) {
		depth = max(depth, d)
		for _, c := range n.children {
			measure(c, d+1)
		}
	}
	measure(root, 0)
	height := float64(depth+1)*rowH + 40
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="monospace" font-size="11">`+"\n", width, height)
	fmt.Fprintf(w, `<text x="6" y="16" font-size="13">%s (%.3f s of samples)</text>`+"\n", html.EscapeString(title), root.value/1e9)
	if root.value == 0 {
		fmt.Fprintln(w, `<text x="6" y="36">no samples in this range</text></svg>`)
		return nil
	}
	var draw func(n *node, x float64, d int)
	draw = func(n *node, x float64, d int) {
		wd := n.value / root.value * width
		if wd < 0.3 {
			return
		}
		y := height - float64(d+1)*rowH
		fmt.Fprintf(w, `<g><title>%s: %.2f%% (%.1f ms)</title><rect x="%.1f" y="%.1f" width="%.1f" height="%.0f" fill="%s" stroke="white" stroke-width="0.5"/>`,
			html.EscapeString(n.name), 100*n.value/root.value, n.value/1e6, x, y, wd, rowH-1, colour(n.name))
		if wd > 40 {
			label := n.name
			if max := int(wd / 6.6); len(label) > max {
				label = label[:max-2] + ".."
			}
			fmt.Fprintf(w, `<text x="%.1f" y="%.1f">%s</text>`, x+2, y+rowH-4, html.EscapeString(label))
		}
		fmt.Fprintln(w, `</g>`)
		names := make([]string, 0, len(n.children))
		for c := range n.children {
			names = append(names, c)
		}
		sort.Strings(names)
		for _, c := range names {
			draw(n.children[c], x, d+1)
			x += n.children[c].value / root.value * width
		}
	}
	draw(root, 0, 0)
	_, err := fmt.Fprintln(w, "</svg>")
	return err
}

// colour: Go functions blue, other processes green, the kernel warm, with
// a hue from the name so neighbours differ.
func colour(name string) string {
	h := 0.0
	for _, c := range name {
		h = math.Mod(h*31+float64(c), 1000)
	}
	j := int(h) % 40
	switch {
	case strings.HasPrefix(name, "["):
		return fmt.Sprintf("rgb(%d,%d,%d)", 120+j, 190+j/2, 120)
	case isGo(name):
		return fmt.Sprintf("rgb(%d,%d,%d)", 110+j, 160+j, 230)
	default:
		return fmt.Sprintf("rgb(%d,%d,%d)", 230, 120+2*j, 60+j)
	}
}

// isGo tells a Go function name (package path, then a dot) from a kernel
// one (which may carry a compiler suffix such as ".isra.0").
func isGo(name string) bool {
	if strings.Contains(name, "/") {
		return true
	}
	i := strings.IndexByte(name, '.')
	if i <= 0 {
		return false
	}
	for _, suffix := range []string{".isra", ".constprop", ".part", ".cold", ".llvm"} {
		if strings.Contains(name, suffix) {
			return false
		}
	}
	return true
}
