package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nsfleet/nsfleet/bench"
)

func twoEngines() *bench.Run {
	r := &bench.Run{ID: "20261204-000000-aaaaaaaa", Scenario: "fake-router", Keys: []string{"engine", "variant"}, Params: map[string]string{"n": "200"}}
	base := map[string]float64{"native": 1000, "netlink": 500, "iproute2": 100}
	for _, eng := range []string{"native", "netlink", "iproute2"} {
		for _, v := range []string{"add", "add+2exec+2link"} {
			for rep := 0; rep < 3; rep++ {
				for _, mark := range []int{100, 200} {
					r.Samples = append(r.Samples, bench.Sample{Config: map[string]string{"engine": eng, "variant": v}, Mark: mark, Metric: "rate", Unit: "routers/s", Better: "higher", Rep: rep, Value: base[eng] + float64(rep*7+mark/100)})
					r.Samples = append(r.Samples, bench.Sample{Config: map[string]string{"engine": eng, "variant": v}, Mark: mark, Metric: "step veth", Unit: "us", Better: "lower", Rep: rep, Value: 10})
				}
			}
			r.Samples = append(r.Samples, bench.Sample{Config: map[string]string{"engine": eng, "variant": v}, Metric: "down (until freed)", Unit: "s", Better: "lower", Rep: 0, Value: 1000 / base[eng]})
		}
	}
	return r
}

func TestFindings(t *testing.T) {
	fs := Findings([]*bench.Run{twoEngines()})
	// rate and down, per variant; no per-step metric.
	if len(fs) != 4 {
		t.Fatalf("%d findings: %+v", len(fs), fs)
	}
	f := fs[0]
	if f.Metric != "rate" || f.Panel != "variant=add" || f.Marks != "100-200" || f.Key != "engine" || f.Best != "native" || f.RunnerUp != "netlink" || f.Worst != "iproute2" {
		t.Errorf("rate finding: %+v", f)
	}
	if f.Factor < 1.9 || f.Factor > 2.1 || f.WorstFactor < 9 || f.WorstFactor > 10.5 || !strings.HasPrefix(f.Verdict, "better by") {
		t.Errorf("rate factors and verdict: %+v", f)
	}
	// Lower is better: the fastest down is native's, 2x netlink's; one
	// repetition only, which the verdict says.
	d := fs[2]
	if d.Metric != "down (until freed)" || d.Best != "native" || d.Factor < 1.99 || d.Factor > 2.01 || d.Marks != "" || !strings.Contains(d.Verdict, "too few runs") {
		t.Errorf("down finding: %+v", d)
	}
}

func TestReportSummaryFirstAndRealTables(t *testing.T) {
	var b bytes.Buffer
	if err := WriteReport(&b, []*bench.Run{twoEngines()}); err != nil {
		t.Fatal(err)
	}
	h := b.String()
	sum, tab, svg := strings.Index(h, "<h2>Summary</h2>"), strings.Index(h, "<caption>rate (routers/s"), strings.Index(h, "<svg")
	if sum < 0 || tab < 0 || svg < 0 || !(sum < tab && tab < svg) {
		t.Errorf("want summary, then tables, then plots: at %d, %d, %d", sum, tab, svg)
	}
	if strings.Contains(h, "<pre>") {
		t.Error("a table is still preformatted text")
	}
	// 6 configurations, 2 marks: configurations as rows, so the table
	// grows down the page.
	if !strings.Contains(h, `<th>configuration</th><th class="n">mark 100 (routers/s)</th>`) {
		t.Error("rate table is not transposed")
	}
}

// Kernels are compared only with kernels run the same way.
func TestFindingsKernelsByAccelerator(t *testing.T) {
	r := &bench.Run{Scenario: "fake-router", Keys: []string{"kernel", "engine", "variant"}}
	for kernel, rate := range map[string]float64{"6.18.0 native": 1500, "6.1.0-57-amd64 tcg": 110, "6.1.0-57-rt-amd64 tcg": 80} {
		for rep := 0; rep < 3; rep++ {
			r.Samples = append(r.Samples, bench.Sample{Config: map[string]string{"kernel": kernel, "engine": "native", "variant": "add"}, Mark: 100, Metric: "rate", Unit: "routers/s", Better: "higher", Rep: rep, Value: rate + float64(rep)})
		}
	}
	fs := Findings([]*bench.Run{r})
	if len(fs) != 1 || fs[0].Panel != "engine=native/variant=add (tcg kernels)" || fs[0].Best != "6.1.0-57-amd64 tcg" || fs[0].Worst != "6.1.0-57-rt-amd64 tcg" {
		t.Errorf("findings %+v", fs)
	}
}
