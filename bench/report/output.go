package report

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"github.com/nsfleet/nsfleet/bench"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"

	"golang.org/x/perf/benchfmt"
)

// series groups a run's samples: metric -> config -> mark -> values.
type series struct {
	metrics []string // in first-seen order
	units   map[string]string
	better  map[string]string
	configs map[string][]string // metric -> config keys, first-seen order
	marks   map[string][]int    // metric -> sorted marks
	values  map[string]map[string]map[int][]float64
}

func group(r *bench.Run) *series {
	s := &series{units: map[string]string{}, better: map[string]string{}, configs: map[string][]string{}, marks: map[string][]int{},
		values: map[string]map[string]map[int][]float64{}}
	for _, x := range r.Samples {
		if _, ok := s.values[x.Metric]; !ok {
			s.metrics = append(s.metrics, x.Metric)
			s.values[x.Metric] = map[string]map[int][]float64{}
			s.units[x.Metric], s.better[x.Metric] = x.Unit, x.Better
		}
		ck := bench.ConfigKey(x.Config, r.Keys)
		byMark, ok := s.values[x.Metric][ck]
		if !ok {
			byMark = map[int][]float64{}
			s.values[x.Metric][ck] = byMark
			s.configs[x.Metric] = append(s.configs[x.Metric], ck)
		}
		if _, ok := byMark[x.Mark]; !ok {
			seen := false
			for _, m := range s.marks[x.Metric] {
				seen = seen || m == x.Mark
			}
			if !seen {
				s.marks[x.Metric] = append(s.marks[x.Metric], x.Mark)
			}
		}
		byMark[x.Mark] = append(byMark[x.Mark], x.Value)
	}
	for m := range s.marks {
		sort.Ints(s.marks[m])
	}
	return s
}

// WriteTable writes, per metric, a table with marks as rows and
// configurations as columns; each cell is the mean ± standard deviation
// over the repetitions (and n when there are several).
func WriteTable(w io.Writer, r *bench.Run) error {
	s := group(r)
	fmt.Fprintf(w, "%s  run %s  %s\n", r.Scenario, r.ID, paramString(r.Params))
	fmt.Fprintf(w, "kernel %s; %d CPUs (%s); iproute2 %s\n", r.Env.KernelRelease(), r.Env.CPUs, r.Env.CPU, strings.TrimPrefix(r.Env.Iproute2, "ip utility, "))
	for _, m := range s.metrics {
		fmt.Fprintf(w, "\n%s (%s, %s is better)\n", m, s.units[m], s.better[m])
		if len(s.configs[m]) > 6 && len(s.configs[m]) > len(s.marks[m]) {
			// Many configurations, few marks: configurations as rows, so
			// the table stays readable on a terminal.
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
			header := []string{"configuration"}
			for _, mark := range s.marks[m] {
				header = append(header, markLabel(mark))
			}
			fmt.Fprintln(tw, strings.Join(header, "\t")+"\t")
			for _, c := range s.configs[m] {
				row := []string{c}
				for _, mark := range s.marks[m] {
					row = append(row, cell(s.values[m][c][mark]))
				}
				fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
			}
			tw.Flush()
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		header := []string{"mark"}
		for _, c := range s.configs[m] {
			header = append(header, c)
		}
		fmt.Fprintln(tw, strings.Join(header, "\t")+"\t")
		for _, mark := range s.marks[m] {
			row := []string{strconv.Itoa(mark)}
			if mark == 0 {
				row[0] = "-"
			}
			for _, c := range s.configs[m] {
				row = append(row, cell(s.values[m][c][mark]))
			}
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
		tw.Flush()
	}
	for _, sk := range r.Skipped {
		fmt.Fprintf(w, "skipped: %s\n", sk)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	return nil
}

func markLabel(mark int) string {
	if mark == 0 {
		return "-"
	}
	return "mark " + strconv.Itoa(mark)
}

func cell(v []float64) string {
	if len(v) == 0 {
		return ""
	}
	st := Summarize(v)
	if len(v) == 1 {
		return num(st.Mean)
	}
	return fmt.Sprintf("%s ± %s (n=%d)", num(st.Mean), num(st.SD), len(v))
}

func num(x float64) string {
	switch a := math.Abs(x); {
	case a >= 100:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(x, 'f', 1, 64)
	default:
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
}

func paramString(p map[string]string) string {
	var keys []string
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+"="+p[k])
	}
	return strings.Join(parts, " ")
}

// WriteJSON writes the run as JSON.
func WriteJSON(w io.Writer, r *bench.Run) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteCSV writes one row per sample.
func WriteCSV(w io.Writer, r *bench.Run) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"run", "scenario", "config", "metric", "unit", "mark", "rep", "value"})
	for _, x := range r.Samples {
		cw.Write([]string{r.ID, r.Scenario, bench.ConfigKey(x.Config, r.Keys), x.Metric, x.Unit, strconv.Itoa(x.Mark), strconv.Itoa(x.Rep), strconv.FormatFloat(x.Value, 'g', -1, 64)})
	}
	cw.Flush()
	return cw.Error()
}

// BenchName is the Go benchmark name of a scenario: fake-router ->
// FakeRouter.
func BenchName(scenario string) string {
	var b strings.Builder
	b.WriteString("Benchmark")
	up := true
	for _, r := range scenario {
		if r == '-' || r == '_' {
			up = true
			continue
		}
		if up {
			r = unicode.ToUpper(r)
			up = false
		}
		b.WriteRune(r)
	}
	return b.String()
}

// WriteBenchfmt writes the run in the Go benchmark format, one line per
// sample, the configuration as name keys
// (BenchmarkFakeRouter/engine=native/variant=add/mark=250), so that
// `benchstat -col /engine` lays engines side by side.
func WriteBenchfmt(w io.Writer, r *bench.Run) error {
	bw := benchfmt.NewWriter(w)
	base := strings.TrimPrefix(BenchName(r.Scenario), "Benchmark") // the writer adds it
	fileCfg := []benchfmt.Config{
		{Key: "goos", Value: []byte("linux"), File: true},
		{Key: "kernel", Value: []byte(r.Env.KernelRelease()), File: true},
		{Key: "cpu", Value: []byte(r.Env.CPU), File: true},
		{Key: "cpus", Value: []byte(strconv.Itoa(r.Env.CPUs)), File: true},
		{Key: "nsfleet-run", Value: []byte(r.ID), File: true},
	}
	units := map[string]string{}
	for _, x := range r.Samples {
		unit := benchUnit(x)
		if _, ok := units[unit]; !ok {
			units[unit] = x.Better
			bw.Write(&benchfmt.UnitMetadata{UnitMetadataKey: benchfmt.UnitMetadataKey{Unit: unit, Key: "better"}, OrigUnit: unit, Value: x.Better})
		}
		name := base + "/" + bench.ConfigKey(x.Config, r.Keys)
		if x.Metric != "rate" && x.Metric != "" {
			name += "/metric=" + strings.ReplaceAll(x.Metric, " ", "_")
		}
		if x.Mark > 0 {
			name += "/mark=" + strconv.Itoa(x.Mark)
		}
		res := &benchfmt.Result{Config: fileCfg, Name: benchfmt.Name(name), Iters: 1,
			Values: []benchfmt.Value{{Value: x.Value, Unit: unit}}}
		if err := bw.Write(res); err != nil {
			return err
		}
	}
	return nil
}

// benchUnit makes a unit benchstat accepts (no spaces).
func benchUnit(x bench.Sample) string {
	return strings.ReplaceAll(x.Unit, " ", "-")
}
