package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/internal/nstest"
	"golang.org/x/sys/unix"
)

func procsOf(t *testing.T, runDir, spec string) map[string]fleet.ProcStatus {
	t.Helper()
	_, out, errs := run("--run-dir", runDir, "ls", "-f", spec, "-o", "json")
	var st []fleet.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("ls json: %v\n%s\n%s", err, out, errs)
	}
	m := map[string]fleet.ProcStatus{}
	for _, s := range st {
		for _, p := range s.Procs {
			m[s.Name+"/"+p.Name] = p
		}
	}
	return m
}

// inNamespace lists the PIDs of processes whose network namespace is the
// one pinned at pin.
func inNamespace(t *testing.T, pin string) []int {
	var st unix.Stat_t
	if err := unix.Stat(pin, &st); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var ps unix.Stat_t
		if unix.Stat("/proc/"+e.Name()+"/ns/net", &ps) == nil && ps.Ino == st.Ino {
			if b, _ := os.ReadFile("/proc/" + e.Name() + "/stat"); !strings.Contains(string(b), ") Z ") {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

func waitFor(t *testing.T, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestSupervision(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	spec := filepath.Join(t.TempDir(), "procs.yaml")
	os.WriteFile(spec, []byte(fmt.Sprintf(`namespaces:
  - name: "%[1]sd{i}"
    count: 2
    processes:
      - name: sleeper
        command: ["sh", "-c", "echo started in {name}; exec sleep 1000"]
        restart: always
      - name: once
        command: ["sh", "-c", "sleep 0.2; exit 0"]
        restart: on-failure
`, p)), 0o644)
	t.Cleanup(func() { run("--run-dir", rd.Path, "down", "-f", spec, "--grace", "1s") })
	if code, out, errs := run("--run-dir", rd.Path, "up", "-f", spec, "--progress", "none"); code != 0 {
		t.Fatalf("up: %s %s", out, errs)
	}
	ps := procsOf(t, rd.Path, spec)
	first := ps[p+"d1/sleeper"]
	if first.State != "running" || first.PID == 0 {
		t.Fatalf("after up: %+v", ps)
	}
	if pids := inNamespace(t, rd.PinPath(p+"d1")); len(pids) < 1 {
		t.Fatalf("no process runs inside %sd1", p)
	}

	sup := child("--run-dir", rd.Path, "supervise", "-f", spec, "--backoff", "300ms", "--tick", "100ms")
	if err := sup.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Process.Kill(); sup.Wait() })

	// Killed with SIGKILL, the daemon comes back, after the back-off.
	killed := time.Now()
	syscall.Kill(first.PID, syscall.SIGKILL)
	var again fleet.ProcStatus
	waitFor(t, "the restart", 10*time.Second, func() bool {
		again = procsOf(t, rd.Path, spec)[p+"d1/sleeper"]
		return again.State == "running" && again.PID != first.PID
	})
	if again.Restarts != 1 || time.Since(killed) < 300*time.Millisecond {
		t.Fatalf("restart: %+v after %v", again, time.Since(killed))
	}
	logb, _ := os.ReadFile(again.Log)
	if strings.Count(string(logb), "\nstarted in "+p+"d1\n") != 2 {
		t.Fatalf("log %s:\n%s", again.Log, logb)
	}
	// on-failure: started by up (exit status unknown to the supervisor),
	// so restarted once; then it exits 0 as the supervisor's child and
	// stays down.
	waitFor(t, "the one-shot to settle", 10*time.Second, func() bool {
		o := procsOf(t, rd.Path, spec)[p+"d2/once"]
		return o.State == "exited" && o.Restarts == 1
	})

	// The supervisor dies; a new one adopts instead of duplicating.
	sup.Process.Signal(syscall.SIGKILL)
	sup.Wait()
	sup2 := child("--run-dir", rd.Path, "supervise", "-f", spec, "--backoff", "300ms", "--tick", "100ms")
	var sup2err strings.Builder
	sup2.Stderr = &sup2err
	if err := sup2.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup2.Process.Kill(); sup2.Wait() })
	time.Sleep(1 * time.Second)
	for _, ns := range []string{p + "d1", p + "d2"} {
		if pids := inNamespace(t, rd.PinPath(ns)); len(pids) != 1 {
			t.Errorf("%s: %d processes inside (%v), want exactly one sleeper", ns, len(pids), pids)
		}
	}
	if now := procsOf(t, rd.Path, spec)[p+"d1/sleeper"]; now.PID != again.PID {
		t.Errorf("sleeper restarted by the new supervisor (%d -> %d), want adopted", again.PID, now.PID)
	}

	// down stops them (the supervisor does not bring them back) and
	// leaves no process behind.
	pins := []string{rd.PinPath(p + "d1"), rd.PinPath(p + "d2")}
	var pids []int
	for _, pin := range pins {
		pids = append(pids, inNamespace(t, pin)...)
	}
	if code, out, errs := run("--run-dir", rd.Path, "down", "-f", spec, "--grace", "2s"); code != 0 {
		t.Fatalf("down: %s %s", out, errs)
	}
	time.Sleep(500 * time.Millisecond)
	for _, pid := range pids {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && !strings.Contains(string(b), ") Z ") {
			t.Errorf("pid %d still alive after down: %s", pid, b)
		}
	}
	sup2.Process.Signal(syscall.SIGTERM)
	sup2.Wait()
	if !strings.Contains(sup2err.String(), "adopted") {
		t.Errorf("second supervisor log:\n%s", sup2err.String())
	}
}
