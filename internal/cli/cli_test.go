package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/internal/exitcode"
	"github.com/nsfleet/nsfleet/internal/reexec"
	"golang.org/x/sys/unix"

	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
)

// The test binary doubles as nsfleet: with NSFLEET_CLI_CHILD=1 it runs the
// command line from its arguments, so tests can kill it like a real process.
func TestMain(m *testing.M) {
	// Started as one of nsfleet's helpers (/proc/self/exe is this binary
	// when a test runs a command in process).
	reexec.Dispatch()
	switch os.Getenv("NSFLEET_CLI_CHILD") {
	case "1":
		os.Exit(Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	case "script":
		// Set a namespace limit (we are root of our own user namespace),
		// then run several command lines, separated by "--next".
		if lim := os.Getenv("NSFLEET_CHILD_NETNS_LIMIT"); lim != "" {
			if err := os.WriteFile("/proc/sys/user/max_net_namespaces", []byte(lim), 0); err != nil {
				fmt.Println("set limit:", err)
				os.Exit(3)
			}
		}
		var args []string
		for _, a := range append(os.Args[1:], "--next") {
			if a != "--next" {
				args = append(args, a)
				continue
			}
			if len(args) == 2 && args[0] == "@limit" {
				// Change the limit between command lines.
				err := os.WriteFile("/proc/sys/user/max_net_namespaces", []byte(args[1]), 0)
				fmt.Printf("limit %s: %v\n", args[1], err)
				args = nil
				continue
			}
			code := Run(context.Background(), args, os.Stdout, os.Stdout)
			fmt.Printf("exit %d\n", code)
			args = nil
		}
		os.Exit(0)
	}
	nstest.Main(m)
}

func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func child(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "NSFLEET_CLI_CHILD=1")
	return cmd
}

func writeSpec(t *testing.T, p string, count int) string {
	t.Helper()
	y := nstest.FakeRouters(p, count)
	path := filepath.Join(t.TempDir(), "spec.yaml")
	if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestHelpTeaches(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"up", "--help"}, {"down", "--help"}, {"ls", "--help"}} {
		code, out, _ := run(args...)
		if code != 0 || !strings.Contains(out, "Examples:") {
			t.Errorf("%v: code %d, output without examples:\n%s", args, code, out)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	cases := [][]string{{"up"}, {"down"}, {"down", "-f", "x", "--prefix", "y"}, {"ls", "-o", "xml"}, {"frobnicate"}}
	for _, args := range cases {
		if code, _, errs := run(args...); code != exitcode.Usage || errs == "" {
			t.Errorf("%v: code %d (want %d), stderr %q", args, code, exitcode.Usage, errs)
		}
	}
}

func TestBadSpecNamesLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(path, []byte("namespaces:\n  - name: \"a{i}\"\n    count: 2\n    veths: [{host: \"waytoolonginterfacename{i}\", peer: p}]\n"), 0o644)
	code, _, errs := run("--run-dir", t.TempDir(), "up", "-f", path)
	if code != exitcode.Failed || !strings.Contains(errs, path+":4:") || !strings.Contains(errs, "index 1") {
		t.Fatalf("code %d, stderr %q", code, errs)
	}
}

// TestInteropWithIproute2 works in the real /run/netns (under a unique
// prefix) so that ip(8) sees nsfleet's namespaces and nsfleet sees ip's.
func TestInteropWithIproute2(t *testing.T) {
	nstest.SystemRunDir(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip(8) not installed")
	}
	p := nstest.Prefix(t)
	spec := writeSpec(t, p, 3)
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", p+"bar-9").Run()
		run("down", "--prefix", p, "--adopt")
		nstest.DeleteHostLinks(t, p)
	})
	if code, out, errs := run("up", "-f", spec); code != 0 {
		t.Fatalf("up: %d %s %s", code, out, errs)
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil || !strings.Contains(string(out), p+"bar-2") {
		t.Fatalf("ip netns list: %v\n%s", err, out)
	}
	out, err = exec.Command("ip", "-n", p+"bar-2", "-o", "link", "show").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "qri-2@") || !strings.Contains(string(out), "alias nsfleet") {
		t.Fatalf("ip -n link: %v\n%s", err, out)
	}
	out, err = exec.Command("ip", "netns", "exec", p+"bar-2", "cat", "/proc/sys/net/ipv4/ip_forward").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Fatalf("ip netns exec: %v\n%s", err, out)
	}
	// ip's own namespace is seen as foreign and left alone.
	if out, err := exec.Command("ip", "netns", "add", p+"bar-9").CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	code, out2, _ := run("ls", "--prefix", p)
	if code != 0 || !strings.Contains(out2, p+"bar-9") || !strings.Contains(out2, "foreign") {
		t.Fatalf("ls: %d\n%s", code, out2)
	}
	code, out2, _ = run("down", "--prefix", p)
	if code != exitcode.Failed || !strings.Contains(out2, "3 deleted, 1 skipped") {
		t.Fatalf("down: %d\n%s", code, out2)
	}
	// ip netns del works on what nsfleet made, too.
	run("up", "-f", spec)
	if out, err := exec.Command("ip", "netns", "del", p+"bar-1").CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v %s", err, out)
	}
	if out, err := exec.Command("ip", "netns", "del", p+"bar-9").CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v %s", err, out)
	}
	run("down", "--prefix", p)
}

