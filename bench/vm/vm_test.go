package vm

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// readCpio parses a newc archive back: name -> contents (test only).
func readCpio(t *testing.T, b []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	for len(b) >= 110 {
		if string(b[:6]) != "070701" {
			t.Fatalf("bad magic %q", b[:6])
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(b[6+8*i:14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return int(v)
		}
		size, nameSize := field(6), field(11)
		name := string(b[110 : 110+nameSize-1])
		off := (110 + nameSize + 3) &^ 3
		data := b[off : off+size]
		b = b[(off+size+3)&^3:]
		if name == "TRAILER!!!" {
			break
		}
		out[name] = string(data)
	}
	return out
}

func TestCpio(t *testing.T) {
	var buf bytes.Buffer
	err := writeCpio(&buf, []File{{Name: "init", Link: "/usr/bin/nsfleet"}, {Name: "usr", Dir: true, Mode: 0o755},
		{Name: "usr/bin/nsfleet", Mode: 0o755, Data: []byte("binary!")}, {Name: "job.json", Mode: 0o644, Data: []byte("{}")}})
	if err != nil {
		t.Fatal(err)
	}
	got := readCpio(t, buf.Bytes())
	if got["usr/bin/nsfleet"] != "binary!" || got["init"] != "/usr/bin/nsfleet" || got["job.json"] != "{}" {
		t.Fatalf("round trip: %q", got)
	}
	// The system's cpio agrees, where there is one.
	if _, err := exec.LookPath("cpio"); err == nil {
		cmd := exec.Command("cpio", "-t")
		cmd.Stdin = bytes.NewReader(buf.Bytes())
		out, err := cmd.Output()
		if err != nil || !strings.Contains(string(out), "usr/bin/nsfleet") {
			t.Errorf("cpio -t: %v %s", err, out)
		}
	}
}

func TestKernelReleaseRefusesOtherFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "not-a-kernel")
	os.WriteFile(p, bytes.Repeat([]byte{0}, 4096), 0o644)
	if _, err := KernelRelease(p); err == nil || !strings.Contains(err.Error(), "not a bzImage") {
		t.Fatalf("err = %v", err)
	}
	if _, err := Boot(context.Background(), Options{Kernel: p, Accel: "tcg"}); err == nil || !strings.Contains(err.Error(), "bzImage") && !strings.Contains(err.Error(), "qemu") {
		t.Fatalf("boot of a non-kernel: %v", err)
	}
}

func TestAccelSaysWhy(t *testing.T) {
	a, why := Accel("auto")
	if (a != "kvm" && a != "tcg") || why == "" {
		t.Fatalf("auto: %q %q", a, why)
	}
	if a, _ := Accel("tcg"); a != "tcg" {
		t.Fatal("tcg asked, not given")
	}
}

// testKernel is a bzImage and its modules tree, from NSFLEET_TEST_KERNEL
// and NSFLEET_TEST_MODULES (.ci/run downloads Debian's 6.1 cloud kernel).
func testKernel(t *testing.T) (string, string) {
	k, m := os.Getenv("NSFLEET_TEST_KERNEL"), os.Getenv("NSFLEET_TEST_MODULES")
	if k == "" {
		t.Skip("NSFLEET_TEST_KERNEL not set (a bzImage to boot)")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	return k, m
}

// TestBootRunsAScenario boots the test kernel, runs churn and fake-router
// inside it (veth and the virtio port from its modules), and gets the run
// back over the virtio port, with the guest's kernel and accelerator.
func TestBootRunsAScenario(t *testing.T) {
	k, m := testKernel(t)
	self := buildSelf(t)
	for _, job := range []Job{
		{Scenario: "churn", N: 100, Mark: 50, Runs: 1, Variants: []string{"net"}, Globals: map[string]int{"limit": 1000}},
		{Scenario: "fake-router", N: 40, Mark: 20, Runs: 1, Engines: []string{"native"}, Variants: []string{"add+2exec+2link"}},
	} {
		run, err := Boot(context.Background(), Options{Kernel: k, Modules: m, Accel: "auto", Self: self, Job: job, Timeout: 5 * time.Minute})
		if err != nil {
			t.Fatalf("%s: %v", job.Scenario, err)
		}
		rel, _ := KernelRelease(k)
		if run.Params["kernel"] != rel || run.Params["accel"] == "" || len(run.Samples) == 0 {
			t.Fatalf("%s: params %v, %d samples", job.Scenario, run.Params, len(run.Samples))
		}
		if !strings.Contains(run.Env.Kernel, rel) {
			t.Errorf("%s: the run's environment says kernel %q, want the guest's %s", job.Scenario, run.Env.Kernel, rel)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(k), "config-"+rel)); err == nil && len(run.Env.Config) == 0 {
			t.Errorf("%s: the kernel's config lies beside the image but the run records none", job.Scenario)
		}
	}
}

// buildSelf builds the lab binary for the guest (the test binary is not it).
func buildSelf(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "nsfleet-lab")
	cmd := exec.Command("go", "build", "-o", out, "github.com/nsfleet/nsfleet/cmd/nsfleet-lab")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build nsfleet-lab: %v\n%s", err, b)
	}
	return out
}

// TestBootFailsClearly: without its modules the guest cannot send a
// result; the error names the kernel, the missing modules and shows the
// console's last lines.
func TestBootFailsClearly(t *testing.T) {
	k, _ := testKernel(t)
	self := buildSelf(t)
	_, err := Boot(context.Background(), Options{Kernel: k, Modules: t.TempDir(), Accel: "auto", Self: self,
		Job: Job{Scenario: "churn", N: 10, Mark: 10, Runs: 1, Variants: []string{"net"}}, Timeout: 3 * time.Minute})
	rel, _ := KernelRelease(k)
	if err == nil || !strings.Contains(err.Error(), rel) || !strings.Contains(err.Error(), "modules not found") || !strings.Contains(err.Error(), "console") {
		t.Fatalf("err = %v", err)
	}
}
