package clustercli

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
)

// layout1Release is the last commit whose cluster used key layout 1: the
// release an operator upgrades from.
const layout1Release = "7de693b85ea8e25f1c0e0d5017ecb8026a3c2e6f"

// buildRelease builds nsfleet-cluster as it was at commit, from this
// repository's history.
func buildRelease(t *testing.T, commit string) string {
	t.Helper()
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err == nil {
		err = exec.Command("git", "-C", strings.TrimSpace(string(root)), "cat-file", "-e", commit+"^{commit}").Run()
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("commit %s is not in this clone (CI needs the history: git fetch --unshallow): %v", commit, err)
		}
		t.Skipf("commit %s is not in this clone: %v", commit, err)
	}
	src := t.TempDir()
	archive := exec.Command("sh", "-c", fmt.Sprintf("git -C %q archive %s | tar -x -C %q", strings.TrimSpace(string(root)), commit, src))
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, out)
	}
	bin := filepath.Join(t.TempDir(), "nsfleet-cluster")
	build := exec.Command("go", "build", "-o", bin, "./cmd/nsfleet-cluster")
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the release at %s: %v\n%s", commit, err, out)
	}
	return bin
}

// TestUpgradeFromLayout1 is the upgrade journey: a cluster made and run by
// the layout 1 release, serving routers; 'cluster migrate'; the agents
// restarted with this version one node at a time. Checked in the kernels:
// no router is re-created, no host veth goes down, nothing fails over;
// afterwards a change applied with this version reaches the kernel.
func TestUpgradeFromLayout1(t *testing.T) {
	nstest.RequireRoot(t)
	old := buildRelease(t, layout1Release)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, st := upSim(t, 5*time.Second, "--agent-binary", old)
	etcd := "http://" + st.ProxyAddr
	oldCLI := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(old, append(args, "--etcd", etcd)...).CombinedOutput()
		if err != nil {
			t.Fatalf("release: %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	prefix := nstest.Prefix(t)
	const count = 30
	specFile := filepath.Join(t.TempDir(), "gateway.yaml")
	os.WriteFile(specFile, []byte(fmt.Sprintf(`namespaces:
  - name: "%[1]sr-{i}"
    count: %[2]d
    veths:
      - host: "%[1]sh{i}"
        peer: qr
        up: true
        peer_addresses: ["10.9.{i}.1/24"]
`, prefix, count)), 0o644)
	oldCLI("cluster", "apply", "-f", specFile)
	oldCLI("cluster", "wait", "--timeout", "60s")
	cookies := map[string]uint64{}
	for _, n := range st.Nodes {
		maps.Copy(cookies, pinCookies(t, st, n.Name))
	}
	if len(cookies) != count {
		t.Fatalf("the release serves %d of %d routers", len(cookies), count)
	}
	// Through the whole upgrade: every router on exactly one node, its host
	// veth up, never re-created.
	unchanged := func() string {
		if _, up := hostVethsUp(t, st, prefix); up != count {
			return fmt.Sprintf("%d of %d host veths up", up, count)
		}
		now := map[string]uint64{}
		for _, n := range st.Nodes {
			maps.Copy(now, pinCookies(t, st, n.Name))
		}
		if !maps.Equal(now, cookies) {
			return fmt.Sprintf("routers re-created or moved: %d pins now, %d before", len(now), len(cookies))
		}
		return ""
	}

	out := must(t, "cluster", "migrate")
	if !strings.Contains(out, "spec stored as gateway ("+fmt.Sprint(count)+" namespaces") || !strings.Contains(out, "assignments of 3 nodes") {
		t.Errorf("migrate: %q", out)
	}
	r := status(t)
	if len(r.Specs) != 1 || r.SpecCount != count {
		t.Errorf("after migrate: specs %+v, %d namespaces", r.Specs, r.SpecCount)
	}
	for _, n := range r.Nodes {
		if !n.Alive || !n.Legacy || n.Assigned != count/3 {
			t.Errorf("after migrate, %s: %+v (want alive, legacy, %d assigned)", n.Name, n, count/3)
		}
	}
	if bad := unchanged(); bad != "" {
		t.Fatalf("after migrate: %s", bad)
	}

	for _, n := range st.Nodes {
		must(t, "sim", "restart", n.Name, "--dir", dir, "--binary", self)
		waitFor(t, n.Name+" upgraded and converged", 30*time.Second, func() string {
			for _, nr := range status(t).Nodes {
				if nr.Name == n.Name && (nr.Legacy || !nr.Converged || nr.Ready != count/3) {
					return fmt.Sprintf("%+v", nr)
				}
			}
			return unchanged()
		})
		if bad := unchanged(); bad != "" {
			t.Fatalf("after upgrading %s: %s", n.Name, bad)
		}
	}
	must(t, "cluster", "wait", "--timeout", "30s")
	if r := status(t); len(r.Failovers) != 0 {
		t.Errorf("the upgrade caused failovers: %+v", r.Failovers)
	}
	if bad := unchanged(); bad != "" {
		t.Fatal(bad)
	}

	// Day two on the upgraded cluster: one router's address changed.
	spec := strings.Replace(mustRead(t, specFile), `"10.9.{i}.1/24"`, `"10.9.{i}.1/24", "10.99.{i}.1/24"`, 1)
	os.WriteFile(specFile, []byte(spec), 0o644)
	if out := must(t, "cluster", "apply", "-f", specFile); !strings.Contains(out, fmt.Sprintf("%d changed", count)) {
		t.Errorf("apply after the upgrade: %q", out)
	}
	must(t, "cluster", "wait", "--timeout", "30s")
	name := prefix + "r-7"
	node := where(t, dir)[name]
	if len(node) != 1 {
		t.Fatalf("%s on %v", name, node)
	}
	n, _ := st.Node(node[0])
	var h *netns.NS
	if err := netns.InMountNS(n.MntPin, func() (err error) {
		h, err = netns.OpenPath(filepath.Join(n.RunDir, name))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var addrs []string
	err = rtnl.Inside(h, rtnl.Open, func(c *rtnl.Conn) error {
		all, err := c.Addrs()
		for _, as := range all {
			for _, a := range as {
				addrs = append(addrs, a.String())
			}
		}
		return err
	})
	if err != nil || !strings.Contains(strings.Join(addrs, " "), "10.99.7.1/24") {
		t.Errorf("%s after the change: %v, %v", name, addrs, err)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