// TestSigkillConverges kills up and down at random moments; the next up
// must converge with no stale pin, no stray mount and no orphan host veth.
func TestSigkillConverges(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	const count = 150
	spec := writeSpec(t, p, count)
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 1))
	for round := 0; round < 6; round++ {
		verb := "up"
		if round%3 == 2 {
			verb = "down"
		}
		cmd := child("--run-dir", rd.Path, verb, "-f", spec, "--progress", "none")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(10+rng.IntN(250)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
	}
	code, out, errs := run("--run-dir", rd.Path, "up", "-f", spec, "--progress", "none")
	if code != 0 {
		t.Fatalf("up after kills: %d\n%s\n%s", code, out, errs)
	}
	pins, err := rd.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(pins) != count {
		t.Fatalf("%d pins, want %d", len(pins), count)
	}
	for _, pi := range pins {
		if !pi.Mounted || pi.Mounts != 1 {
			t.Errorf("pin %+v: want exactly one namespace mount", pi)
		}
	}
	// Orphans would show as extra host veths with the prefix.
	if got := nstest.HostLinks(t, p); len(got) != 2*count {
		t.Fatalf("%d host veths, want %d", len(got), 2*count)
	}
	if code, out, _ := run("--run-dir", rd.Path, "ls", "-f", spec); code != 0 {
		t.Fatalf("ls after converge: %d\n%s", code, out)
	}
	if code, out, errs := run("--run-dir", rd.Path, "down", "-f", spec); code != 0 {
		t.Fatalf("down: %d\n%s\n%s", code, out, errs)
	}
	if got := nstest.HostLinks(t, p); len(got) != 0 {
		t.Fatalf("host veths left after down: %v", got)
	}
}

// TestSigintSummarises: SIGINT stops up cleanly, prints the summary and
// exits 130; what was made is complete and the next up finishes the job.
func TestSigintSummarises(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	spec := writeSpec(t, p, 2000)
	cmd := child("--run-dir", rd.Path, "up", "-f", spec, "--progress", "none")
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != exitcode.Interrupted {
		t.Fatalf("exit: %v, want code %d; output:\n%s", err, exitcode.Interrupted, out.String())
	}
	if !strings.Contains(out.String(), "up (interrupted):") {
		t.Fatalf("no summary:\n%s", out.String())
	}
	pins, _ := rd.List()
	for _, pi := range pins {
		if !pi.Mounted {
			t.Errorf("stale pin after SIGINT: %+v", pi)
		}
	}
	if code, o, e := run("--run-dir", rd.Path, "down", "-f", spec); code != 0 {
		t.Fatalf("down: %d %s %s", code, o, e)
	}
}

