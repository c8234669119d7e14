// Package fleet makes the machine match a spec (Up), tears fleets down in
// bulk (Down), and reports what exists (List).
//
// The kernel is the source of truth. nsfleet keeps no state file: a
// namespace is nsfleet's when its lo carries the Marker alias, a veth is a
// namespace's when its two ends point at each other across the host and
// that namespace. Up creates a namespace completely (lo, veths, sysctls,
// routes) before it pins it, so a crash at any point leaves either a
// finished, pinned namespace or nothing: the unpinned one dies with the
// process and takes its veths with it. The next Up repairs what drifted.
//
// Work is spread over bounded workers; each has its own host netlink socket
// and its own private procfs (see package sysctl). Namespace thread state is
// handled by package netns only.
package fleet

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/process"
	"github.com/nsfleet/nsfleet/spec"
)

// DefaultWorkers is used when Options.Workers is 0. Namespace creation is
// serialised in the kernel by rtnl_lock and the namespace list lock; past
// one worker per CPU the extra workers only wait (see docs/PERFORMANCE.md).
func DefaultWorkers() int { return runtime.NumCPU() }

// DefaultMark is the interval of the throughput marks (the 2014 report's).
const DefaultMark = 250

// Options are what Up, Down and List share; each takes them embedded in
// its own (UpOptions, DownOptions, ListOptions). The zero value means the
// defaults, except RunDir, which is required.
type Options struct {
	RunDir  *netns.RunDir
	Workers int          // 0: DefaultWorkers()
	Adopt   bool         // take over matching namespaces nsfleet did not make
	Log     *slog.Logger // step-level log; nil: discard
	// Store keeps the records and logs of supervised processes; nil means
	// process.StoreFor(RunDir).
	Store *process.Store
	// Grace is how long a supervised process gets after SIGTERM before
	// SIGKILL, when down removes it or up stops one its spec dropped; 0: 10 s.
	Grace time.Duration
	// OnProgress, if set, is told how far a long phase has come (Down:
	// "delete" per namespace, "wait" per host veth gone; Up: "links" per
	// link). It is called from one goroutine at a time.
	OnProgress func(phase string, done, total int)
	// OnResult, if set, is called once per namespace as it is finished,
	// from one goroutine at a time.
	OnResult func(Result)
}

// UpOptions are Up's.
type UpOptions struct {
	Options
	DryRun bool // plan only
	Mark   int  // throughput mark interval; 0: DefaultMark
	// Steps, if set, receives the time of each creation step.
	Steps *StepTimes
	// Previous, if set, says what a namespace was last made to match
	// (nil: unknown). Up then also takes away what that spec asked and
	// the new one does not (see Prune): the cluster's agent knows it; a
	// one-node `up` does not, and only adds and repairs.
	Previous func(name string) *spec.Namespace
	// Tunnel, if set, carries the links whose other end another node
	// serves (a cluster's agent sets it; see tunnel.go).
	Tunnel *Tunnel
}

// ListOptions are List's.
type ListOptions struct {
	Options
	// PinsOnly makes List report what the run dir shows (names, pins,
	// inodes) without entering any namespace: what an unprivileged user
	// can read.
	PinsOnly bool
	// OnStatus, if set, makes List hand each status over in order, from
	// one goroutine at a time, as soon as it and all before it are read,
	// and keep none: memory stays flat however large the fleet (List
	// then returns no statuses).
	OnStatus func(Status)
}

func (o *Options) workers(n int) int {
	w := o.Workers
	if w <= 0 {
		w = DefaultWorkers()
	}
	if w > n {
		w = n
	}
	if w < 1 {
		w = 1
	}
	return w
}

// withDefaults fills in the fields whose default depends on others; call
// it once, before workers share the options.
func (o Options) withDefaults() Options {
	if o.Store == nil && o.RunDir != nil {
		o.Store = process.StoreFor(o.RunDir)
	}
	return o
}

