package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/internal/nstest"
	"golang.org/x/sys/unix"
)

// TestOSPFRing: a generated ring of routers running BIRD's OSPF converges
// (topo wait reads every router's routes in its kernel); a link cut on
// day two, the ring routes around it; up makes the link again and the
// spec matches.
func TestOSPFRing(t *testing.T) {
	nstest.RequireRoot(t)
	if _, err := exec.LookPath("bird"); err != nil {
		t.Skip("BIRD (Debian's bird2) is not installed")
	}
	p := nstest.Prefix(t)
	dir := t.TempDir()
	rdir := filepath.Join(dir, "netns")
	t.Cleanup(func() {
		run("--run-dir", rdir, "down", "--prefix", p, "--grace", "1s")
		unix.Unmount(rdir, unix.MNT_DETACH)
	})
	// Every router gets a BIRD config of its own, from topo's template.
	code, yaml, errs := run("topo", "ring", "6", "--prefix", p+"r", "--bird", "1")
	if code != 0 {
		t.Fatalf("topo: %d %s", code, errs)
	}
	spec := filepath.Join(dir, "ring.yaml")
	if err := os.WriteFile(spec, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if code, _, errs := run("--run-dir", rdir, "up", "-f", spec, "--progress", "none"); code != 0 {
		t.Fatalf("up: %d %s", code, errs)
	}
	code, out, errs := run("--run-dir", rdir, "topo", "wait", "-f", spec, "--timeout", "60s")
	if code != 0 || !strings.Contains(out, "all 6 routers reach the other 5 loopback addresses") {
		t.Fatalf("topo wait: %d %q %s", code, out, errs)
	}
	t.Logf("6 routers, OSPF: up to converged in %s", time.Since(start).Round(time.Millisecond))
	// Each BIRD runs from its own config: r3's router id is r3's loopback.
	// (From its directory: the socket's full path may pass 107 bytes.)
	birdc := exec.Command("birdc", "-s", "bird.ctl", "show", "status")
	birdc.Dir = filepath.Join(dir, ".nsfleet-netns", "configs", p+"r3")
	if out, err := birdc.CombinedOutput(); err != nil || !strings.Contains(string(out), "Router ID is 10.255.0.3") {
		t.Fatalf("birdc show status in %s: %v\n%s", birdc.Dir, err, out)
	}

	// Day two: the link between r1 and r2 cut inside r1. OSPF routes
	// around the ring; the routers still reach every loopback.
	pin := filepath.Join(rdir, p+"r1")
	if out, err := exec.Command("nsenter", "--net="+pin, "ip", "link", "del", "eth0").CombinedOutput(); err != nil {
		t.Fatalf("cut a link: %v %s", err, out)
	}
	if code, out, _ := run("--run-dir", rdir, "ls", "-f", spec); code == 0 || !strings.Contains(out, "missing") {
		t.Errorf("ls after a cut link: %d\n%s", code, out)
	}
	cut := time.Now()
	if code, out, errs := run("--run-dir", rdir, "topo", "wait", "-f", spec, "--timeout", "60s"); code != 0 {
		t.Fatalf("topo wait after the cut: %d %q %s", code, out, errs)
	}
	t.Logf("after a cut: every loopback reached again (around the ring) in %s", time.Since(cut).Round(time.Millisecond))
	if code, _, errs := run("--run-dir", rdir, "up", "-f", spec, "--progress", "none"); code != 0 {
		t.Fatalf("up after the cut: %d %s", code, errs)
	}
	if code, out, errs := run("--run-dir", rdir, "ls", "-f", spec); code != 0 {
		t.Fatalf("ls after up: %d\n%s%s", code, out, errs)
	}
	out2, err := exec.Command("nsenter", "--net="+pin, "ip", "-o", "link", "show", "eth0").CombinedOutput()
	if err != nil || !strings.Contains(string(out2), "UP") {
		t.Fatalf("r1's eth0 after up: %v %s", err, out2)
	}
}
