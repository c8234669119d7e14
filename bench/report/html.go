package report

import (
	"bytes"
	"fmt"
	"github.com/nsfleet/nsfleet/bench"
	"html/template"
	"io"
	"sort"
	"strings"
)

var reportTmpl = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>nsfleet bench report</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 70em; color: #222; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; vertical-align: top; }
h2 { border-bottom: 1px solid #ccc; }
</style></head><body>
<h1>nsfleet bench report</h1>
{{range .}}
<h2>{{.Run.Scenario}} — run {{.Run.ID}}</h2>
<p>Started {{.Run.Started.Format "2006-01-02 15:04:05 MST"}}, {{printf "%.1f" .Run.Elapsed}} s.</p>
{{range .Plots}}<figure>{{.}}</figure>{{end}}
<h3>Tables</h3>
<pre>{{.Table}}</pre>
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

type kv struct{ K, V string }

// WriteReport writes one HTML page with the tables, plots (inline SVG) and
// environment of each run.
func WriteReport(w io.Writer, runs []*bench.Run) error {
	type page struct {
		Run    *bench.Run
		Table  string
		Plots  []template.HTML
		Config []kv
	}
	var pages []page
	for _, r := range runs {
		var tb bytes.Buffer
		WriteTable(&tb, r)
		pg := page{Run: r, Table: tb.String()}
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
	return reportTmpl.Execute(w, pages)
}
