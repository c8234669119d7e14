package doctor_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/doctor"
	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	if os.Getenv("NSFLEET_DOCTOR_CHILD") == "limit" {
		os.Exit(limitChild())
	}
	nstest.Main(m)
}

func run(t *testing.T, rd *netns.RunDir) *doctor.Report {
	t.Helper()
	r, err := doctor.Run(context.Background(), doctor.Options{RunDir: rd})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// worst returns the worst severity among a check's findings, and their text.
func worst(r *doctor.Report, check string) (doctor.Severity, string) {
	w := doctor.OK
	var text []string
	for _, f := range r.Find(check) {
		w = max(w, f.Severity)
		text = append(text, f.Severity.String()+": "+f.Summary+" "+strings.Join(f.Evidence, "; "))
	}
	return w, strings.Join(text, "\n")
}

func expect(t *testing.T, r *doctor.Report, check string, want doctor.Severity) {
	t.Helper()
	if got, text := worst(r, check); got != want {
		t.Fatalf("%s: severity %v, want %v\n%s", check, got, want, text)
	}
}

// ownedNS makes a namespace carrying nsfleet's lo mark.
func ownedNS(t *testing.T) *netns.NS {
	h, err := netns.Create(func(*netns.NS) error {
		c, err := rtnl.OpenLite()
		if err != nil {
			return err
		}
		defer c.Close()
		return c.SetLoopback(true, fleet.Marker)
	})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestRunDirNotMountPoint(t *testing.T) {
	rd := nstest.RunDir(t)
	expect(t, run(t, rd), doctor.CheckRunDir, doctor.Warn)
	if _, err := rd.Setup(); err != nil {
		t.Fatal(err)
	}
	expect(t, run(t, rd), doctor.CheckRunDir, doctor.OK)
}

func TestStalePins(t *testing.T) {
	rd := nstest.RunDir(t)
	rd.Setup()
	// nsfleet's own pin whose mount went away (a crash between create and
	// mount leaves the same): marked, so --fix may remove it.
	h := ownedNS(t)
	if err := rd.Pin("mine", h); err != nil {
		t.Fatal(err)
	}
	h.Close()
	if err := unix.Unmount(rd.PinPath("mine"), unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	// Another tool's stale pin: no mark.
	os.WriteFile(rd.PinPath("theirs"), nil, 0)
	r := run(t, rd)
	expect(t, r, doctor.CheckPins, doctor.Warn)
	fixed, err := doctor.Fix(r.Env)
	if err != nil {
		t.Fatal(err)
	}
	if len(fixed) != 2 || !strings.Contains(fixed[0], "removed stale pin file") || !strings.Contains(fixed[1], "left stale pin file") {
		t.Fatalf("fix: %q", fixed)
	}
	if _, err := os.Stat(rd.PinPath("theirs")); err != nil {
		t.Fatal("fix removed a pin that is not nsfleet's")
	}
	os.Remove(rd.PinPath("theirs"))
	expect(t, run(t, rd), doctor.CheckPins, doctor.OK)
}

func TestDoublePins(t *testing.T) {
	rd := nstest.RunDir(t)
	rd.Setup()
	h := ownedNS(t)
	defer h.Close()
	if err := rd.Pin("a", h); err != nil {
		t.Fatal(err)
	}
	// Stacked: the same namespace mounted twice on one pin (two racing
	// pins), and the same namespace under a second name.
	if err := unix.Mount(h.Path(), rd.PinPath("a"), "none", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	r := run(t, rd)
	expect(t, r, doctor.CheckPins, doctor.Warn)
	fixed, err := doctor.Fix(r.Env)
	if err != nil || len(fixed) != 1 || !strings.Contains(fixed[0], "unmounted 1 extra mount") {
		t.Fatalf("fix: %q, %v", fixed, err)
	}
	expect(t, run(t, rd), doctor.CheckPins, doctor.OK)
	if err := rd.Pin("b", h); err != nil {
		t.Fatal(err)
	}
	expect(t, run(t, rd), doctor.CheckPins, doctor.Warn)
	rd.Unpin("b")
	expect(t, run(t, rd), doctor.CheckPins, doctor.OK)
}

// TestIdleMountNamespaces plants mount namespaces that share the run dir's
// peer group (as services started by systemd do) and sees each new pin
// counted as copied into every one of them.
func TestIdleMountNamespaces(t *testing.T) {
	rd := nstest.RunDir(t)
	rd.Setup()
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare(1) not installed")
	}
	var sleepers []*exec.Cmd
	stop := func() {
		for _, c := range sleepers {
			c.Process.Kill()
			c.Wait()
		}
		sleepers = nil
	}
	t.Cleanup(stop)
	for i := 0; i < 55; i++ {
		c := exec.Command("unshare", "--mount", "--propagation", "unchanged", "sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		sleepers = append(sleepers, c)
	}
	var r *doctor.Report
	deadline := time.Now().Add(10 * time.Second)
	for {
		r = run(t, rd)
		if len(r.Env.Receivers) >= 55 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	expect(t, r, doctor.CheckMounts, doctor.Warn)
	ours := map[int]bool{}
	for _, c := range sleepers {
		ours[c.Process.Pid] = true
	}
	stop()
	// Other tests running at the same time (the lab's mount-propagation
	// scenario) may hold a few receivers of their own: ours must be gone
	// and the warning with them.
	r = run(t, rd)
	for _, pid := range r.Env.Receivers {
		if ours[pid] {
			t.Fatalf("pid %d still counted as a receiver after it ended", pid)
		}
	}
	for _, f := range r.Findings {
		if f.Check == doctor.CheckMounts && f.Severity == doctor.Warn {
			t.Fatalf("mount load still warns after the idle namespaces ended: %s", f.Summary)
		}
	}
}

// TestLoweredLimit runs doctor inside a user namespace of its own whose
// user.max_net_namespaces is 5 (the host's limit is not touched).
func TestLoweredLimit(t *testing.T) {
	nstest.RequireRoot(t)
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "NSFLEET_DOCTOR_CHILD=limit", "NSFLEET_DOCTOR_DIR="+dir)
	cmd.SysProcAttr = nstest.InUserNamespace()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "planted: warn") || !strings.Contains(string(out), "removed: ok") {
		t.Fatalf("child output:\n%s", out)
	}
}

// limitChild runs in its own user and mount namespace: it lowers the limit,
// pins four namespaces, and checks doctor's headroom before and after.
func limitChild() int {
	// Keep the main thread out of netns.Create: inside a user namespace a
	// thread cannot switch back to the host's namespace and is discarded,
	// and a discarded main thread would make the host's namespace invisible
	// to /proc/self/ns/net.
	runtime.LockOSThread()
	if err := os.WriteFile("/proc/sys/user/max_net_namespaces", []byte("5"), 0); err != nil {
		fmt.Println("set limit:", err)
		return 1
	}
	rd, err := netns.OpenRunDir(os.Getenv("NSFLEET_DOCTOR_DIR")+"/netns", true)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	rd.Setup()
	sev := func() doctor.Severity {
		r, err := doctor.Run(context.Background(), doctor.Options{RunDir: rd})
		if err != nil {
			fmt.Println(err)
			return -1
		}
		w, text := worst(r, doctor.CheckHeadroom)
		fmt.Println(text)
		return w
	}
	// 4 of 5: only namespaces owned by this user namespace count.
	for i := 0; i < 4; i++ {
		h, err := netns.Create(nil)
		if err != nil {
			fmt.Println(err)
			return 1
		}
		rd.Pin(fmt.Sprint("n", i), h)
		h.Close()
	}
	fmt.Println("planted:", sev())
	for i := 0; i < 4; i++ {
		rd.Unpin(fmt.Sprint("n", i))
	}
	fmt.Println("removed:", sev())
	return 0
}

// TestBridgeNearPortLimit builds a bridge with 925 ports inside a
// throwaway namespace (so that the churn does not disturb the host) and
// runs doctor there.
func TestBridgeNearPortLimit(t *testing.T) {
	rd := nstest.RunDir(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip(8) not installed")
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("nsenter(1) not installed")
	}
	rd.Setup()
	h, err := netns.Create(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := rd.Pin("bridges", h); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("link add br0 type bridge\n")
	// Ports are veths (this kernel has no dummy driver), made with one
	// queue each so that ip does not wait for grace periods.
	for i := 0; i < 925; i++ {
		fmt.Fprintf(&b, "link add p%d master br0 numtxqueues 1 numrxqueues 1 type veth peer name q%d numtxqueues 1 numrxqueues 1\n", i, i)
	}
	c := exec.Command("nsenter", "--net="+rd.PinPath("bridges"), "ip", "-batch", "-")
	c.Stdin = strings.NewReader(b.String())
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("ip -batch: %v\n%s", err, out)
	}
	inside := func() *doctor.Report {
		var r *doctor.Report
		err := netns.Do(h, func() error {
			var err error
			r, err = doctor.Run(context.Background(), doctor.Options{RunDir: rd})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	expect(t, inside(), doctor.CheckBridges, doctor.Warn)
	if out, err := exec.Command("nsenter", "--net="+rd.PinPath("bridges"), "ip", "link", "del", "br0").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	expect(t, inside(), doctor.CheckBridges, doctor.OK)
}

// TestNeighbourTable plants a fleet with more host-side veths than
// gc_thresh3 neighbour entries.
func TestNeighbourTable(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	before := run(t, rd)
	g := before.Env.GcThresh3
	if g <= 0 || g > 4096 {
		t.Skipf("gc_thresh3 is %d: too large to plant here", g)
	}
	routers := g/2 + 20
	f, err := spec.Parse("t.yaml", []byte(nstest.FakeRouters(p, routers)), spec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts := fleet.Options{RunDir: rd}
	if s, err := fleet.Up(context.Background(), f, fleet.UpOptions{Options: opts}); err != nil || s.Err() != nil {
		t.Fatalf("up: %v %v", err, s.Errors)
	}
	r := run(t, rd)
	if sev, text := worst(r, doctor.CheckNeigh); sev < doctor.Warn {
		t.Fatalf("neighbour table with %d routers: %v\n%s", routers, sev, text)
	}
	if _, err := fleet.Down(context.Background(), fleet.Selector{Prefix: p}, fleet.DownOptions{Options: opts, Wait: true}); err != nil {
		t.Fatal(err)
	}
	if sev, _ := worst(before, doctor.CheckNeigh); sev == doctor.OK {
		// Other test binaries may be making veths right now; only insist
		// on ok when the machine was ok before the plant.
		if sev, text := worst(run(t, rd), doctor.CheckNeigh); sev != doctor.OK {
			t.Logf("after removal: %v (another test may hold veths)\n%s", sev, text)
		}
	}
}

// TestSysctlTrap plants 5,000 namespaces that each looked up a sysctl
// through the shared /proc.
func TestSysctlTrap(t *testing.T) {
	rd := nstest.RunDir(t)
	var held []*netns.NS
	release := func() {
		for _, h := range held {
			h.Close()
		}
		held = nil
	}
	t.Cleanup(release)
	for i := 0; i < 5000; i++ {
		h, err := netns.Create(func(*netns.NS) error {
			_, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, h)
	}
	expect(t, run(t, rd), doctor.CheckSysctl, doctor.Warn)
	release()
	// Freed namespaces take their dentries with them, asynchronously.
	deadline := time.Now().Add(30 * time.Second)
	for {
		sev, text := worst(run(t, rd), doctor.CheckSysctl)
		if sev <= doctor.Info {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v after the plant was removed:\n%s", sev, text)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func TestNoFleetExitsZero(t *testing.T) {
	nstest.RequireRoot(t)
	r, err := doctor.Run(context.Background(), doctor.Options{RunDir: &netns.RunDir{Path: t.TempDir() + "/none"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range r.Findings {
		// Neighbours, bridges and the sysctl timing reflect what other
		// tests (TestSysctlTrap plants 5,000 namespaces) are doing.
		if f.Severity >= doctor.Warn && f.Check != doctor.CheckNeigh && f.Check != doctor.CheckBridges && f.Check != doctor.CheckSysctl {
			t.Errorf("on a machine with no fleet: %v %s: %s", f.Severity, f.Check, f.Summary)
		}
	}
}

func TestParseKernelConfig(t *testing.T) {
	kc := doctor.ParseKernelConfig([]byte("#\n# comment\nCONFIG_HZ=250\n# CONFIG_PREEMPT is not set\nCONFIG_CMDLINE=\"a b\"\nnot a line\n"))
	if kc["CONFIG_HZ"] != "250" || kc["CONFIG_PREEMPT"] != "n" || kc["CONFIG_CMDLINE"] != "a b" || len(kc) != 3 {
		t.Fatalf("%v", kc)
	}
}

func FuzzParseKernelConfig(f *testing.F) {
	f.Add([]byte("CONFIG_HZ=250\n# CONFIG_X is not set\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for k := range doctor.ParseKernelConfig(b) {
			if !strings.HasPrefix(k, "CONFIG_") {
				t.Fatalf("key %q", k)
			}
		}
	})
}
