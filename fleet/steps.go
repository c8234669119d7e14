package fleet

import (
	"sync"
	"time"
)

// Step names, in the order a namespace is built.
const (
	StepUnshare = "unshare" // start a locked thread and unshare into a new namespace
	StepLo      = "lo"
	StepVeth    = "veth"
	StepSysctl  = "sysctl"
	StepRoute   = "route"
	StepBack    = "switch back"
	StepPin     = "pin"
)

// Steps lists the step names in build order.
var Steps = []string{StepUnshare, StepLo, StepVeth, StepSysctl, StepRoute, StepBack, StepPin}

// StepTimes accumulates, per mark, the wall time each creation step took,
// so that a slowdown can be traced to its step without a kernel tracer.
// It is safe for concurrent use.
type StepTimes struct {
	Mark int // namespaces per mark; 0: DefaultMark

	mu    sync.Mutex
	n     int
	cur   map[string]time.Duration
	marks []map[string]time.Duration
}

// PerMark returns, for each completed mark, the mean time of each step per
// namespace.
func (s *StepTimes) PerMark() []map[string]time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]map[string]time.Duration, len(s.marks))
	for i, m := range s.marks {
		out[i] = map[string]time.Duration{}
		for k, v := range m {
			out[i][k] = v / time.Duration(s.mark())
		}
	}
	return out
}

func (s *StepTimes) mark() int {
	if s.Mark <= 0 {
		return DefaultMark
	}
	return s.Mark
}

// stopwatch times the steps of one namespace.
type stopwatch struct {
	last  time.Time
	steps map[string]time.Duration
}

func newStopwatch(on bool) *stopwatch {
	if !on {
		return nil
	}
	return &stopwatch{last: time.Now(), steps: map[string]time.Duration{}}
}

func (w *stopwatch) lap(step string) {
	if w == nil {
		return
	}
	now := time.Now()
	w.steps[step] += now.Sub(w.last)
	w.last = now
}

func (s *StepTimes) add(w *stopwatch) {
	if s == nil || w == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		s.cur = map[string]time.Duration{}
	}
	for k, v := range w.steps {
		s.cur[k] += v
	}
	s.n++
	if s.n%s.mark() == 0 {
		s.marks = append(s.marks, s.cur)
		s.cur = nil
	}
}
