package cli

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/internal/exitcode"
	"github.com/nsfleet/nsfleet/internal/nstest"
	"golang.org/x/sys/unix"
)

// fleetOf brings up count plain namespaces named PREFIXn-{i} in rd.
func fleetOf(t *testing.T, runDir, p string, count int) string {
	t.Helper()
	spec := filepath.Join(t.TempDir(), "ns.yaml")
	os.WriteFile(spec, []byte(fmt.Sprintf("namespaces:\n  - name: \"%sn-{i}\"\n    count: %d\n", p, count)), 0o644)
	if code, out, errs := run("--run-dir", runDir, "up", "-f", spec, "--progress", "none"); code != 0 {
		t.Fatalf("up: %d %s %s", code, out, errs)
	}
	t.Cleanup(func() { run("--run-dir", runDir, "down", "-f", spec, "--progress", "none") })
	return spec
}

func TestExecPassesThrough(t *testing.T) {
	for _, path := range []string{"fastexec", "go"} {
		t.Run(path, func(t *testing.T) {
			if path == "go" {
				t.Setenv("NSFLEET_NO_FASTEXEC", "1")
			}
			testExecPassesThrough(t)
		})
	}
}

func testExecPassesThrough(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	fleetOf(t, rd.Path, p, 1)
	name := p + "n-1"
	var st unix.Stat_t
	if err := unix.Stat(rd.PinPath(name), &st); err != nil {
		t.Fatal(err)
	}
	// In the namespace, with stdin passed and only fds 0-2 open.
	// Each fd of the shell with what it is: the shell's own pipes (a
	// pipeline, a command substitution) and the directory its glob reads
	// come and go while it runs and are not nsfleet's.
	cmd := child("--run-dir", rd.Path, "exec", name, "--", "sh", "-c", "readlink /proc/self/ns/net; cat; out=; for f in /proc/$$/fd/*; do out=\"$out ${f##*/}=$(readlink $f)\"; done; echo $out; exit 7")
	cmd.Stdin = strings.NewReader("hello from stdin\n")
	out, err := cmd.Output()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 7 {
		t.Fatalf("exit: %v, want 7; output %q", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 {
		t.Fatalf("output %q", out)
	}
	if want := fmt.Sprintf("net:[%d]", st.Ino); lines[0] != want {
		t.Errorf("ran in %s, want %s", lines[0], want)
	}
	if lines[1] != "hello from stdin" {
		t.Errorf("stdin: %q", lines[1])
	}
	// Only 0-2, and what this test binary itself inherited without
	// close-on-exec (a wrapper passes those on, as ip netns exec does).
	inherited := inheritedFDs(t)
	for _, entry := range strings.Fields(lines[2]) {
		fd, target, _ := strings.Cut(entry, "=")
		if fd == "0" || fd == "1" || fd == "2" || inherited[fd] || strings.HasPrefix(target, "pipe:") || strings.HasPrefix(target, "/proc/") {
			continue
		}
		t.Errorf("fd %s (%s) of nsfleet leaked into the command (fds %s)", fd, target, lines[2])
	}
	// A command that does not exist: a clear error, not a hang or a crash.
	code, _, errs := run("--run-dir", rd.Path, "exec", name, "--", "no-such-command-"+p)
	if code != exitcode.Failed || !strings.Contains(errs, "executable file not found") {
		t.Errorf("missing command: code %d, %q", code, errs)
	}
	// No mount namespace was made.
	cmd = child("--run-dir", rd.Path, "exec", name, "--", "readlink", "/proc/self/ns/mnt")
	out, err = cmd.Output()
	self, _ := os.Readlink("/proc/self/ns/mnt")
	if err != nil || strings.TrimSpace(string(out)) != self {
		t.Errorf("mount namespace %q (%v), want ours %q", out, err, self)
	}
}

// inheritedFDs lists this process's descriptors above 2 that lack
// close-on-exec: those came from whoever started the tests.
func inheritedFDs(t *testing.T) map[string]bool {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range ents {
		var fd int
		if _, err := fmt.Sscan(e.Name(), &fd); err != nil || fd < 3 {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			out[e.Name()] = true
		}
	}
	return out
}

func TestExecSignals(t *testing.T) {
	for _, path := range []string{"fastexec", "go"} {
		t.Run(path, func(t *testing.T) {
			if path == "go" {
				t.Setenv("NSFLEET_NO_FASTEXEC", "1")
			}
			testExecSignals(t)
		})
	}
}

func testExecSignals(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	fleetOf(t, rd.Path, p, 1)
	cmd := child("--run-dir", rd.Path, "exec", p+"n-1", "--", "sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	ee, ok := err.(*exec.ExitError)
	if !ok {
		t.Fatalf("exit %v, want death by SIGTERM", err)
	}
	if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("exit %v, want death by SIGTERM", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("the command did not get the signal")
	}
}

func TestExecAll(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	fleetOf(t, rd.Path, p, 5)
	var out, errb bytes.Buffer
	// Each command must run in its own namespace: it prints the inode of
	// the namespace it runs in, which must be its pin's. (Nothing is
	// assumed of the host's settings: what a new namespace inherits, such
	// as ip_forward, depends on them.)
	code := Run(t.Context(), []string{"--run-dir", rd.Path, "exec", "--all", "--prefix", p, "--", "sh", "-c", "stat -L -c %i /proc/self/ns/net"}, &out, &errb)
	if code != 0 {
		t.Fatalf("code %d\n%s\n%s", code, out.String(), errb.String())
	}
	pins, err := rd.List()
	if err != nil || len(pins) != 5 {
		t.Fatalf("pins %v, %v", pins, err)
	}
	for _, pin := range pins {
		if want := fmt.Sprintf("%s: %d\n", pin.Name, pin.Inode); !strings.Contains(out.String(), want) {
			t.Errorf("no line %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(errb.String(), "exec: 5 namespaces: 5 exited 0") {
		t.Errorf("summary: %s", errb.String())
	}
	out.Reset()
	errb.Reset()
	code = Run(t.Context(), []string{"--run-dir", rd.Path, "exec", "--all", "--prefix", p, "--", "sh", "-c", "case $(cat /proc/self/ns/../ns/net 2>/dev/null; hostname) in *) exit 3;; esac"}, &out, &errb)
	if code != exitcode.Failed || !strings.Contains(errb.String(), "5 exited 3") {
		t.Errorf("code %d, %s", code, errb.String())
	}
}

// TestExecMountNSMatchesIproute2 compares --mount-ns with `ip netns exec` in
// the real /run/netns: the same /sys/class/net, the same /etc/netns binds,
// the same exit codes.
func TestExecMountNSMatchesIproute2(t *testing.T) {
	for _, path := range []string{"fastexec", "go"} {
		t.Run(path, func(t *testing.T) {
			if path == "go" {
				t.Setenv("NSFLEET_NO_FASTEXEC", "1")
			}
			testExecMountNS(t)
		})
	}
}

func testExecMountNS(t *testing.T) {
	nstest.SystemRunDir(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip(8) not installed")
	}
	p := nstest.Prefix(t)
	spec := filepath.Join(t.TempDir(), "s.yaml")
	os.WriteFile(spec, []byte(fmt.Sprintf("namespaces:\n  - name: %[1]sm\n    veths: [{host: %[1]sh, peer: eth7}]\n", p)), 0o644)
	t.Cleanup(func() {
		run("down", "-f", spec, "--progress", "none")
		nstest.DeleteHostLinks(t, p)
	})
	if code, out, errs := run("up", "-f", spec, "--progress", "none"); code != 0 {
		t.Fatalf("up: %s %s", out, errs)
	}
	// A per-namespace /etc file, as iproute2 documents (made by us, removed after).
	etc := filepath.Join("/etc/netns", p+"m")
	_, err := os.Stat("/etc/netns")
	madeEtcNetns := err != nil
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.RemoveAll(etc)
		if madeEtcNetns {
			os.Remove("/etc/netns")
		}
	})
	os.WriteFile(filepath.Join(etc, "hostname"), []byte("inside-"+p+"\n"), 0o644)
	script := "ls /sys/class/net | tr '\\n' ' '; echo; cat /etc/hostname; exit 3"
	ipCmd := exec.Command("ip", "netns", "exec", p+"m", "sh", "-c", script)
	ipOut, ipErr := ipCmd.Output()
	nsCmd := child("exec", "--mount-ns", p+"m", "--", "sh", "-c", script)
	nsOut, nsErr := nsCmd.Output()
	if string(ipOut) != string(nsOut) {
		t.Errorf("output differs:\nip netns exec:       %q\nnsfleet --mount-ns: %q", ipOut, nsOut)
	}
	if !strings.Contains(string(nsOut), "eth7") || !strings.Contains(string(nsOut), "inside-"+p) {
		t.Errorf("--mount-ns output lacks the namespace's view: %q", nsOut)
	}
	ipCode, nsCode := -1, -2
	if ee, ok := ipErr.(*exec.ExitError); ok {
		ipCode = ee.ExitCode()
	}
	if ee, ok := nsErr.(*exec.ExitError); ok {
		nsCode = ee.ExitCode()
	}
	if ipCode != 3 || nsCode != 3 {
		t.Errorf("exit codes: ip %d, nsfleet %d, want 3", ipCode, nsCode)
	}
	// The host's /sys and /etc are untouched.
	if b, _ := os.ReadFile("/etc/hostname"); strings.Contains(string(b), "inside-") {
		t.Fatal("the helper's bind leaked to the host")
	}
}

// Every spelling of `exec NAME CMD` takes the C fast path: the command is
// exec'd before the Go runtime starts, so Go's init trace (GODEBUG) never
// prints. Spellings the fast path leaves to Go still work.
func TestExecFastPathSpellings(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	fleetOf(t, rd.Path, p, 1)
	name := p + "n-1"
	var st unix.Stat_t
	if err := unix.Stat(rd.PinPath(name), &st); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("net:[%d]", st.Ino)
	cmdline := []string{"readlink", "/proc/self/ns/net"}
	for _, c := range []struct {
		args []string
		fast bool
	}{
		{append([]string{"--run-dir", rd.Path, "exec", name, "--"}, cmdline...), true},
		{append([]string{"--run-dir", rd.Path, "exec", name}, cmdline...), true},
		{append([]string{"--run-dir=" + rd.Path, "exec", name}, cmdline...), true},
		{append([]string{"-v", "--run-dir", rd.Path, "--wait-lock", "-w", "3", "exec", name, "--"}, cmdline...), true},
		{append([]string{"exec", "--run-dir", rd.Path, name, "--"}, cmdline...), true},
		{append([]string{"exec", "--run-dir", rd.Path, "--", name}, cmdline...), true},
		{append([]string{"--workers=2", "exec", "--run-dir=" + rd.Path, name}, cmdline...), true},
		{append([]string{"--run-dir", rd.Path, "exec", "--mount-ns", name, "--"}, cmdline...), false},
	} {
		cmd := child(c.args...)
		cmd.Env = append(cmd.Env, "GODEBUG=inittrace=1")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Errorf("%q: %v, output %q, want %s\n%s", c.args, err, out, want, stderr.String())
			continue
		}
		if fast := !strings.Contains(stderr.String(), "init "); fast != c.fast {
			t.Errorf("%q: fast path %v, want %v", c.args, fast, c.fast)
		}
	}
}
