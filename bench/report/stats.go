// Package report turns benchmark runs into what people and programs read:
// tables with configurations as columns, JSON, CSV, Go benchmark format for
// benchstat, plots, an HTML report, and the statistics behind them
// (confidence intervals, Welch and Mann-Whitney U verdicts).
package report

import (
	"fmt"
	"github.com/nsfleet/nsfleet/bench"
	"math"
	"sort"

	"golang.org/x/perf/benchmath"
	"gonum.org/v1/gonum/stat"
	"gonum.org/v1/gonum/stat/distuv"
)

// Summary describes one sample set.
type Summary struct {
	N        int
	Mean, SD float64
	Lo, Hi   float64 // 95% confidence interval of the mean (Student t)
}

// Summarize computes mean, standard deviation and a 95% confidence interval.
func Summarize(v []float64) Summary {
	s := Summary{N: len(v)}
	if len(v) == 0 {
		return s
	}
	s.Mean = stat.Mean(v, nil)
	s.Lo, s.Hi = s.Mean, s.Mean
	if len(v) > 1 {
		s.SD = stat.StdDev(v, nil)
		t := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(len(v) - 1)}.Quantile(0.975)
		h := t * s.SD / math.Sqrt(float64(len(v)))
		s.Lo, s.Hi = s.Mean-h, s.Mean+h
	}
	return s
}

// Comparison compares one metric of one configuration between two runs.
type Comparison struct {
	Metric, Config, Unit, Better string
	Mark                         int
	A, B                         Summary
	Delta                        float64 // (B-A)/A
	DiffLo, DiffHi               float64 // 95% CI of B-A (Welch)
	PWelch                       float64 // Welch two-sample t-test
	PU                           float64 // Mann-Whitney U test (no normality assumed)
	Verdict                      string
}

// Alpha is the significance level of the verdicts.
const Alpha = 0.05

// Compare matches the samples of a and b by metric, configuration and mark
// and tests each pair.
func Compare(a, b *bench.Run) []Comparison {
	ga, gb := group(a), group(b)
	var out []Comparison
	for _, m := range ga.metrics {
		if _, ok := gb.values[m]; !ok {
			continue
		}
		for _, c := range ga.configs[m] {
			for _, mark := range ga.marks[m] {
				va, vb := ga.values[m][c][mark], gb.values[m][c][mark]
				if len(va) == 0 || len(vb) == 0 {
					continue
				}
				out = append(out, compareOne(m, c, ga.units[m], ga.better[m], mark, va, vb))
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Metric != out[j].Metric {
			return out[i].Metric < out[j].Metric
		}
		if out[i].Config != out[j].Config {
			return out[i].Config < out[j].Config
		}
		return out[i].Mark < out[j].Mark
	})
	return out
}

func compareOne(metric, config, unit, better string, mark int, va, vb []float64) Comparison {
	c := Comparison{Metric: metric, Config: config, Unit: unit, Better: better, Mark: mark, A: Summarize(va), B: Summarize(vb), PWelch: 1, PU: 1}
	if c.A.Mean != 0 {
		c.Delta = (c.B.Mean - c.A.Mean) / c.A.Mean
	}
	diff := c.B.Mean - c.A.Mean
	c.DiffLo, c.DiffHi = diff, diff
	if len(va) >= 2 && len(vb) >= 2 {
		sa := benchmath.NewSample(va, &benchmath.DefaultThresholds)
		sb := benchmath.NewSample(vb, &benchmath.DefaultThresholds)
		c.PWelch = benchmath.AssumeNormal.Compare(sa, sb).P
		c.PU = benchmath.AssumeNothing.Compare(sa, sb).P
		// Welch-Satterthwaite degrees of freedom for the interval.
		qa, qb := c.A.SD*c.A.SD/float64(len(va)), c.B.SD*c.B.SD/float64(len(vb))
		if se := math.Sqrt(qa + qb); se > 0 {
			df := (qa + qb) * (qa + qb) / (qa*qa/float64(len(va)-1) + qb*qb/float64(len(vb)-1))
			t := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: df}.Quantile(0.975)
			c.DiffLo, c.DiffHi = diff-t*se, diff+t*se
		}
	}
	c.Verdict = verdict(c)
	return c
}

func verdict(c Comparison) string {
	if c.A.N < 2 || c.B.N < 2 {
		return "too few runs to tell (use --runs 3 or more)"
	}
	// The U test assumes no normal distribution but cannot reach p < 0.05
	// with fewer than 4 runs a side; below 5 runs Welch's t-test decides.
	p, test := c.PWelch, "Welch"
	if c.A.N >= 5 && c.B.N >= 5 {
		p, test = c.PU, "U test"
	}
	if p >= Alpha {
		return fmt.Sprintf("no significant difference (%s p=%.2f)", test, p)
	}
	up := c.Delta > 0
	word := "worse"
	if (c.Better == "higher") == up {
		word = "better"
	}
	return fmt.Sprintf("%s by %.1f%% (%s p=%.3f)", word, math.Abs(c.Delta)*100, test, p)
}
