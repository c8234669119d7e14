// Package doctor checks a machine for the traps that make network
// namespaces slow or leaky, each learnt the hard way in one of the source
// reports (docs/BACKGROUND.md): pins that propagate into every mount namespace,
// stale and double pins, mount and namespace limits, the /proc/sys lookup
// trap, RCU and neighbour-table settings, bridges near their port limit.
//
// Every check reads the kernel's state (mountinfo, /proc, netlink, sysctls,
// the kernel config) and returns findings with a severity, the evidence and
// advice a person can act on. Fix repairs only what is provably nsfleet's.
//
// Checks that need a namespace of their own (the sysctl timing) make it
// through package netns; nothing else here changes thread state.
package doctor

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/netns"
)

// Severity orders findings. The exit code of `nsfleet doctor` is that of
// the worst one (see ExitCode).
type Severity int

const (
	OK Severity = iota
	Info
	Warn
	Fail
)

func (s Severity) String() string {
	return [...]string{"ok", "info", "warn", "fail"}[s]
}

// MarshalText makes JSON show "warn" rather than 2.
func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// ExitCode maps the worst severity to an exit code, as monitoring plugins
// do: 0 for ok and info, 1 for warn, 2 for fail.
func ExitCode(worst Severity) int {
	switch worst {
	case Warn:
		return 1
	case Fail:
		return 3 // not 2: nsfleet's usage error
	}
	return 0
}

// Finding is one result of one check.
type Finding struct {
	Check    string   `json:"check"`
	Severity Severity `json:"severity"`
	Summary  string   `json:"summary"`
	Evidence []string `json:"evidence,omitempty"`
	Advice   string   `json:"advice,omitempty"`
	Source   string   `json:"source,omitempty"` // the report it comes from
}

// Options tune Run. The zero value checks /run/netns with the defaults.
type Options struct {
	RunDir *netns.RunDir // nil: /run/netns (which need not exist)
	// Neighbours is the host-side veth count above which gc_thresh3 is
	// judged; 0 means the count found on the machine.
	Neighbours int
}

// Report is every finding of one run.
type Report struct {
	Findings []Finding    `json:"findings"`
	Elapsed  Duration     `json:"elapsed"`
	Fixed    []string     `json:"fixed,omitempty"`
	Env      *Environment `json:"-"`
}

// Duration prints as seconds in JSON.
type Duration time.Duration

func (d Duration) MarshalText() ([]byte, error) {
	return []byte(fmt.Sprintf("%.3fs", time.Duration(d).Seconds())), nil
}

// Worst returns the highest severity found.
func (r *Report) Worst() Severity {
	w := OK
	for _, f := range r.Findings {
		w = max(w, f.Severity)
	}
	return w
}

// Find returns the findings of one check.
func (r *Report) Find(check string) []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Check == check {
			out = append(out, f)
		}
	}
	return out
}

// Check names.
const (
	CheckRunDir   = "run dir"
	CheckPins     = "pins"
	CheckMounts   = "mount load"
	CheckHeadroom = "namespace headroom"
	CheckSysctl   = "sysctl lookups"
	CheckKernel   = "kernel config"
	CheckNeigh    = "neighbour table"
	CheckBridges  = "bridges"
)

// Run gathers the machine's state once and runs every check on it.
func Run(ctx context.Context, opts Options) (*Report, error) {
	start := time.Now()
	env, err := Gather(opts)
	if err != nil {
		return nil, err
	}
	r := &Report{Env: env}
	for _, check := range []func(*Environment) []Finding{
		checkRunDir, checkPins, checkMounts, checkHeadroom, checkSysctl, checkKernel, checkNeigh, checkBridges,
	} {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		r.Findings = append(r.Findings, check(env)...)
	}
	r.Elapsed = Duration(time.Since(start))
	return r, nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

func list(items []string, most int) string {
	if len(items) <= most {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:most], ", ") + fmt.Sprintf(" and %d more", len(items)-most)
}
