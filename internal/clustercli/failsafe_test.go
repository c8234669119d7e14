package clustercli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/cluster/sim"
	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
)

// hostVethsUp counts, per node, the host veths named with prefix that are
// up, from each node's own kernel (its network namespace).
func hostVethsUp(t *testing.T, st *sim.State, prefix string) (map[string]int, int) {
	t.Helper()
	out, total := map[string]int{}, 0
	for _, n := range st.Nodes {
		if n.Killed {
			continue
		}
		h, err := netns.OpenPath(n.NetPin)
		if err != nil {
			t.Fatal(err)
		}
		err = rtnl.Inside(h, rtnl.OpenLite, func(c *rtnl.Conn) error {
			links, err := c.Links()
			for _, l := range links {
				if strings.HasPrefix(l.Name, prefix) && l.Up {
					out[n.Name]++
					total++
				}
			}
			return err
		})
		h.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return out, total
}

// TestEtcdQuorumLoss: etcd loses quorum for three lease TTLs while every
// node runs and reaches its peers. No node can renew its lease, none can
// take anything over, so none fences: every router's host veth stays up
// throughout (sampled every 100 ms in the nodes' kernels), and after etcd
// is back nothing fails over and nothing is re-created.
func TestEtcdQuorumLoss(t *testing.T) {
	nstest.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "sim")
	ttl := 4 * time.Second
	must(t, "sim", "up", "--nodes", "3", "--dir", dir, "--lease-ttl", ttl.String())
	var stopped []int
	t.Cleanup(func() {
		for _, pid := range stopped {
			syscall.Kill(pid, syscall.SIGCONT)
		}
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "agent.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("%s (last 25 lines):\n%s", l, strings.Join(lines[max(0, len(lines)-25):], "\n"))
			}
		}
		if _, err := run(t, "sim", "down", "--dir", dir); err != nil {
			t.Error(err)
		}
	})
	st, err := sim.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NSFLEET_ETCD", "http://"+st.ProxyAddr)
	prefix := nstest.Prefix(t)
	const count = 30
	specFile := filepath.Join(t.TempDir(), "up.yaml")
	os.WriteFile(specFile, []byte(fmt.Sprintf(`namespaces:
  - name: "%[1]sr-{i}"
    count: %[2]d
    veths:
      - host: "%[1]sh{i}"
        peer: qr
        up: true
        host_ipv6: false
`, prefix, count)), 0o644)
	must(t, "cluster", "apply", "-f", specFile)
	waitFor(t, "every host veth up, status converged", 30*time.Second, func() string {
		if _, up := hostVethsUp(t, st, prefix); up != count {
			return fmt.Sprintf("%d of %d host veths up", up, count)
		}
		return converged(t)
	})
	before := map[string]map[string]uint64{}
	for _, n := range st.Nodes {
		before[n.Name] = pinCookies(t, st, n.Name)
	}

	// Quorum lost: two of the three members stopped.
	for _, m := range st.Members[1:] {
		if err := syscall.Kill(m.PID, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped = append(stopped, m.PID)
	}
	outage := 3 * ttl
	worst := count
	for end := time.Now().Add(outage); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		per, up := hostVethsUp(t, st, prefix)
		worst = min(worst, up)
		if up != count {
			t.Errorf("during the etcd outage: %d of %d host veths up (%v)", up, count, per)
			break
		}
	}
	for _, pid := range stopped {
		syscall.Kill(pid, syscall.SIGCONT)
	}
	stopped = nil
	t.Logf("etcd without quorum for %s: at worst %d of %d host veths up", outage, worst, count)

	waitFor(t, "converged again after etcd's return", 30*time.Second, func() string { return converged(t) })
	time.Sleep(ttl) // a failover or re-creation would show by now
	if _, up := hostVethsUp(t, st, prefix); up != count {
		t.Errorf("after the outage: %d of %d host veths up", up, count)
	}
	if r := status(t); len(r.Failovers) != 0 {
		t.Errorf("the etcd outage caused failovers: %+v", r.Failovers)
	}
	for _, n := range st.Nodes {
		after := pinCookies(t, st, n.Name)
		for name, c := range before[n.Name] {
			if after[name] != c {
				t.Errorf("%s on %s re-created or moved by the outage", name, n.Name)
			}
		}
	}
}
