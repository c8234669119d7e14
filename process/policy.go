package process

import (
	"time"

	"github.com/nsfleet/nsfleet/spec"
)

// Policy is the supervisor's restart arithmetic, kept apart from processes
// and clocks so that it can be read and tested on its own. The zero value
// means the defaults.
type Policy struct {
	Backoff    time.Duration // first restart delay; 0: 1 s
	MaxBackoff time.Duration // no delay is longer; 0: 60 s
	// A process that ran at least this long before it exited starts its
	// back-off over; 0: 30 s.
	ResetAfter time.Duration
}

func (p Policy) withDefaults() Policy {
	if p.Backoff <= 0 {
		p.Backoff = time.Second
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = time.Minute
	}
	if p.MaxBackoff < p.Backoff {
		p.MaxBackoff = p.Backoff
	}
	if p.ResetAfter <= 0 {
		p.ResetAfter = 30 * time.Second
	}
	return p
}

// Delay is the wait before the next start after failures consecutive
// failures (quick exits or failed starts): Backoff doubled each time,
// never more than MaxBackoff.
func (p Policy) Delay(failures int) time.Duration {
	p = p.withDefaults()
	d := p.Backoff << min(max(failures, 0), 30)
	if d <= 0 || d > p.MaxBackoff {
		return p.MaxBackoff
	}
	return d
}

// Exit is what the supervisor knows about one exit.
type Exit struct {
	Ran    time.Duration // how long the process ran
	Known  bool          // the status is known (the supervisor's own child)
	Failed bool          // exited non-zero or by a signal (when Known)
}

// Decision is what to do after an exit or a failed start.
type Decision struct {
	Restart  bool
	Delay    time.Duration
	Failures int // the count to carry into the next decision
}

// AfterExit decides whether a process that exited is started again, when,
// and what its failure count becomes. An exit whose status is unknown (a
// process adopted from an earlier run) counts as a failure: on-failure
// then restarts it, which is the safe side for a daemon.
func (p Policy) AfterExit(restart string, failures int, e Exit) Decision {
	p = p.withDefaults()
	failed := !e.Known || e.Failed
	switch restart {
	case spec.RestartNever:
		return Decision{Failures: failures}
	case spec.RestartOnFailure:
		if !failed {
			return Decision{Failures: failures}
		}
	}
	if e.Ran >= p.ResetAfter {
		failures = 0
	}
	return Decision{Restart: true, Delay: p.Delay(failures), Failures: failures + 1}
}

// AfterStartFailure decides when to try again after a start that failed
// (namespace gone, command missing, no descriptors): the same capped
// back-off as after a quick exit.
func (p Policy) AfterStartFailure(failures int) Decision {
	return Decision{Restart: true, Delay: p.Delay(failures), Failures: failures + 1}
}
