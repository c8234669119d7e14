package report

import (
	"bytes"
	"fmt"
	"html/template"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/nsfleet/nsfleet/bench"
)

// reportTmpl is parsed on first use, not at every start of nsfleet.
var reportTmpl = sync.OnceValue(func() *template.Template {
	return template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>nsfleet bench report</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 74em; padding: 0 1em; color: #222; }
h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; max-width: 100%; }
caption { text-align: left; font-weight: 600; padding: 0.3em 0; }
td, th { border: 1px solid #ddd; padding: 0.25em 0.5em; vertical-align: top; overflow-wrap: anywhere; }
th { background: #f4f4f4; text-align: left; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.summary { font-size: 0.85em; width: 100%; }
table.summary td, table.summary th { overflow-wrap: normal; }
td.c { overflow-wrap: anywhere; }
tr.best td { background: #eef7ee; }
.verdict { color: #555; }
figure { margin: 1em 0; } figure svg { max-width: 100%; height: auto; }
ul.notes { font-size: 0.9em; color: #444; }
</style></head><body>
<h1>nsfleet bench report</h1>
{{with .Summary}}
<h2>Summary</h2>
<table class="summary">
<caption>Which engine or kernel is best, per scenario, metric and variant, over the marks given (each repetition's mean over the marks is one observation)</caption>
<tr><th>scenario</th><th>metric</th><th>configuration</th><th class="n">marks</th><th>best {{with index . 0}}{{.Key}}{{end}}</th><th>runner-up (best is × better)</th><th>worst (best is × better)</th><th>statistics (best against runner-up)</th></tr>
{{range .}}<tr><td>{{.Scenario}}</td><td>{{.Metric}} ({{.Unit}}, {{.Better}} is better)</td><td class="c">{{.Panel}}</td><td class="n">{{.Marks}}</td><td><b>{{.Best}}</b></td><td>{{.RunnerUp}}: <b>{{printf "%.2f" .Factor}}×</b></td><td>{{.Worst}}: <b>{{printf "%.2f" .WorstFactor}}×</b></td><td class="verdict">{{.Verdict}}</td></tr>
{{end}}</table>
{{end}}
{{range .Pages}}
<h2>{{.Run.Scenario}}: run {{.Run.ID}}</h2>
<p>Started {{.Run.Started.Format "2006-01-02 15:04:05 MST"}}, {{printf "%.1f" .Run.Elapsed}} s. {{.Params}}</p>
{{range .Tables}}<table>
<caption>{{.Caption}}</caption>
<tr>{{range $i, $h := .Head}}<th{{if $i}} class="n"{{end}}>{{$h}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range $i, $c := .}}<td{{if $i}} class="n"{{end}}>{{$c}}</td>{{end}}</tr>
{{end}}</table>
{{end}}
{{range .Plots}}<figure>{{.}}</figure>{{end}}
{{if or .Run.Notes .Run.Skipped}}<ul class="notes">{{range .Run.Skipped}}<li>skipped: {{.}}</li>{{end}}{{range .Run.Notes}}<li>{{.}}</li>{{end}}</ul>{{end}}
<h3>Environment</h3>
<table>
<tr><th>kernel</th><td>{{.Run.Env.Kernel}}</td></tr>
<tr><th>command line</th><td>{{.Run.Env.Cmdline}}</td></tr>
<tr><th>CPU</th><td>{{.Run.Env.CPUs}} × {{.Run.Env.CPU}}</td></tr>
<tr><th>memory</th><td>{{.Run.Env.MemoryMiB}} MiB</td></tr>
<tr><th>run dir</th><td>{{.Run.Env.RunDirProp}}</td></tr>
<tr><th>iproute2</th><td>{{.Run.Env.Iproute2}}</td></tr>
<tr><th>nsfleet</th><td>{{.Run.Env.Nsfleet}} ({{.Run.Env.Go}})</td></tr>
{{range .Config}}<tr><th>{{.K}}</th><td>{{.V}}</td></tr>{{end}}
</table>
{{end}}
</body></html>
`))
})

type kv struct{ K, V string }

// htmlTable is one metric's table: a first column of labels, then numbers.
type htmlTable struct {
	Caption string
	Head    []string
	Rows    [][]string
}

// tablesOf lays out each metric of r as a table of mean ± SD cells, with
// configurations as columns and marks as rows, or the other way round
// when there are more configurations than marks, so that the table grows
// down the page instead of sideways.
func tablesOf(r *bench.Run) []htmlTable {
	s := group(r)
	var out []htmlTable
	for _, m := range s.metrics {
		t := htmlTable{Caption: fmt.Sprintf("%s (%s, %s is better; mean ± SD over the repetitions)", m, s.units[m], s.better[m])}
		configs, marks := s.configs[m], s.marks[m]
		if len(configs) > len(marks) {
			t.Head = []string{"configuration"}
			for _, mk := range marks {
				t.Head = append(t.Head, markLabel(mk)+" ("+s.units[m]+")")
			}
			for _, c := range configs {
				row := []string{c}
				for _, mk := range marks {
					row = append(row, cell(s.values[m][c][mk]))
				}
				t.Rows = append(t.Rows, row)
			}
		} else {
			t.Head = []string{"mark"}
			for _, c := range configs {
				t.Head = append(t.Head, c+" ("+s.units[m]+")")
			}
			for _, mk := range marks {
				row := []string{markLabel(mk)}
				for _, c := range configs {
					row = append(row, cell(s.values[m][c][mk]))
				}
				t.Rows = append(t.Rows, row)
			}
		}
		out = append(out, t)
	}
	return out
}

// WriteReport writes one HTML page: a summary of the findings first, then
// per run its tables (HTML tables), plots (inline SVG), notes and
// environment.
func WriteReport(w io.Writer, runs []*bench.Run) error {
	type page struct {
		Run    *bench.Run
		Params string
		Tables []htmlTable
		Plots  []template.HTML
		Config []kv
	}
	var pages []page
	for _, r := range runs {
		pg := page{Run: r, Params: paramString(r.Params), Tables: tablesOf(r)}
		g := group(r)
		for _, m := range g.metrics {
			hasMarks := false
			for _, mk := range g.marks[m] {
				hasMarks = hasMarks || mk > 0
			}
			if !hasMarks || !strings.HasSuffix(g.units[m], "/s") {
				continue
			}
			var svg bytes.Buffer
			if err := Plot(&svg, []*bench.Run{r}, m, "svg"); err == nil {
				pg.Plots = append(pg.Plots, template.HTML(svg.String())) // produced by gonum/plot from numbers only
			}
		}
		for k, v := range r.Env.Config {
			pg.Config = append(pg.Config, kv{k, v})
		}
		for k, v := range r.Env.Sysctls {
			pg.Config = append(pg.Config, kv{k, v})
		}
		sort.Slice(pg.Config, func(i, j int) bool { return pg.Config[i].K < pg.Config[j].K })
		pages = append(pages, pg)
	}
	if len(pages) == 0 {
		return fmt.Errorf("no runs")
	}
	return reportTmpl().Execute(w, struct {
		Summary []Finding
		Pages   []page
	}{Findings(runs), pages})
}
