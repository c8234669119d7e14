package process

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// A launch cut short between the start and the record (nsfleet killed) is
// recovered by the process's marker: the next Load adopts it, so it is
// never started twice.
func TestLoadRecoversACutShortLaunch(t *testing.T) {
	s := &Store{Dir: t.TempDir()}
	if err := s.Save(&Record{Namespace: "ns1", Name: "d", Launching: true, Started: time.Now()}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "30")
	cmd.Env = append(os.Environ(), s.marker("ns1", "d"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	r, err := s.Load("ns1", "d")
	if err != nil || r == nil || r.PID != cmd.Process.Pid || r.Launching || !Alive(r) {
		t.Fatalf("recovered %+v, %v; want pid %d alive", r, err, cmd.Process.Pid)
	}
	// The same marker in another store is not ours.
	other := &Store{Dir: t.TempDir()}
	other.Save(&Record{Namespace: "ns1", Name: "d", Launching: true})
	if r, _ := other.Load("ns1", "d"); r.PID != 0 || r.Launching {
		t.Fatalf("another store adopted it: %+v", r)
	}
	// Nothing found: not running, and recorded as such.
	s.Save(&Record{Namespace: "ns2", Name: "d", Launching: true})
	if r, _ := s.Load("ns2", "d"); r.PID != 0 || r.Launching || Alive(r) {
		t.Fatalf("nothing to recover: %+v", r)
	}
}

// A reader meeting a launch in progress leaves the launcher's record alone.
func TestRecordsDoNotRewriteALaunch(t *testing.T) {
	s := &Store{Dir: t.TempDir()}
	if err := s.Save(&Record{Namespace: "ns1", Name: "d", Launching: true, Started: time.Now()}); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(s.recordPath("ns1", "d"))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := s.Records("ns1")
	if err != nil || len(recs) != 1 || recs[0].PID != 0 || Alive(recs[0]) {
		t.Fatalf("Records = %+v, %v; want the launch, not running yet", recs, err)
	}
	after, err := os.ReadFile(s.recordPath("ns1", "d"))
	if err != nil || string(after) != string(before) {
		t.Fatalf("Records rewrote the launcher's record:\n%s\nwas\n%s", after, before)
	}
}

// A launch whose launcher still runs is in progress, not cut short: even
// the supervisor (which saves what it recovers) leaves it alone, so that
// it never starts the process a second time while the launcher (up, or
// the agent's engine after a spec change) is starting it. Found by the
// day-two journey: a daemon whose command changed ran twice.
func TestLaunchInProgressIsLeftAlone(t *testing.T) {
	s := &Store{Dir: t.TempDir()}
	self := os.Getpid()
	start, _, err := procStart(self)
	if err != nil {
		t.Fatal(err)
	}
	s.Save(&Record{Namespace: "ns1", Name: "d", Launching: true, Launcher: self, LauncherStart: start})
	before, _ := os.ReadFile(s.recordPath("ns1", "d"))
	r, err := s.Load("ns1", "d") // the supervisor's load: it saves recoveries
	if err != nil || r == nil || !r.Launching || Alive(r) {
		t.Fatalf("Load = %+v, %v; want the launch in progress", r, err)
	}
	if after, _ := os.ReadFile(s.recordPath("ns1", "d")); string(after) != string(before) {
		t.Fatalf("Load rewrote a launch in progress:\n%s\nwas\n%s", after, before)
	}
	// A launcher that is gone (same PID, another start time): cut short.
	s.Save(&Record{Namespace: "ns1", Name: "d", Launching: true, Launcher: self, LauncherStart: start + 1})
	if r, _ := s.Load("ns1", "d"); r.Launching {
		t.Fatalf("a launch whose launcher is gone was left as in progress: %+v", r)
	}
}
