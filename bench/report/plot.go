package report

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/nsfleet/nsfleet/bench"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// okabeIto is the colour-blind-safe palette of Okabe and Ito (2008).
var okabeIto = []color.Color{
	color.RGBA{0xE6, 0x9F, 0x00, 0xff}, // orange
	color.RGBA{0x56, 0xB4, 0xE9, 0xff}, // sky blue
	color.RGBA{0x00, 0x9E, 0x73, 0xff}, // bluish green
	color.RGBA{0x00, 0x72, 0xB2, 0xff}, // blue
	color.RGBA{0xD5, 0x5E, 0x00, 0xff}, // vermillion
	color.RGBA{0xCC, 0x79, 0xA7, 0xff}, // reddish purple
	color.RGBA{0x00, 0x00, 0x00, 0xff}, // black
	color.RGBA{0xF0, 0xE4, 0x42, 0xff}, // yellow (last: weakest on white)
}

// dashes and glyphs tell series apart without colour.
var dashes = [][]vg.Length{nil, {vg.Points(6), vg.Points(3)}, {vg.Points(2), vg.Points(2)}, {vg.Points(8), vg.Points(3), vg.Points(2), vg.Points(3)}, {vg.Points(12), vg.Points(4)}}
var glyphs = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.TriangleGlyph{}, draw.SquareGlyph{}, draw.CrossGlyph{}, draw.PlusGlyph{}, draw.RingGlyph{}, draw.PyramidGlyph{}, draw.BoxGlyph{}}

// Plot draws one metric (e.g. "rate") of one or more runs against the
// mark as small multiples: one panel per variant (the configuration key
// after the engine, or per run when runs are compared and there is no
// variant), all on the same axes, a line per remaining configuration with
// the mean and ±1 SD bars. Each line in a panel has its own colour and
// dash pattern (there are 40 pairs; more lines in one panel is an error,
// never a repeated style) and a marker; the rate axis is logarithmic when
// the data span more than 10x; the x axis ends at the data. format is
// "svg" or "png".
func Plot(w io.Writer, runs []*bench.Run, metric, format string) error {
	pd := collectPanels(runs, metric)
	if len(pd.order) == 0 {
		return fmt.Errorf("no %q samples with marks to plot", metric)
	}
	style, labels := pd.styles()
	if len(labels) > len(okabeIto)*len(dashes) {
		return fmt.Errorf("%d lines would share the %d distinct colour and dash pairs: plot fewer configurations", len(labels), len(okabeIto)*len(dashes))
	}
	// A logarithmic axis when the values span more than 10x (and are all
	// positive): otherwise the slow lines lie flat on the floor.
	pd.logY = pd.minY > 0 && pd.maxY/pd.minY > 10
	if !pd.logY {
		pd.minY = 0
	}
	cols := min(len(pd.order), 3)
	rows := (len(pd.order) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	marks := pd.marks()
	for k, name := range pd.order {
		title := name
		if k == 0 {
			title = fmt.Sprintf("%s: %s", runs[0].Scenario, metric)
			if name != "" {
				title += " | " + name
			}
		}
		p, err := pd.panel(title, metric, pd.panels[name], marks, style, len(labels))
		if err != nil {
			return err
		}
		grid[k/cols][k%cols] = p
	}
	return drawGrid(w, grid, rows, cols, format)
}

// plotLine is one configuration's means (with ±1 SD) over the marks.
type plotLine struct {
	label string
	pts   plotter.XYs
	errs  plotter.YErrors
}

// panelData is what Plot draws: lines per panel, in the runs' order, and
// the bounds every panel shares.
type panelData struct {
	panels                 map[string][]plotLine
	order                  []string
	unit                   string
	minY, maxY, minX, maxX float64
	logY                   bool
}

// collectPanels groups the metric's samples of the runs into panels (the
// configuration after its first key; per run when runs are compared and
// there is none) of lines (the first key, with the run when several).
func collectPanels(runs []*bench.Run, metric string) *panelData {
	pd := &panelData{panels: map[string][]plotLine{}, minY: math.Inf(1), maxY: math.Inf(-1), minX: math.Inf(1), maxX: math.Inf(-1)}
	for _, r := range runs {
		g := group(r)
		vals, ok := g.values[metric]
		if !ok {
			continue
		}
		pd.unit = g.units[metric]
		// In the order the run made them: the scenario's order.
		for _, c := range g.configs[metric] {
			panel, label := splitConfig(c, r.Keys)
			if len(runs) > 1 {
				who := r.ID[len(r.ID)-8:]
				if k := r.Env.KernelRelease(); k != "" {
					who = k + " " + who
				}
				if panel == "" {
					panel = who
				} else {
					label = who + " " + label
				}
			}
			l := plotLine{label: strings.TrimSpace(label)}
			if l.label == "" {
				l.label = "all"
			}
			for _, m := range g.marks[metric] {
				v := vals[c][m]
				if len(v) == 0 || m == 0 {
					continue
				}
				st := Summarize(v)
				l.pts = append(l.pts, plotter.XY{X: float64(m), Y: st.Mean})
				l.errs = append(l.errs, struct{ Low, High float64 }{st.SD, st.SD})
				pd.minY, pd.maxY = math.Min(pd.minY, st.Mean-st.SD), math.Max(pd.maxY, st.Mean+st.SD)
				pd.minX, pd.maxX = math.Min(pd.minX, float64(m)), math.Max(pd.maxX, float64(m))
			}
			if len(l.pts) == 0 {
				continue
			}
			if _, ok := pd.panels[panel]; !ok {
				pd.order = append(pd.order, panel)
			}
			pd.panels[panel] = append(pd.panels[panel], l)
		}
	}
	return pd
}

// styles gives each line label one style index, kept across panels.
func (pd *panelData) styles() (map[string]int, []string) {
	style := map[string]int{}
	var labels []string
	for _, name := range pd.order {
		for _, l := range pd.panels[name] {
			if _, ok := style[l.label]; !ok {
				style[l.label] = len(labels)
				labels = append(labels, l.label)
			}
		}
	}
	return style, labels
}

// marks are the x values of every line, sorted.
func (pd *panelData) marks() []float64 {
	var marks []float64
	seen := map[float64]bool{}
	for _, name := range pd.order {
		for _, l := range pd.panels[name] {
			for _, pt := range l.pts {
				if !seen[pt.X] {
					seen[pt.X] = true
					marks = append(marks, pt.X)
				}
			}
		}
	}
	sort.Float64s(marks)
	return marks
}

// panel draws one panel's lines on the shared axes: a colour and dash
// pattern and a marker per label (dashes differ too when the lines are
// few), error bars on a linear axis.
func (pd *panelData) panel(title, metric string, lines []plotLine, marks []float64, style map[string]int, nLabels int) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(10)
	p.X.Label.Text = "mark (done so far)"
	p.Y.Label.Text = fmt.Sprintf("%s (%s)", metric, pd.unit)
	p.X.Min, p.X.Max = pd.minX, pd.maxX
	p.Y.Min, p.Y.Max = pd.minY, pd.maxY
	if pd.logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Label.Text += ", log scale"
	}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.X.Tick.Marker = markTicks(marks)
	for _, l := range lines {
		i := style[l.label]
		col := okabeIto[i%len(okabeIto)]
		dash := dashes[(i/len(okabeIto))%len(dashes)]
		if nLabels <= len(dashes) {
			dash = dashes[i]
		}
		lp, err := plotter.NewLine(l.pts)
		if err != nil {
			return nil, err
		}
		lp.Color, lp.Width, lp.Dashes = col, vg.Points(1.5), dash
		sc, err := plotter.NewScatter(l.pts)
		if err != nil {
			return nil, err
		}
		sc.GlyphStyle = draw.GlyphStyle{Color: col, Radius: vg.Points(2.5), Shape: glyphs[i%len(glyphs)]}
		if !pd.logY {
			eb, err := plotter.NewYErrorBars(struct {
				plotter.XYs
				plotter.YErrors
			}{l.pts, l.errs})
			if err == nil {
				eb.Color = col
				p.Add(eb)
			}
		}
		p.Add(lp, sc)
		p.Legend.Add(l.label, lp, sc)
	}
	return p, nil
}

