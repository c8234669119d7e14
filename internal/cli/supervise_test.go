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
	"github.com/nsfleet/nsfleet/internal/exitcode"
	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/process"
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

func waitUntil(timeout time.Duration, ok func() bool) bool {
	for deadline := time.Now().Add(timeout); !ok(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
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
	// The restarted daemon writes its line after it is seen running.
	var logb []byte
	waitFor(t, "the restarted daemon's line in its log", 5*time.Second, func() bool {
		logb, _ = os.ReadFile(again.Log)
		return strings.Count(string(logb), "\nstarted in "+p+"d1\n") >= 2
	})
	if n := strings.Count(string(logb), "\nstarted in "+p+"d1\n"); n != 2 {
		t.Fatalf("log %s (%d starts):\n%s", again.Log, n, logb)
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

// procStatus reads fields of /proc/PID/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func TestProcessPrivileges(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	spec := filepath.Join(t.TempDir(), "privs.yaml")
	os.WriteFile(spec, []byte(fmt.Sprintf(`namespaces:
  - name: "%[1]spriv"
    processes:
      - name: plain
        command: ["sleep", "1000"]
      - name: nobody
        command: ["sleep", "1000"]
        user: nobody
        capabilities: [net_bind_service]
        no_new_privs: true
      - name: rootnet
        command: ["sleep", "1000"]
        capabilities: [CAP_NET_ADMIN]
      - name: numeric
        command: ["sleep", "1000"]
        user: "4242"
        capabilities: []
`, p)), 0o644)
	t.Cleanup(func() { run("--run-dir", rd.Path, "down", "-f", spec, "--grace", "1s") })
	if code, out, errs := run("--run-dir", rd.Path, "up", "-f", spec, "--progress", "none"); code != 0 {
		t.Fatalf("up: %s %s", out, errs)
	}
	ps := procsOf(t, rd.Path, spec)
	// By default a process has what nsfleet has (whatever this host gives
	// root: some take capabilities away).
	own := procStatus(t, os.Getpid())
	want := map[string]map[string]string{
		"plain":   {"Uid": "0\t0\t0\t0", "CapEff": own["CapEff"], "CapBnd": own["CapBnd"], "NoNewPrivs": own["NoNewPrivs"]},
		"nobody":  {"Uid": "65534\t65534\t65534\t65534", "Gid": "65534\t65534\t65534\t65534", "CapEff": "0000000000000400", "CapPrm": "0000000000000400", "CapBnd": "0000000000000400", "CapAmb": "0000000000000400", "NoNewPrivs": "1"},
		"rootnet": {"Uid": "0\t0\t0\t0", "CapEff": "0000000000001000", "CapBnd": "0000000000001000", "NoNewPrivs": "0"},
		"numeric": {"Uid": "4242\t4242\t4242\t4242", "Gid": "4242\t4242\t4242\t4242", "Groups": "", "CapEff": "0000000000000000", "CapBnd": "0000000000000000"},
	}
	for name, fields := range want {
		st := ps[p+"priv/"+name]
		if st.State != "running" {
			t.Fatalf("%s: %+v", name, st)
		}
		// The helper execs the command once it has dropped what it must.
		var got map[string]string
		waitFor(t, name+" to exec sleep", 10*time.Second, func() bool {
			got = procStatus(t, st.PID)
			return got["Name"] == "sleep"
		})
		for k, v := range fields {
			if got[k] != v {
				t.Errorf("%s: %s = %q, want %q", name, k, got[k], v)
			}
		}
	}
}

func TestProcessPrivilegesRefusedInSpec(t *testing.T) {
	for _, bad := range []string{
		"capabilities: [net_magic]",
		"user: \"a:b\"",
		"log_max: 10parsecs",
		"log_max: 100",
		"log_keep: 0",
	} {
		dir := t.TempDir()
		spec := filepath.Join(dir, "s.yaml")
		os.WriteFile(spec, []byte("namespaces:\n  - name: x\n    processes:\n      - name: d\n        command: [sleep, \"1\"]\n        "+bad+"\n"), 0o644)
		code, _, errs := run("--run-dir", filepath.Join(dir, "netns"), "up", "-f", spec)
		if code != exitcode.Usage && code != exitcode.Failed || !strings.Contains(errs, "s.yaml:") {
			t.Errorf("%s: code %d, %q; want a refusal naming the file and line", bad, code, errs)
		}
	}
}

// The supervisor learns of an exit from the process's pidfd, not from its
// tick: with a one-minute tick the restart still comes after the back-off.
func TestSuperviseSeesExitsAtOnceAndRotatesLogs(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	spec := filepath.Join(t.TempDir(), "procs.yaml")
	os.WriteFile(spec, []byte(fmt.Sprintf(`namespaces:
  - name: "%[1]sx"
    processes:
      - name: sleeper
        command: ["sleep", "1000"]
        restart: always
      - name: chatty
        command: ["sh", "-c", "while :; do echo 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef; sleep 0.002; done"]
        restart: always
        log_max: 4KiB
        log_keep: 2
`, p)), 0o644)
	t.Cleanup(func() { run("--run-dir", rd.Path, "down", "-f", spec, "--grace", "1s") })
	if code, out, errs := run("--run-dir", rd.Path, "up", "-f", spec, "--progress", "none"); code != 0 {
		t.Fatalf("up: %s %s", out, errs)
	}
	sup := child("--run-dir", rd.Path, "supervise", "-f", spec, "--backoff", "100ms", "--tick", "1m")
	var supErr strings.Builder
	sup.Stderr = &supErr
	if err := sup.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Process.Kill(); sup.Wait() })
	var first fleet.ProcStatus
	waitFor(t, "the first start", 10*time.Second, func() bool {
		first = procsOf(t, rd.Path, spec)[p+"x/sleeper"]
		return first.State == "running"
	})
	killed := time.Now()
	syscall.Kill(first.PID, syscall.SIGKILL)
	waitFor(t, "the restart", 5*time.Second, func() bool {
		again := procsOf(t, rd.Path, spec)[p+"x/sleeper"]
		return again.State == "running" && again.PID != first.PID
	})
	if d := time.Since(killed); d > 3*time.Second {
		t.Errorf("restart took %v with a 1m tick: the exit was not seen by pidfd", d)
	}
	// The rotation runs with the loop; one more exit wakes it.
	log := rd.Path + "/../.nsfleet-" + filepath.Base(rd.Path) + "/logs/" + p + "x/chatty.log"
	waitFor(t, "a rotated log", 10*time.Second, func() bool {
		if _, err := os.Stat(log + ".1"); err == nil {
			return true
		}
		if st := procsOf(t, rd.Path, spec)[p+"x/sleeper"]; st.PID > 0 {
			syscall.Kill(st.PID, syscall.SIGKILL)
		}
		time.Sleep(300 * time.Millisecond)
		return false
	})
	for _, f := range []string{log, log + ".1"} {
		if fi, err := os.Stat(f); err != nil || fi.Size() > 64<<10 {
			t.Errorf("%s: %v, size %d; want well under control", f, err, fi.Size())
		}
	}
	if !strings.Contains(supErr.String(), `status="killed by SIGKILL"`) {
		t.Errorf("the supervisor did not report the exit status of its child:\n%s", supErr.String())
	}
}

