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
	type line struct {
		label string
		pts   plotter.XYs
		errs  plotter.YErrors
	}
	panels := map[string][]line{}
	var order []string
	var unit string
	minY, maxY, minX, maxX := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, r := range runs {
		g := group(r)
		vals, ok := g.values[metric]
		if !ok {
			continue
		}
		unit = g.units[metric]
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
			l := line{label: strings.TrimSpace(label)}
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
				minY, maxY = math.Min(minY, st.Mean-st.SD), math.Max(maxY, st.Mean+st.SD)
				minX, maxX = math.Min(minX, float64(m)), math.Max(maxX, float64(m))
			}
			if len(l.pts) == 0 {
				continue
			}
			if _, ok := panels[panel]; !ok {
				order = append(order, panel)
			}
			panels[panel] = append(panels[panel], l)
		}
	}
	if len(order) == 0 {
		return fmt.Errorf("no %q samples with marks to plot", metric)
	}
	// Panels in the order the run made them (the scenario's order of
	// variants); each label keeps one style across panels.
	style := map[string]int{}
	var labels []string
	for _, name := range order {
		for _, l := range panels[name] {
			if _, ok := style[l.label]; !ok {
				style[l.label] = len(labels)
				labels = append(labels, l.label)
			}
		}
	}
	if len(labels) > len(okabeIto)*len(dashes) {
		return fmt.Errorf("%d lines would share the %d distinct colour and dash pairs: plot fewer configurations", len(labels), len(okabeIto)*len(dashes))
	}
	var marks []float64
	seenMark := map[float64]bool{}
	for _, name := range order {
		for _, l := range panels[name] {
			for _, pt := range l.pts {
				if !seenMark[pt.X] {
					seenMark[pt.X] = true
					marks = append(marks, pt.X)
				}
			}
		}
	}
	sort.Float64s(marks)
	// A logarithmic axis when the values span more than 10x (and are all
	// positive): otherwise the slow lines lie flat on the floor.
	logY := minY > 0 && maxY/minY > 10
	if !logY {
		minY = 0
	}
	cols := min(len(order), 3)
	rows := (len(order) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	for k, name := range order {
		ls := panels[name]
		p := plot.New()
		p.Title.Text = name
		if k == 0 {
			p.Title.Text = fmt.Sprintf("%s: %s", runs[0].Scenario, metric)
			if name != "" {
				p.Title.Text += " | " + name
			}
		}
		p.Title.TextStyle.Font.Size = vg.Points(10)
		p.X.Label.Text = "mark (done so far)"
		p.Y.Label.Text = fmt.Sprintf("%s (%s)", metric, unit)
		p.X.Min, p.X.Max = minX, maxX
		p.Y.Min, p.Y.Max = minY, maxY
		if logY {
			p.Y.Scale = plot.LogScale{}
			p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
			p.Y.Label.Text += ", log scale"
		}
		p.Add(plotter.NewGrid())
		p.Legend.Top = true
		p.Legend.TextStyle.Font.Size = vg.Points(8)
		p.X.Tick.Marker = markTicks(marks)
		for _, l := range ls {
			i := style[l.label]
			col := okabeIto[i%len(okabeIto)]
			dash := dashes[(i/len(okabeIto))%len(dashes)]
			if len(labels) <= len(dashes) {
				dash = dashes[i] // few lines: dashes differ too
			}
			lp, err := plotter.NewLine(l.pts)
			if err != nil {
				return err
			}
			lp.Color, lp.Width, lp.Dashes = col, vg.Points(1.5), dash
			sc, err := plotter.NewScatter(l.pts)
			if err != nil {
				return err
			}
			sc.GlyphStyle = draw.GlyphStyle{Color: col, Radius: vg.Points(2.5), Shape: glyphs[i%len(glyphs)]}
			if !logY {
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
		grid[k/cols][k%cols] = p
	}
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
