package cli

import (
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/internal/nstest"
)

// TestLsLinear is the small linearity check the scale script makes at
// 40,000: reading four times the fleet takes at most twice the time per
// namespace (a cost per namespace that grows with the fleet, such as a
// host dump per namespace or a lookup over every namespace id, fails it).
func TestLsLinear(t *testing.T) {
	if testing.Short() {
		t.Skip("makes 4,000 namespaces")
	}
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() {
		run("--run-dir", rd.Path, "down", "--prefix", p, "--progress", "none")
		nstest.DeleteHostLinks(t, p)
	})
	perNS := func(n int) time.Duration {
		spec := writeSpec(t, p, n)
		if code, out, errs := run("--run-dir", rd.Path, "up", "-f", spec, "--progress", "none"); code != 0 {
			t.Fatalf("up %d: %s%s", n, out, errs)
		}
		best := time.Hour
		for i := 0; i < 3; i++ {
			start := time.Now()
			if code, out, errs := run("--run-dir", rd.Path, "ls", "-f", spec, "-o", "json"); code != 0 {
				t.Fatalf("ls %d: %.200s%s", n, out, errs)
			}
			best = min(best, time.Since(start))
		}
		return best / time.Duration(n)
	}
	small := perNS(1000)
	large := perNS(4000)
	t.Logf("ls per namespace: %s at 1,000, %s at 4,000", small, large)
	if large > 2*small {
		t.Errorf("ls per namespace grew from %s at 1,000 to %s at 4,000 (more than 2x)", small, large)
	}
}
