package labcli

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/nsfleet/nsfleet/bench"
	"github.com/nsfleet/nsfleet/internal/exitcode"
)

// --kernel host,IMAGE: this kernel natively and IMAGE in a VM, one run
// with the kernels as columns, releases and accelerators recorded.
func TestBenchHostBesideVM(t *testing.T) {
	k, m := os.Getenv("NSFLEET_TEST_KERNEL"), os.Getenv("NSFLEET_TEST_MODULES")
	if k == "" {
		t.Skip("NSFLEET_TEST_KERNEL not set (a bzImage to boot)")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and qemu-system-x86_64")
	}
	cmd := child("bench", "fake-router", "-n", "20", "--mark", "10", "--engines", "native", "--variants", "add",
		"--kernel", "host,"+k, "--modules", m, "-o", "json", "--no-store", "--progress", "none")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench --kernel host,%s: %v\n%s", k, err, out)
	}
	var r bench.Run
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("one JSON run: %v\n%s", err, out)
	}
	kernels := map[string]bool{}
	for _, x := range r.Samples {
		kernels[x.Config["kernel"]] = true
	}
	native := r.Env.KernelRelease() + " native"
	if len(kernels) != 2 || !kernels[native] || r.Keys[0] != "kernel" || !strings.HasPrefix(r.Params["accel"], "native+") {
		t.Errorf("kernels %v (want %q and a VM's), keys %v, params %v", kernels, native, r.Keys, r.Params)
	}
	// And a bad image is a usage error before anything runs.
	code, _, stderr := run("bench", "fake-router", "--kernel", "host,/nonexistent/bzImage", "--no-store")
	if code != exitcode.Usage || !strings.Contains(stderr, "/nonexistent/bzImage") {
		t.Errorf("missing image: exit %d, %s", code, stderr)
	}
}