// TestLimitENOSPC lowers user.max_net_namespaces inside a user namespace of
// its own (the host's limit is not touched) and checks that hitting it gives
// a clear error naming the limit, while what was made stays consistent.
func TestLimitENOSPC(t *testing.T) {
	nstest.RequireRoot(t)
	dir := t.TempDir()
	specA := filepath.Join(dir, "a.yaml")
	specB := filepath.Join(dir, "b.yaml")
	os.WriteFile(specA, []byte("namespaces:\n  - name: \"a{i}\"\n    count: 3\n"), 0o644)
	os.WriteFile(specB, []byte("namespaces:\n  - name: \"b{i}\"\n    count: 4\n"), 0o644)
	rdir := filepath.Join(dir, "netns")
	cmd := exec.Command(os.Args[0],
		"--run-dir", rdir, "up", "-f", specA, "--progress", "none", "--next",
		"--run-dir", rdir, "up", "-f", specB, "--progress", "none", "--next",
		"--run-dir", rdir, "ls", "--next",
		// Once the limit is raised, a rerun converges.
		"@limit", "100", "--next",
		"--run-dir", rdir, "up", "-f", specB, "--progress", "none", "--next",
		"--run-dir", rdir, "ls", "-f", specB, "--next",
		"--run-dir", rdir, "down", "-f", specA, "--progress", "none", "--next",
		"--run-dir", rdir, "down", "-f", specB, "--progress", "none")
	cmd.Env = append(os.Environ(), "NSFLEET_CLI_CHILD=script", "NSFLEET_CHILD_NETNS_LIMIT=5")
	cmd.SysProcAttr = nstest.InUserNamespace()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Skipf("cannot run in a user namespace here: %v\n%s", err, out)
	}
	o := string(out)
	for _, want := range []string{
		"up: 3 created", "exit 0",
		"up: 2 created, 0 repaired, 0 unchanged, 2 failed", "network namespace limit reached (user.max_net_namespaces is 5", "exit 1",
		"5 namespaces: 5 ok",
		"limit 100: <nil>",
		"up: 2 created, 0 repaired, 2 unchanged, 0 failed",
		"4 namespaces: 4 ok",
	} {
		if !strings.Contains(o, want) {
			t.Errorf("output lacks %q:\n%s", want, o)
		}
	}
}

// TestFewFDs: every command works with 32 file descriptors on 300
// namespaces, each with a supervised process, so nothing keeps a
// descriptor per namespace and nothing fails for lack of one (EMFILE is
// waited out). It runs in parallel with other tests, for load.
func TestFewFDs(t *testing.T) {
	t.Parallel()
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	spec := filepath.Join(t.TempDir(), "spec.yaml")
	y := nstest.FakeRouters(p, 300) + `    processes:
      - name: sleeper
        command: ["sleep", "1000"]
        restart: always
`
	if err := os.WriteFile(spec, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run("--run-dir", rd.Path, "down", "-f", spec, "--grace", "1s") })
	limited := func(args ...string) *exec.Cmd {
		cmd := exec.Command("bash", append([]string{"-c", `ulimit -n 32 && exec "$0" "$@"`, os.Args[0], "--run-dir", rd.Path}, args...)...)
		cmd.Env = append(os.Environ(), "NSFLEET_CLI_CHILD=1")
		return cmd
	}
	for _, args := range [][]string{
		{"up", "-f", spec, "--progress", "none"},
		{"ls", "-f", spec, "-o", "json"},
		{"ls", "--prefix", p},
		{"exec", "--all", "--prefix", p, "--", "true"},
	} {
		if out, err := limited(args...).CombinedOutput(); err != nil {
			t.Fatalf("%s with 32 fds: %v\n%s", args[0], err, lastLines(out, 20))
		}
	}
	// supervise adopts 300 processes (too many for a pidfd each: it
	// watches the rest through /proc) and restarts one that is killed.
	sup := limited("supervise", "-f", spec, "--backoff", "100ms", "--tick", "100ms")
	var supOut strings.Builder
	sup.Stderr = &supOut
	if err := sup.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Process.Kill(); sup.Wait() })
	victim := procsOf(t, rd.Path, spec)[p+"bar-150/sleeper"]
	if victim.State != "running" {
		t.Fatalf("sleeper in %sbar-150: %+v", p, victim)
	}
	time.Sleep(500 * time.Millisecond) // let it adopt
	syscall.Kill(victim.PID, syscall.SIGKILL)
	waitFor(t, "the restart under 32 fds", 20*time.Second, func() bool {
		st := procsOf(t, rd.Path, spec)[p+"bar-150/sleeper"]
		return st.State == "running" && st.PID != victim.PID
	})
	sup.Process.Signal(syscall.SIGTERM)
	sup.Wait()
	if strings.Contains(supOut.String(), "too many open files") {
		t.Errorf("supervise under 32 fds:\n%s", lastLines([]byte(supOut.String()), 20))
	}
	if out, err := limited("down", "-f", spec, "--progress", "none", "--grace", "1s").CombinedOutput(); err != nil {
		t.Fatalf("down with 32 fds: %v\n%s", err, lastLines(out, 20))
	}
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"..."}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

