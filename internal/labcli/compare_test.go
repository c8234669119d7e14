package labcli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nsfleet/nsfleet/bench"
	"github.com/nsfleet/nsfleet/internal/exitcode"
)

// A run under TCG against a native one is refused, and says why, unless
// --allow-mixed.
func TestCompareRefusesMixedAccelerators(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, params map[string]string, rate float64) string {
		r := &bench.Run{ID: name, Scenario: "fake-router", Params: params, Keys: []string{"engine"}}
		for rep := 0; rep < 3; rep++ {
			r.Samples = append(r.Samples, bench.Sample{Config: map[string]string{"engine": "native"}, Mark: 100, Metric: "rate", Unit: "routers/s", Better: "higher", Rep: rep, Value: rate + float64(rep)})
		}
		b, _ := json.Marshal(r)
		p := filepath.Join(dir, name+".json")
		os.WriteFile(p, b, 0o644)
		return p
	}
	native := write("native", map[string]string{"n": "200"}, 1000)
	tcg := write("tcg", map[string]string{"n": "200", "accel": "tcg"}, 90)
	code, _, stderr := run("bench", "compare", native, tcg)
	if code != exitcode.Usage || !strings.Contains(stderr, "natively") || !strings.Contains(stderr, "under TCG (emulated)") || !strings.Contains(stderr, "--allow-mixed") {
		t.Errorf("mixed compare: exit %d, %s", code, stderr)
	}
	code, out, stderr := run("bench", "compare", "--allow-mixed", native, tcg)
	if code != exitcode.OK || !strings.Contains(out, "rate") {
		t.Errorf("--allow-mixed: exit %d, %s %s", code, out, stderr)
	}
	if code, _, stderr := run("bench", "compare", native, write("native2", map[string]string{"n": "200"}, 1010)); code != exitcode.OK {
		t.Errorf("two native runs: exit %d, %s", code, stderr)
	}
}
