package report

import (
	"fmt"
	"github.com/nsfleet/nsfleet/bench"
	"image/color"
	"io"
	"sort"

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

// Plot draws one metric (e.g. "rate") of one or more runs against the mark:
// a line per configuration (and run), mean with ±1 SD error bars, each
// series with its own colour, dash pattern and marker, labelled at its end.
// format is "svg" or "png".
func Plot(w io.Writer, runs []*bench.Run, metric, format string) error {
	p := plot.New()
	var unit string
	type line struct {
		label string
		pts   plotter.XYs
		errs  plotter.YErrors
	}
	var lines []line
	for _, r := range runs {
		g := group(r)
		vals, ok := g.values[metric]
		if !ok {
			continue
		}
		unit = g.units[metric]
		configs := append([]string(nil), g.configs[metric]...)
		sort.Strings(configs)
		for _, c := range configs {
			l := line{label: c}
			if len(runs) > 1 {
				l.label = r.ID[len(r.ID)-8:] + " " + c
			}
			for _, m := range g.marks[metric] {
				v := vals[c][m]
				if len(v) == 0 || m == 0 {
					continue
				}
				s := Summarize(v)
				l.pts = append(l.pts, plotter.XY{X: float64(m), Y: s.Mean})
				l.errs = append(l.errs, struct{ Low, High float64 }{s.SD, s.SD})
			}
			if len(l.pts) > 0 {
				lines = append(lines, l)
			}
		}
	}
	if len(lines) == 0 {
		return fmt.Errorf("no %q samples with marks to plot", metric)
	}
	p.Title.Text = fmt.Sprintf("%s: %s per mark", runs[0].Scenario, metric)
	p.X.Label.Text = "mark (namespaces made so far)"
	p.Y.Label.Text = fmt.Sprintf("%s (%s)", metric, unit)
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	for i, l := range lines {
		col := okabeIto[i%len(okabeIto)]
		lp, err := plotter.NewLine(l.pts)
		if err != nil {
			return err
		}
		lp.Color, lp.Width, lp.Dashes = col, vg.Points(1.5), dashes[i%len(dashes)]
		sc, err := plotter.NewScatter(l.pts)
		if err != nil {
			return err
		}
		sc.GlyphStyle = draw.GlyphStyle{Color: col, Radius: vg.Points(3), Shape: glyphs[i%len(glyphs)]}
		eb, err := plotter.NewYErrorBars(struct {
			plotter.XYs
			plotter.YErrors
		}{l.pts, l.errs})
		if err == nil {
			eb.Color = col
			p.Add(eb)
		}
		last := l.pts[len(l.pts)-1]
		lab, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{last}, Labels: []string{" " + l.label}})
		if err == nil {
			lab.TextStyle[0].Color = col
			p.Add(lab)
		}
		p.Add(lp, sc)
	}
	// No legend: every series is labelled at its end instead.
	p.X.Max *= 1.35 // room for the direct labels
	wt, err := p.WriterTo(9*vg.Inch, 5*vg.Inch, format)
	if err != nil {
		return err
	}
	_, err = wt.WriteTo(w)
	return err
}
