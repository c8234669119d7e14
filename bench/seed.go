package bench

import (
	"embed"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"sort"
	"strconv"
	"text/tabwriter"
)

// A Seed is a report's published table, typed in once as data
// (bench/seeds/*.json), to print beside this machine's figures in the
// report's own shape (--seed-table).
type Seed struct {
	Scenario string            `json:"scenario"`
	Report   string            `json:"report"`
	Title    string            `json:"title"`
	Date     string            `json:"date"`
	Author   string            `json:"author"`
	Kernel   string            `json:"kernel"`
	Hardware string            `json:"hardware"`
	Archive  string            `json:"archive"`
	Method   string            `json:"method"`
	Config   map[string]string `json:"config"` // the configuration that runs the report's method
	X        string            `json:"x"`      // the first column: the mark
	// XParam, if set, names the run parameter that x is (uevent: the
	// number of namespaces); rows then match the run's figures whatever
	// their mark, when the run's parameter equals x.
	XParam  string       `json:"x_param,omitempty"`
	Columns []SeedColumn `json:"columns"`
	Rows    [][]float64  `json:"rows"` // x, then one value per column
}

// SeedColumn is one column of the report's table and the metric that
// measures the same thing here ("": nothing here does, e.g. the figure of
// a kernel before a patch).
type SeedColumn struct {
	Title  string `json:"title"`
	Metric string `json:"metric"`
	Here   string `json:"here,omitempty"` // this machine's column title; "": Title
}

//go:embed seeds/*.json
var seedFiles embed.FS

// Seeds returns the seed tables of a scenario.
func Seeds(scenario string) ([]*Seed, error) {
	all, err := allSeeds()
	if err != nil {
		return nil, err
	}
	var out []*Seed
	for _, s := range all {
		if s.Scenario == scenario {
			out = append(out, s)
		}
	}
	return out, nil
}

func allSeeds() ([]*Seed, error) {
	ents, err := seedFiles.ReadDir("seeds")
	if err != nil {
		return nil, err
	}
	var out []*Seed
	for _, e := range ents {
		b, err := seedFiles.ReadFile(path.Join("seeds", e.Name()))
		if err != nil {
			return nil, err
		}
		var s Seed
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, fmt.Errorf("seeds/%s: %w", e.Name(), err)
		}
		if err := s.check(); err != nil {
			return nil, fmt.Errorf("seeds/%s: %w", e.Name(), err)
		}
		out = append(out, &s)
	}
	return out, nil
}

// check holds a seed to its scenario: known scenario, its configuration
// keys and values, one number per column in every row.
func (s *Seed) check() error {
	sc, err := Lookup(s.Scenario)
	if err != nil {
		return err
	}
	for k, v := range s.Config {
		known := false
		for _, key := range sc.Keys {
			known = known || key == k
		}
		if !known {
			return fmt.Errorf("config key %q is not one of %s's keys %v", k, s.Scenario, sc.Keys)
		}
		choices := sc.Variants
		if k == "engine" {
			choices = sc.Engines
		}
		if _, err := pick(choices, []string{v}); err != nil {
			return fmt.Errorf("config %s=%s: %w", k, v, err)
		}
	}
	if len(s.Columns) == 0 || len(s.Rows) == 0 {
		return fmt.Errorf("no columns or no rows")
	}
	for i, r := range s.Rows {
		if len(r) != 1+len(s.Columns) {
			return fmt.Errorf("row %d has %d numbers, want %d (%s and %d columns)", i+1, len(r), 1+len(s.Columns), s.X, len(s.Columns))
		}
	}
	if s.Date == "" || s.Author == "" || s.Archive == "" || s.Kernel == "" || s.Hardware == "" {
		return fmt.Errorf("date, author, kernel, hardware and archive are all required (say \"not stated\")")
	}
	return nil
}

// WriteSeedTable prints the report's table with this run's figures for
// the same configuration and marks beside it (the mean over runs; "-"
// where this run has no such mark).
func WriteSeedTable(w io.Writer, s *Seed, run *Run) error {
	fmt.Fprintf(w, "report %s, %q (%s, %s; kernel %s; hardware %s)\n", s.Report, s.Title, s.Date, s.Author, s.Kernel, s.Hardware)
	fmt.Fprintf(w, "  method: %s\n  source: %s\n", s.Method, s.Archive)
	fmt.Fprintf(w, "  this machine: %s\n", ConfigKey(s.Config, run.Keys))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\t", s.X)
	for _, c := range s.Columns {
		fmt.Fprintf(tw, "report: %s\t", c.Title)
	}
	for _, c := range s.Columns {
		if c.Metric != "" {
			title := c.Here
			if title == "" {
				title = c.Title
			}
			fmt.Fprintf(tw, "here: %s\t", title)
		}
	}
	fmt.Fprintln(tw)
	means := map[string]map[int][]float64{}
	for _, x := range run.Samples {
		if !x.Matches(s.Config) {
			continue
		}
		if means[x.Metric] == nil {
			means[x.Metric] = map[int][]float64{}
		}
		means[x.Metric][x.Mark] = append(means[x.Metric][x.Mark], x.Value)
	}
	rows := append([][]float64(nil), s.Rows...)
	sort.Slice(rows, func(i, j int) bool { return rows[i][0] < rows[j][0] })
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t", strconv.FormatFloat(r[0], 'f', -1, 64))
		for _, v := range r[1:] {
			fmt.Fprintf(tw, "%s\t", strconv.FormatFloat(v, 'g', 6, 64))
		}
		for _, c := range s.Columns {
			if c.Metric == "" {
				continue
			}
			vs := means[c.Metric][int(r[0])]
			if s.XParam != "" {
				vs = nil
				if run.Params[s.XParam] == strconv.FormatFloat(r[0], 'f', -1, 64) {
					for _, byMark := range means[c.Metric] {
						vs = append(vs, byMark...)
					}
				}
			}
			if len(vs) == 0 {
				fmt.Fprint(tw, "-\t")
				continue
			}
			sum := 0.0
			for _, v := range vs {
				sum += v
			}
			fmt.Fprintf(tw, "%.3g\t", sum/float64(len(vs)))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}
