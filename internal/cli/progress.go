package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress shows long work: a bar with rate and ETA on a terminal, a plain
// line every few seconds otherwise (logs, CI), or nothing. Calls must come
// from one goroutine at a time (fleet's OnResult guarantees it).
type progress struct {
	w        io.Writer
	verb     string
	total    int
	done     int
	start    time.Time
	lastLine time.Time
	bar      *progressbar.ProgressBar
	plain    bool
}

// plainEvery is the interval of plain progress lines.
const plainEvery = 2 * time.Second

func newProgress(w io.Writer, verb string, total int, mode string) *progress {
	p := &progress{w: w, verb: verb, total: total, start: time.Now(), lastLine: time.Now()}
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

// set moves the progress to done out of total (total may grow from 0).
func (p *progress) set(done, total int) {
	if total != p.total && p.bar != nil {
		p.bar.ChangeMax(total)
	}
	p.total = total
	p.add(done - p.done)
}

func (p *progress) add(step int) {
	if step <= 0 {
		return
	}
	p.done += step
	switch {
	case p.bar != nil:
		p.bar.Add(step)
	case p.plain && time.Since(p.lastLine) >= plainEvery && p.done < p.total:
		p.lastLine = time.Now()
		el := time.Since(p.start).Seconds()
		rate := float64(p.done) / el
		eta := float64(p.total-p.done) / rate
		fmt.Fprintf(p.w, "%s: %d/%d (%.0f%%) %.0f/s, eta %.0fs\n", p.verb, p.done, p.total, 100*float64(p.done)/float64(p.total), rate, eta)
	}
}

// printAbove prints a line to the progress writer without breaking the bar.
func (p *progress) printAbove(msg string) { p.printAboveTo(p.w, msg) }

func (p *progress) printAboveTo(w io.Writer, msg string) {
	if p.bar != nil {
		p.bar.Clear()
	}
	fmt.Fprintln(w, msg)
	if p.bar != nil {
		p.bar.RenderBlank()
	}
}

func (p *progress) finish() {
	if p.bar != nil {
		p.bar.Finish()
		p.bar.Clear()
	}
}

// errorLog prints the first failures of a long run and counts the rest, so
// that 40,000 namespaces failing for one cause make a screenful, not 40,000
// lines.
type errorLog struct {
	w             io.Writer // where to print while there is no progress display
	shown, hidden int
}

// errorsShown is how many failures a run prints one by one.
const errorsShown = 20

func (e *errorLog) print(p *progress, msg string) {
	if e.shown >= errorsShown {
		e.hidden++
		return
	}
	e.shown++
	if p == nil {
		fmt.Fprintln(e.w, msg)
		return
	}
	p.printAbove(msg)
}

// flush says how many failures were not printed, and where to see them:
// selection is what ls takes to list the same namespaces ("-f SPEC").
func (e *errorLog) flush(w io.Writer, verb, selection string) {
	if e.hidden > 0 {
		fmt.Fprintf(w, "%s: ... and %d more failures not shown (nsfleet ls %s lists every namespace's state)\n", verb, e.hidden, selection)
	}
}
