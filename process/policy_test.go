package process

import (
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/spec"
)

func TestPolicyDelayDoublesUpToTheCap(t *testing.T) {
	p := Policy{Backoff: time.Second, MaxBackoff: 10 * time.Second}
	want := []time.Duration{1, 2, 4, 8, 10, 10}
	for i, w := range want {
		if got := p.Delay(i); got != w*time.Second {
			t.Errorf("Delay(%d) = %v, want %v", i, got, w*time.Second)
		}
	}
	if got := p.Delay(1000); got != 10*time.Second {
		t.Errorf("Delay(1000) = %v: overflow must still give the cap", got)
	}
	if got := (Policy{Backoff: time.Minute, MaxBackoff: time.Second}).Delay(0); got != time.Minute {
		t.Errorf("a cap below the first delay: %v, want the first delay", got)
	}
}

func TestPolicyAfterExit(t *testing.T) {
	p := Policy{Backoff: time.Second, MaxBackoff: 8 * time.Second, ResetAfter: 30 * time.Second}
	quick := time.Second
	cases := []struct {
		name     string
		restart  string
		failures int
		exit     Exit
		want     Decision
	}{
		{"always, clean exit", spec.RestartAlways, 0, Exit{Ran: quick, Known: true}, Decision{true, time.Second, 1}},
		{"always, third quick exit", spec.RestartAlways, 2, Exit{Ran: quick, Known: true, Failed: true}, Decision{true, 4 * time.Second, 3}},
		{"always, capped", spec.RestartAlways, 9, Exit{Ran: quick, Known: true, Failed: true}, Decision{true, 8 * time.Second, 10}},
		{"always, ran long: back-off starts over", spec.RestartAlways, 9, Exit{Ran: time.Minute, Known: true}, Decision{true, time.Second, 1}},
		{"on-failure, clean exit stays down", spec.RestartOnFailure, 3, Exit{Ran: quick, Known: true}, Decision{false, 0, 3}},
		{"on-failure, failed", spec.RestartOnFailure, 0, Exit{Ran: quick, Known: true, Failed: true}, Decision{true, time.Second, 1}},
		{"on-failure, status unknown counts as failed", spec.RestartOnFailure, 1, Exit{Ran: quick}, Decision{true, 2 * time.Second, 2}},
		{"never", spec.RestartNever, 0, Exit{Ran: quick, Known: true, Failed: true}, Decision{false, 0, 0}},
	}
	for _, c := range cases {
		if got := p.AfterExit(c.restart, c.failures, c.exit); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// A failed start obeys the same cap as an exit (it once did not: a retry
// could be scheduled hours away).
func TestPolicyAfterStartFailureIsCapped(t *testing.T) {
	p := Policy{Backoff: time.Second, MaxBackoff: 5 * time.Second}
	f := 0
	var last Decision
	for i := 0; i < 40; i++ {
		last = p.AfterStartFailure(f)
		f = last.Failures
		if last.Delay > 5*time.Second || last.Delay <= 0 {
			t.Fatalf("start failure %d: delay %v", i, last.Delay)
		}
	}
	if last.Delay != 5*time.Second || !last.Restart {
		t.Fatalf("after 40 failures: %+v", last)
	}
}

func TestPolicyDefaults(t *testing.T) {
	var p Policy
	if p.Delay(0) != time.Second || p.Delay(20) != time.Minute {
		t.Fatalf("defaults: %v %v", p.Delay(0), p.Delay(20))
	}
}
