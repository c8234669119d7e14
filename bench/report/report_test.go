package report

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/nsfleet/nsfleet/bench"
	"github.com/nsfleet/nsfleet/bench/benchtest"
	"golang.org/x/perf/benchfmt"
)

func TestBenchfmtReadsBack(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteBenchfmt(&buf, benchtest.Synthetic("a", []float64{1000, 1010}, []float64{20, 21})); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "Unit routers/s better=higher") || !strings.Contains(buf.String(), "\nBenchmarkFakeRouter/engine=native/variant=add/mark=250 1 ") {
		t.Fatalf("no unit line:\n%s", buf.String())
	}
	rd := benchfmt.NewReader(&buf, "out.txt")
	n := 0
	for rd.Scan() {
		res, ok := rd.Result().(*benchfmt.Result)
		if !ok {
			continue
		}
		n++
		name := res.Name.String()
		if !strings.HasPrefix(name, "FakeRouter/engine=") || !strings.Contains(name, "/variant=add/mark=") {
			t.Errorf("name %q", name)
		}
		if v, ok := res.Value("routers/s"); !ok || v <= 0 {
			t.Errorf("%s: value %v %v", name, v, ok)
		}
	}
	if err := rd.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 8 {
		t.Fatalf("%d results, want 8", n)
	}
}

func TestTableLayout(t *testing.T) {
	var buf bytes.Buffer
	WriteTable(&buf, benchtest.Synthetic("a", []float64{1000, 1010}, []float64{20, 22}))
	out := buf.String()
	for _, want := range []string{"rate (routers/s, higher is better)", "engine=native/variant=add", "engine=iproute2/variant=add", "1005 ± 7.07 (n=2)", "21.0 ± 1.41 (n=2)", "  250", "  500"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestCompareVerdicts(t *testing.T) {
	a := benchtest.Synthetic("a", []float64{1000, 1010, 990, 1005, 995}, []float64{20, 21, 19, 20, 20})
	b := benchtest.Synthetic("b", []float64{1200, 1210, 1190, 1205, 1195}, []float64{20, 19, 21, 20, 20})
	cs := Compare(a, b)
	if len(cs) != 4 {
		t.Fatalf("%d comparisons", len(cs))
	}
	for _, c := range cs {
		switch {
		case strings.Contains(c.Config, "native"):
			if !strings.HasPrefix(c.Verdict, "better by 20.0%") || c.PU >= Alpha || c.DiffLo <= 0 {
				t.Errorf("native: %+v", c)
			}
		default:
			if !strings.HasPrefix(c.Verdict, "no significant difference") {
				t.Errorf("iproute2: %+v", c)
			}
		}
	}
	few := Compare(benchtest.Synthetic("a", []float64{1}, []float64{1}), benchtest.Synthetic("b", []float64{2}, []float64{2}))
	if !strings.HasPrefix(few[0].Verdict, "too few runs") {
		t.Errorf("one run each: %q", few[0].Verdict)
	}
}

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{10, 12, 14})
	if s.Mean != 12 || s.SD != 2 || math.Abs(s.Hi-16.968) > 0.01 {
		t.Fatalf("%+v", s)
	}
}

func TestPlotAndReport(t *testing.T) {
	r := benchtest.Synthetic("20261129-000000-abcd", []float64{1000, 1010}, []float64{20, 21})
	var svg bytes.Buffer
	if err := Plot(&svg, []*bench.Run{r}, "rate", "svg"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "variant=add", "engine=native", "engine=iproute2", "log scale"} {
		// 1000/s against 20/s: a span of 50x, so the rate axis is logarithmic.
		if !strings.Contains(svg.String(), want) {
			t.Errorf("svg lacks %q", want)
		}
	}
	var png bytes.Buffer
	if err := Plot(&png, []*bench.Run{r}, "rate", "png"); err != nil || !bytes.HasPrefix(png.Bytes(), []byte("\x89PNG")) {
		t.Fatalf("png: %v", err)
	}
	var html bytes.Buffer
	if err := WriteReport(&html, []*bench.Run{r}); err != nil || !strings.Contains(html.String(), "<svg") {
		t.Fatalf("report: %v", err)
	}
}

// TestPlotSmallMultiples: four engines by five variants give five panels
// of four lines on the same axes, never two lines of one style in a
// panel, and too many lines for distinct styles is refused.
func TestPlotSmallMultiples(t *testing.T) {
	many := func(engines, variants int) *bench.Run {
		r := &bench.Run{ID: "20261130-000000-abcd", Scenario: "fake-router", Keys: []string{"engine", "variant"}}
		for e := 0; e < engines; e++ {
			for v := 0; v < variants; v++ {
				for _, m := range []int{250, 500} {
					r.Samples = append(r.Samples, bench.Sample{Config: map[string]string{"engine": fmt.Sprint("e", e), "variant": fmt.Sprint("v", v)},
						Mark: m, Metric: "rate", Unit: "routers/s", Value: float64(10 + e + v)})
				}
			}
		}
		return r
	}
	var svg bytes.Buffer
	if err := Plot(&svg, []*bench.Run{many(4, 5)}, "rate", "svg"); err != nil {
		t.Fatal(err)
	}
	out := svg.String()
	for v := 0; v < 5; v++ {
		if !strings.Contains(out, fmt.Sprint("variant=v", v)) {
			t.Errorf("no panel for variant=v%d", v)
		}
	}
	if strings.Contains(out, "log scale") {
		t.Error("10 to 18 routers/s is not a 10x span: the axis must stay linear")
	}
	if err := Plot(&svg, []*bench.Run{many(41, 1)}, "rate", "svg"); err == nil || !strings.Contains(err.Error(), "distinct colour and dash pairs") {
		t.Errorf("41 lines in one panel: %v", err)
	}
}

func FuzzParseRun(f *testing.F) {
	var buf bytes.Buffer
	WriteJSON(&buf, benchtest.Synthetic("x", []float64{1}, []float64{2}))
	f.Add(buf.Bytes())
	f.Add([]byte(`{"scenario":"x","samples":[{}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := bench.ParseRun(b)
		if err != nil {
			return
		}
		WriteTable(io.Discard, r)
		WriteCSV(io.Discard, r)
		WriteBenchfmt(io.Discard, r)
	})
}
