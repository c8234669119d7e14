package proc

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
