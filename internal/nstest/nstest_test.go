package nstest

import (
	"os/exec"
	"strings"
	"testing"
)

// The leak check sees this binary's objects and only those.
func TestLeakCheckSeesOnlyOurs(t *testing.T) {
	RequireRoot(t)
	p := Prefix(t)
	if !ours(p+"x") || ours("t99999q-x") || ours("eth0") {
		t.Fatalf("ours(%q) is wrong", p)
	}
	before := Take()
	name := p + "leak"
	if out, err := exec.Command("ip", "link", "add", name, "type", "veth", "peer", "name", p+"peer").CombinedOutput(); err != nil {
		t.Skipf("ip link add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "link", "del", name).Run() })
	other := "zz" + p[1:] + "o"
	if err := exec.Command("ip", "link", "add", other, "type", "veth", "peer", "name", other+"p").Run(); err == nil {
		t.Cleanup(func() { exec.Command("ip", "link", "del", other).Run() })
	}
	d := Diff(before, Take())
	if len(d) != 1 || !strings.Contains(d[0], name) || !strings.Contains(d[0], p+"peer") || strings.Contains(d[0], other) {
		t.Fatalf("diff %v: want only %s and its peer", d, name)
	}
}

func TestMain(m *testing.M) { Main(m) }
