package cli

import (
	"fmt"
	"io"

	"github.com/nsfleet/nsfleet/internal/progress"
)

// errorLog prints the first failures of a long run and counts the rest, so
// that 40,000 namespaces failing for one cause make a screenful, not 40,000
// lines.
type errorLog struct {
	w             io.Writer // where to print while there is no progress display
	shown, hidden int
}

// errorsShown is how many failures a run prints one by one.
const errorsShown = 20

func (e *errorLog) print(p *progress.Display, msg string) {
	if e.shown >= errorsShown {
		e.hidden++
		return
	}
	e.shown++
	if p == nil {
		fmt.Fprintln(e.w, msg)
		return
	}
	p.PrintAbove(msg)
}

// flush says how many failures were not printed, and where to see them:
// selection is what ls takes to list the same namespaces ("-f SPEC").
func (e *errorLog) flush(w io.Writer, verb, selection string) {
	if e.hidden > 0 {
		fmt.Fprintf(w, "%s: ... and %d more failures not shown (nsfleet ls %s lists every namespace's state)\n", verb, e.hidden, selection)
	}
}
