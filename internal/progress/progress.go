// Package progress shows long work on a terminal or in a log: a bar with
// rate and ETA where the writer is a terminal, a plain line every few
// seconds otherwise (logs, CI), or nothing. nsfleet's commands and the
// lab's share it.
package progress

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Display is one piece of long work's progress. Its methods must be called
// from one goroutine at a time (fleet's OnResult guarantees it).
type Display struct {
	w        io.Writer
	verb     string
	total    int
	done     int
	start    time.Time
	lastLine time.Time
	bar      *progressbar.ProgressBar
	plain    bool
}

// PlainEvery is the interval of plain progress lines.
const PlainEvery = 2 * time.Second

// New starts a display of verb's progress towards total on w. mode is
// auto (a bar on a terminal, plain lines otherwise), bar, plain or none;
// a total under 2 shows nothing.
func New(w io.Writer, verb string, total int, mode string) *Display {
	p := &Display{w: w, verb: verb, total: total, start: time.Now(), lastLine: time.Now()}
	if mode == "auto" {
		mode = "plain"
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			mode = "bar"
		}
	}
	switch {
	case total < 2 || mode == "none":
	case mode == "bar":
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription(verb),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("ns"),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionFullWidth(),
		)
	default:
		p.plain = true
	}
	return p
}

// Set moves the progress to done out of total (total may grow from 0).
func (p *Display) Set(done, total int) {
	if total != p.total && p.bar != nil {
		p.bar.ChangeMax(total)
	}
	p.total = total
	p.Add(done - p.done)
}

// Add moves the progress on by step.
func (p *Display) Add(step int) {
	if step <= 0 {
		return
	}
	p.done += step
	switch {
	case p.bar != nil:
		p.bar.Add(step)
	case p.plain && time.Since(p.lastLine) >= PlainEvery && p.done < p.total:
		p.lastLine = time.Now()
		el := time.Since(p.start).Seconds()
		rate := float64(p.done) / el
		eta := float64(p.total-p.done) / rate
		fmt.Fprintf(p.w, "%s: %d/%d (%.0f%%) %.0f/s, eta %.0fs\n", p.verb, p.done, p.total, 100*float64(p.done)/float64(p.total), rate, eta)
	}
}

// PrintAbove prints a line to the progress writer without breaking the bar.
func (p *Display) PrintAbove(msg string) { p.PrintAboveTo(p.w, msg) }

// PrintAboveTo prints a line to w without breaking the bar.
func (p *Display) PrintAboveTo(w io.Writer, msg string) {
	if p.bar != nil {
		p.bar.Clear()
	}
	fmt.Fprintln(w, msg)
	if p.bar != nil {
		p.bar.RenderBlank()
	}
}

// Finish ends the display (a bar is cleared).
func (p *Display) Finish() {
	if p.bar != nil {
		p.bar.Finish()
		p.bar.Clear()
	}
}