// drawGrid renders the panels as tiles of one canvas in format.
func drawGrid(w io.Writer, grid [][]*plot.Plot, rows, cols int, format string) error {
	width := vg.Length(cols) * 4.2 * vg.Inch
	height := vg.Length(rows) * 3.2 * vg.Inch
	c, err := draw.NewFormattedCanvas(width, height, format)
	if err != nil {
		return err
	}
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(grid, tiles, draw.New(c))
	for i := range grid {
		for j := range grid[i] {
			if grid[i][j] != nil {
				grid[i][j].Draw(canvases[i][j])
			}
		}
	}
	_, err = c.WriteTo(w)
	return err
}

// splitConfig splits "engine=native/variant=add" into the panel (the
// variant-like keys: everything after the first key when there are
// several) and the line label (the first key, usually the engine).
func splitConfig(c string, keys []string) (panel, label string) {
	parts := strings.Split(c, "/")
	if len(parts) < 2 {
		return "", c
	}
	return strings.Join(parts[1:], "/"), parts[0]
}

// markTicks labels the x axis with the marks themselves (at most about
// eight of them), as integers.
func markTicks(marks []float64) plot.Ticker {
	return plot.TickerFunc(func(min, max float64) []plot.Tick {
		step := (len(marks) + 7) / 8
		var ts []plot.Tick
		for i, m := range marks {
			label := ""
			if i%step == 0 || i == len(marks)-1 {
				label = strconv.FormatFloat(m, 'f', -1, 64)
			}
			ts = append(ts, plot.Tick{Value: m, Label: label})
		}
		return ts
	})
}