func (o *Options) store() *process.Store { return o.Store }

func (o *UpOptions) previous(name string) *spec.Namespace {
	if o.Previous == nil {
		return nil
	}
	return o.Previous(name)
}

func (o *Options) grace() time.Duration {
	if o.Grace <= 0 {
		return 10 * time.Second
	}
	return o.Grace
}

func (o *Options) log() *slog.Logger {
	if o.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Log
}

// Action is what happened to one namespace.
type Action string

const (
	Created   Action = "created"
	Repaired  Action = "repaired"
	Unchanged Action = "unchanged"
	Failed    Action = "failed"
	Skipped   Action = "skipped" // exists but is not nsfleet's
	Deleted   Action = "deleted"
	// Planned actions, for --dry-run.
	WouldCreate Action = "would create"
	WouldRepair Action = "would repair"
	WouldDelete Action = "would delete"
)

// Result is the outcome for one namespace.
type Result struct {
	Name   string
	Action Action
	Fixes  []string // what was (or would be) repaired, or created
	Err    error
}

// Summary totals a run.
type Summary struct {
	Total       int
	Counts      map[Action]int
	Elapsed     time.Duration
	Interrupted bool
	Errors      []error
	// Marks[k] is the time at which (k+1)*Mark namespaces were done.
	Mark  int
	Marks []time.Duration
}

// Rate returns namespaces finished per second over the whole run.
func (s *Summary) Rate() float64 {
	done := 0
	for _, n := range s.Counts {
		done += n
	}
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(done) / s.Elapsed.Seconds()
}

// MarkRates returns the rate within each mark interval.
func (s *Summary) MarkRates() []float64 {
	out := make([]float64, len(s.Marks))
	prev := time.Duration(0)
	for i, t := range s.Marks {
		if d := t - prev; d > 0 {
			out[i] = float64(s.Mark) / d.Seconds()
		}
		prev = t
	}
	return out
}

// Err returns a non-nil error when something failed or was interrupted.
func (s *Summary) Err() error {
	if s.Interrupted {
		return ErrInterrupted
	}
	if s.Counts[Failed] > 0 || s.Counts[Skipped] > 0 {
		return fmt.Errorf("%d failed, %d skipped", s.Counts[Failed], s.Counts[Skipped])
	}
	return nil
}

// ErrInterrupted is returned when the context was cancelled mid-way.
var ErrInterrupted = errors.New("interrupted")

// Error is a failure on one namespace: `up: bar-17: veth qro-17/qri-17: file exists`.
type Error struct {
	Op        string
	Namespace string
	Err       error
}

func (e *Error) Error() string { return e.Op + ": " + e.Namespace + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// ErrForeign is matched by errors.Is for namespaces nsfleet did not make.
var ErrForeign = errors.New("exists but was not made by nsfleet (no lo alias " + Marker + "); left alone, pass --adopt to take it over")

// tally collects results from workers.
type tally struct {
	mu    sync.Mutex
	start time.Time
	sum   Summary
	done  int
	cb    func(Result)
}

func newTally(total, mark int, cb func(Result)) *tally {
	if mark <= 0 {
		mark = DefaultMark
	}
	return &tally{start: time.Now(), cb: cb, sum: Summary{Total: total, Counts: map[Action]int{}, Mark: mark}}
}

func (t *tally) add(r Result) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sum.Counts[r.Action]++
	if r.Err != nil {
		t.sum.Errors = append(t.sum.Errors, r.Err)
	}
	t.done++
	if t.done%t.sum.Mark == 0 {
		t.sum.Marks = append(t.sum.Marks, time.Since(t.start))
	}
	if t.cb != nil {
		t.cb(r)
	}
}

func (t *tally) finish(interrupted bool) Summary {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sum.Elapsed = time.Since(t.start)
	t.sum.Interrupted = interrupted
	return t.sum
}
