package report

import (
	"fmt"
	"sort"
	"strings"

	"github.com/nsfleet/nsfleet/bench"
)

// Finding is one line of a report's summary: within one panel (the
// configuration after its first key: a variant, or engine and variant
// when kernels are compared), which of the first key's values (the
// engines, or the kernels) is best on a metric over a range of marks, by
// how much over the runner-up and the worst, and whether the statistics
// back it.
type Finding struct {
	Scenario, Metric, Unit, Better string
	Panel                          string // "variant=add"; "" when there is none
	Marks                          string // "250-1000", or "" for a metric without marks
	Key                            string // the first key: "engine", or "kernel"
	Best, RunnerUp, Worst          string // its values ("native")
	Factor                         float64
	WorstFactor                    float64 // how many times better Best is than Worst
	Verdict                        string  // Best against RunnerUp, over the repetitions
}

// Findings summarizes the runs: a Finding per metric (not the per-step times) and
// panel where at least two configurations compete.
func Findings(runs []*bench.Run) []Finding {
	var out []Finding
	for _, r := range runs {
		out = append(out, findings(r)...)
	}
	return out
}

func findings(r *bench.Run) []Finding {
	type key struct{ metric, config string }
	perRep := map[key]map[int][]float64{}
	marks := map[string][2]int{}
	var metrics []string
	units, better := map[string]string{}, map[string]string{}
	var configs = map[string][]string{}
	for _, x := range r.Samples {
		if strings.HasPrefix(x.Metric, "step ") || x.Better == "" {
			continue
		}
		if _, ok := units[x.Metric]; !ok {
			metrics = append(metrics, x.Metric)
			units[x.Metric], better[x.Metric] = x.Unit, x.Better
			marks[x.Metric] = [2]int{x.Mark, x.Mark}
		}
		mr := marks[x.Metric]
		marks[x.Metric] = [2]int{min(mr[0], x.Mark), max(mr[1], x.Mark)}
		k := key{x.Metric, bench.ConfigKey(x.Config, r.Keys)}
		if perRep[k] == nil {
			perRep[k] = map[int][]float64{}
			configs[x.Metric] = append(configs[x.Metric], k.config)
		}
		perRep[k][x.Rep] = append(perRep[k][x.Rep], x.Value)
	}
	var out []Finding
	for _, m := range metrics {
		panels := map[string][]string{}
		var order []string
		for _, c := range configs[m] {
			panel, _ := splitConfig(c, r.Keys)
			if r.Keys[0] == "kernel" {
				// Kernels run natively and emulated are not compared:
				// the accelerator would win, not the kernel.
				label := firstValue(c)
				panel += " (" + label[strings.LastIndexByte(label, ' ')+1:] + " kernels)"
			}
			if _, ok := panels[panel]; !ok {
				order = append(order, panel)
			}
			panels[panel] = append(panels[panel], c)
		}
		for _, panel := range order {
			cs := panels[panel]
			if len(cs) < 2 {
				continue
			}
			// Each configuration's value per repetition: the mean over the
			// marks, so that a repetition is one observation.
			reps, mean := map[string][]float64{}, map[string]float64{}
			for _, c := range cs {
				var keys []int
				for rep := range perRep[key{m, c}] {
					keys = append(keys, rep)
				}
				sort.Ints(keys)
				for _, rep := range keys {
					reps[c] = append(reps[c], Summarize(perRep[key{m, c}][rep]).Mean)
				}
				mean[c] = Summarize(reps[c]).Mean
			}
			sort.SliceStable(cs, func(i, j int) bool {
				if better[m] == "lower" {
					return mean[cs[i]] < mean[cs[j]]
				}
				return mean[cs[i]] > mean[cs[j]]
			})
			best, second, worst := cs[0], cs[1], cs[len(cs)-1]
			f := Finding{Scenario: r.Scenario, Metric: m, Unit: units[m], Better: better[m], Panel: panel,
				Key: r.Keys[0], Best: firstValue(best), RunnerUp: firstValue(second), Worst: firstValue(worst)}
			if mr := marks[m]; mr[1] > 0 {
				f.Marks = fmt.Sprintf("%d-%d", mr[0], mr[1])
			}
			f.Factor = ratio(mean[best], mean[second], better[m])
			f.WorstFactor = ratio(mean[best], mean[worst], better[m])
			f.Verdict = compareOne(m, "", units[m], better[m], 0, reps[second], reps[best]).Verdict
			out = append(out, f)
		}
	}
	return out
}

// ratio is how many times better a is than b.
func ratio(a, b float64, better string) float64 {
	if better == "lower" {
		a, b = b, a
	}
	if b == 0 {
		return 0
	}
	return a / b
}

// firstValue is the value of a configuration's first key:
// "engine=native/variant=add" gives "native".
func firstValue(config string) string {
	first, _, _ := strings.Cut(config, "/")
	_, v, _ := strings.Cut(first, "=")
	return v
}