func TestSecondRunRefusedWhileLocked(t *testing.T) {
	rd := nstest.RunDir(t)
	l, err := rd.Lock(false)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	p := nstest.Prefix(t)
	code, _, errs := run("--run-dir", rd.Path, "up", "-f", writeSpec(t, p, 1))
	if code != exitcode.Failed || !strings.Contains(errs, netns.ErrLocked.Error()) || !strings.Contains(errs, fmt.Sprint(os.Getpid())) {
		t.Fatalf("code %d, stderr %q", code, errs)
	}
}

func TestMissingRunDirIsEmpty(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "never-made")
	if code, out, errs := run("--run-dir", dir, "ls"); code != 0 || !strings.Contains(out, "0 namespaces") {
		t.Errorf("ls: %d %q %q", code, out, errs)
	}
	if code, out, errs := run("--run-dir", dir, "down", "--prefix", "x"); code != 0 || !strings.Contains(out, "nothing to delete") {
		t.Errorf("down: %d %q %q", code, out, errs)
	}
	spec := writeSpec(t, nstest.Prefix(t), 2)
	if code, out, errs := run("--run-dir", dir, "up", "-f", spec, "--dry-run", "--progress", "none"); code != 0 || !strings.Contains(out, "plan: 2 namespaces: 2 to create") {
		t.Errorf("up --dry-run: %d %q %q", code, out, errs)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("ls, down or a dry run created the run dir")
	}
}