// TestProcessConfigFile: a process's config is written per namespace where
// {config} names it, readable by a daemon that is not root; a changed
// config restarts the daemon with the new file; down removes the file.
func TestProcessConfigFile(t *testing.T) {
	rd := nstest.RunDir(t)
	// The daemon runs as nobody: let it pass through the test's own
	// temporary directories to the store, as it can through /run.
	for d := filepath.Dir(rd.Path); d != "/"; d = filepath.Dir(d) {
		if st, err := os.Stat(d); err == nil && st.Mode().Perm()&0o001 == 0 {
			os.Chmod(d, st.Mode().Perm()|0o011)
		}
	}
	p := nstest.Prefix(t)
	spec := filepath.Join(t.TempDir(), "cfg.yaml")
	write := func(version int) {
		os.WriteFile(spec, []byte(fmt.Sprintf(`namespaces:
  - name: "%[1]scfg{i}"
    count: 2
    loopback_addresses: ["10.255.9.{i}/32"]
    processes:
      - name: d
        user: nobody
        command: [sh, -c, 'cat "$0"; exec sleep 1000', "{config}"]
        config: |
          router id {loopback} of {name};
          block { kept } version %[2]d
`, p, version)), 0o644)
	}
	write(1)
	t.Cleanup(func() { run("--run-dir", rd.Path, "down", "-f", spec, "--grace", "1s") })
	if code, out, errs := run("--run-dir", rd.Path, "up", "-f", spec, "--progress", "none"); code != 0 {
		t.Fatalf("up: %s %s", out, errs)
	}
	store := process.StoreFor(rd)
	ns := p + "cfg2"
	logHas := func(s string) func() bool {
		return func() bool { b, _ := os.ReadFile(store.LogPath(ns, "d")); return strings.Contains(string(b), s) }
	}
	if !waitUntil(10*time.Second, logHas("router id 10.255.9.2 of "+ns+";\nblock { kept } version 1\n")) {
		b, _ := os.ReadFile(store.LogPath(ns, "d"))
		t.Fatalf("the daemon did not print its config; its log:\n%s", b)
	}
	first := procsOf(t, rd.Path, spec)[ns+"/d"].PID

	write(2)
	if code, out, errs := run("--run-dir", rd.Path, "up", "-f", spec, "--progress", "none"); code != 0 {
		t.Fatalf("second up: %s %s", out, errs)
	}
	waitFor(t, "the daemon to print its new config", 10*time.Second, logHas("block { kept } version 2\n"))
	if now := procsOf(t, rd.Path, spec)[ns+"/d"].PID; now == first || now == 0 {
		t.Fatalf("daemon not restarted on a config change: pid %d, before %d", now, first)
	}
	if code, out, errs := run("--run-dir", rd.Path, "down", "-f", spec, "--grace", "1s", "--progress", "none"); code != 0 {
		t.Fatalf("down: %s %s", out, errs)
	}
	if _, err := os.Stat(store.ConfigPath(ns, "d")); !os.IsNotExist(err) {
		t.Fatalf("config left after down: %v", err)
	}
}
