package bench

import (
	"bytes"
	"context"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/internal/nstest"
	"golang.org/x/perf/benchfmt"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ChurnHelperArg {
		ChurnHelperMain(os.Args[2:])
	}
	if len(os.Args) > 2 && os.Args[1] == UeventHelperArg {
		UeventHelperMain(os.Args[2:])
	}
	nstest.Main(m)
}

// synthetic makes a fake-router-like run: two engines, two marks, the
// given values per repetition.
func synthetic(id string, native, other []float64) *Run {
	r := &Run{ID: id, Scenario: "fake-router", Keys: []string{"engine", "variant"}, Params: map[string]string{"n": "500"}, Started: time.Now()}
	for rep := range native {
		for _, mark := range []int{250, 500} {
			r.Samples = append(r.Samples,
				Sample{Config: map[string]string{"engine": "native", "variant": "add"}, Mark: mark, Metric: "rate", Unit: "routers/s", Better: "higher", Rep: rep, Value: native[rep]},
				Sample{Config: map[string]string{"engine": "iproute2", "variant": "add"}, Mark: mark, Metric: "rate", Unit: "routers/s", Better: "higher", Rep: rep, Value: other[rep]})
		}
	}
	return r
}

func TestBenchfmtReadsBack(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteBenchfmt(&buf, synthetic("a", []float64{1000, 1010}, []float64{20, 21})); err != nil {
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
	WriteTable(&buf, synthetic("a", []float64{1000, 1010}, []float64{20, 22}))
	out := buf.String()
	for _, want := range []string{"rate (routers/s, higher is better)", "engine=native/variant=add", "engine=iproute2/variant=add", "1005 ± 7.07 (n=2)", "21.0 ± 1.41 (n=2)", "  250", "  500"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestCompareVerdicts(t *testing.T) {
	a := synthetic("a", []float64{1000, 1010, 990, 1005, 995}, []float64{20, 21, 19, 20, 20})
	b := synthetic("b", []float64{1200, 1210, 1190, 1205, 1195}, []float64{20, 19, 21, 20, 20})
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
	few := Compare(synthetic("a", []float64{1}, []float64{1}), synthetic("b", []float64{2}, []float64{2}))
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

func TestStoreRoundTrip(t *testing.T) {
	st, err := OpenStore(filepath.Join(t.TempDir(), "b.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := synthetic("20261129-000000-abcd", []float64{1000, 1010}, []float64{20, 21})
	r.Env = Env{Kernel: "6.18 #1", CPUs: 2}
	if err := st.Save(r); err != nil {
		t.Fatal(err)
	}
	list, err := st.List()
	if err != nil || len(list) != 1 || list[0].Samples != len(r.Samples) || list[0].Kernel != "6.18" {
		t.Fatalf("list %+v %v", list, err)
	}
	got, err := st.Load("20261129-000000")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Samples) != len(r.Samples) || got.Samples[3].Value != r.Samples[3].Value || got.Samples[3].Config["engine"] != r.Samples[3].Config["engine"] || got.Env.CPUs != 2 {
		t.Fatalf("loaded %+v", got)
	}
	if _, err := st.Load("nope"); err == nil {
		t.Fatal("loaded a run that does not exist")
	}
}

func TestPlotAndReport(t *testing.T) {
	r := synthetic("20261129-000000-abcd", []float64{1000, 1010}, []float64{20, 21})
	var svg bytes.Buffer
	if err := Plot(&svg, []*Run{r}, "rate", "svg"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(svg.String(), "<svg") || !strings.Contains(svg.String(), "engine=native/variant=add") {
		t.Fatal("svg lacks the plot or its direct labels")
	}
	var png bytes.Buffer
	if err := Plot(&png, []*Run{r}, "rate", "png"); err != nil || !bytes.HasPrefix(png.Bytes(), []byte("\x89PNG")) {
		t.Fatalf("png: %v", err)
	}
	var html bytes.Buffer
	if err := WriteReport(&html, []*Run{r}); err != nil || !strings.Contains(html.String(), "<svg") {
		t.Fatalf("report: %v", err)
	}
}

func FuzzParseRun(f *testing.F) {
	var buf bytes.Buffer
	WriteJSON(&buf, synthetic("x", []float64{1}, []float64{2}))
	f.Add(buf.Bytes())
	f.Add([]byte(`{"scenario":"x","samples":[{}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRun(b)
		if err != nil {
			return
		}
		WriteTable(io.Discard, r)
		WriteCSV(io.Discard, r)
		WriteBenchfmt(io.Discard, r)
	})
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
	r, err := Execute(context.Background(), s, Options{N: 40, Mark: 20, Variants: []string{"explicit", "kernel-names", "peer-moved"}})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, x := range r.Samples {
		seen[x.Config["variant"]+" "+x.Metric]++
	}
	for _, want := range []string{"explicit create rate", "kernel-names create rate", "peer-moved create rate", "explicit delete one by one", "explicit delete by namespace exit"} {
		if seen[want] == 0 {
			t.Errorf("no %q sample: %v", want, seen)
		}
	}
}

func TestMountPropagation(t *testing.T) {
	nstest.RequireRoot(t)
	old := IdleMountNamespaces
	IdleMountNamespaces = 3
	defer func() { IdleMountNamespaces = old }()
	s, _ := Lookup("mount-propagation")
	r, err := Execute(context.Background(), s, Options{N: 20, Mark: 10, Prefix: nstest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Skipped) > 0 {
		t.Skip(r.Skipped)
	}
	seen := map[string]int{}
	for _, x := range r.Samples {
		seen[x.Config["layout"]+" "+x.Metric]++
	}
	for _, l := range []string{"shared", "parent-shared", "private"} {
		if seen[l+" add rate"] != 2 || seen[l+" delete rate"] != 1 || seen[l+" new mount namespace"] != 2 {
			t.Errorf("%s: %v", l, seen)
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
	if n != 3 {
		t.Fatalf("%d p50 samples, want 3 (listeners, in a user namespace, none); skipped %v", n, r.Skipped)
	}
	if left := nstest.HostLinks(t, p); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
}