// TestUnprivileged: as an ordinary user, commands that change namespaces
// say once that they need root (before touching anything), and ls shows
// what it can read.
func TestUnprivileged(t *testing.T) {
	nstest.RequireRoot(t)
	// A directory the unprivileged user can enter, with a copy of this
	// binary in it.
	dir, err := os.MkdirTemp("", "nsfleet-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	self, _ := os.ReadFile(os.Args[0])
	bin := filepath.Join(dir, "nsfleet")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	runDir := filepath.Join(dir, "netns")
	p := nstest.Prefix(t)
	spec := filepath.Join(dir, "spec.yaml")
	os.WriteFile(spec, []byte(nstest.FakeRouters(p, 3)), 0o644)
	t.Cleanup(func() {
		run("--run-dir", runDir, "down", "-f", spec)
		unix.Unmount(runDir, unix.MNT_DETACH)
	})
	if code, out, errs := run("--run-dir", runDir, "up", "-f", spec, "--progress", "none"); code != 0 {
		t.Fatalf("up as root: %s %s", out, errs)
	}
	asNobody := func(args ...string) (int, string) {
		cmd := exec.Command(bin, append([]string{"--run-dir", runDir}, args...)...)
		cmd.Env = append(os.Environ(), "NSFLEET_CLI_CHILD=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, string(out)
	}
	for _, args := range [][]string{
		{"up", "-f", spec},
		{"down", "-f", spec},
		{"exec", p + "bar-1", "--", "true"},
		{"supervise", "-f", spec},
		{"doctor", "--fix"},
	} {
		code, out := asNobody(args...)
		if code != exitcode.Failed || !strings.Contains(out, "needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN") || strings.Count(out, "\n") != 1 {
			t.Errorf("%s as nobody: code %d, %q; want one line saying it needs root", args[0], code, out)
		}
	}
	code, out := asNobody("ls", "--prefix", p)
	if code != 0 || !strings.Contains(out, "3 namespaces: 3 unread") || strings.Count(out, "need root") != 1 || strings.Contains(out, "operation not permitted") {
		t.Errorf("ls as nobody: code %d:\n%s", code, out)
	}
	if code, out := asNobody("ls", "-f", spec); code != exitcode.Failed || !strings.Contains(out, "cannot compare") {
		t.Errorf("ls -f as nobody: code %d:\n%s", code, out)
	}
	if code, out := asNobody("doctor"); code == exitcode.Usage || !strings.Contains(out, "run it as root for all of them") {
		t.Errorf("doctor as nobody: code %d:\n%s", code, out)
	}
	// Nothing changed: everything is still there.
	if code, out, errs := run("--run-dir", runDir, "ls", "-f", spec); code != 0 {
		t.Errorf("after the refusals: %s %s", out, errs)
	}
}

// A dry run of down says what it would delete, and deletes nothing.
func TestDownDryRun(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	spec := writeSpec(t, p, 3)
	if code, out, errs := run("--run-dir", rd.Path, "up", "-f", spec, "--progress", "none"); code != 0 {
		t.Fatalf("up: %s%s", out, errs)
	}
	code, out, errs := run("--run-dir", rd.Path, "down", "-f", spec, "--dry-run", "--progress", "none")
	if code != 0 || !strings.Contains(out, "down (dry run): would delete 3 namespaces\n") {
		t.Fatalf("dry run: code %d\n%s%s", code, out, errs)
	}
	if code, out, errs := run("--run-dir", rd.Path, "ls", "-f", spec); code != 0 {
		t.Fatalf("after the dry run: %s%s", out, errs)
	}
	if code, out, errs := run("--run-dir", rd.Path, "down", "-f", spec, "--progress", "none"); code != 0 || !strings.Contains(out, "down: 3 deleted") {
		t.Fatalf("down: code %d\n%s%s", code, out, errs)
	}
}

// In a host of few links (here a network namespace of its own, as when
// nsfleet runs in a container), host ends are numbered as low as the
// routers' own links, and a veth's peer often has its number: pairing
// must still find every host end, and down must wait for all of them.
func TestSmallHost(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	spec := writeSpec(t, p, 5)
	t.Cleanup(func() { run("--run-dir", rd.Path, "down", "--prefix", p) })
	cmd := exec.Command("unshare", "-n", os.Args[0],
		"--run-dir", rd.Path, "up", "-f", spec, "--progress", "none", "--next",
		"--run-dir", rd.Path, "ls", "--prefix", p, "-o", "json", "--next",
		"--run-dir", rd.Path, "down", "-f", spec, "--progress", "none")
	cmd.Env = append(os.Environ(), "NSFLEET_CLI_CHILD=script")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Count(string(out), "exit 0\n") != 3 {
		t.Fatalf("%v\n%s", err, out)
	}
	for i := 1; i <= 5; i++ {
		for _, end := range []string{"o", "g"} {
			if want := fmt.Sprintf(`"host_end": "%s%s%d"`, p, end, i); !strings.Contains(string(out), want) {
				t.Errorf("ls shows no %s", want)
			}
		}
	}
	if !strings.Contains(string(out), " 10 host veths gone") {
		t.Errorf("down did not wait for the 10 host ends:\n%s", out)
	}
}

// TestThrowawayRunDirGoes: after up and down in a private run dir, the
// directory is a plain one again and removing it just works; a run dir
// that another tool had mounted stays mounted.
func TestThrowawayRunDirGoes(t *testing.T) {
	nstest.RequireRoot(t)
	p := nstest.Prefix(t)
	spec := writeSpec(t, p, 2)
	lab := filepath.Join(t.TempDir(), "lab")
	rdir := filepath.Join(lab, "netns")
	t.Cleanup(func() {
		unix.Unmount(rdir, unix.MNT_DETACH)
		nstest.DeleteHostLinks(t, p)
	})
	if code, _, errs := run("--run-dir", rdir, "up", "-f", spec, "--progress", "none"); code != 0 {
		t.Fatalf("up: %d %s", code, errs)
	}
	code, out, errs := run("--run-dir", rdir, "down", "-f", spec)
	if code != 0 || !strings.Contains(out, "bind mount on it removed") {
		t.Fatalf("down: %d %q %s", code, out, errs)
	}
	if err := os.RemoveAll(lab); err != nil {
		t.Fatalf("removing the run dir after down: %v", err)
	}

	// Another tool's mount on the run dir (no mark): left alone.
	other := filepath.Join(t.TempDir(), "netns")
	os.MkdirAll(other, 0o755)
	if err := unix.Mount(other, other, "none", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(other, unix.MNT_DETACH) })
	if code, _, errs := run("--run-dir", other, "up", "-f", spec, "--progress", "none"); code != 0 {
		t.Fatalf("up: %d %s", code, errs)
	}
	if code, out, errs := run("--run-dir", other, "down", "-f", spec); code != 0 || strings.Contains(out, "bind mount on it removed") {
		t.Fatalf("down in another tool's run dir: %d %q %s", code, out, errs)
	}
	rd, _ := netns.OpenRunDir(other, false)
	if st, err := rd.State(); err != nil || !st.IsMountPoint {
		t.Fatalf("another tool's mount was undone: %+v %v", st, err)
	}
}

func TestVersion(t *testing.T) {
	code, out, errs := run("version")
	if code != 0 || !strings.HasPrefix(out, "nsfleet ") || !strings.Contains(out, "go1.") {
		t.Fatalf("version: %d %q %s", code, out, errs)
	}
	code, out, _ = run("version", "-o", "json")
	var v struct{ Version, Go, Linking string }
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.Version == "" || v.Linking == "" {
		t.Fatalf("version -o json: %d %q", code, out)
	}
}
