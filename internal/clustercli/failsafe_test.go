package clustercli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/cluster"
	"github.com/nsfleet/nsfleet/cluster/sim"
	"github.com/nsfleet/nsfleet/internal/nstest"
)

// hostVethsUp counts, per node and in all, the host veths named with
// prefix that are up in the nodes' kernels.
func hostVethsUp(t *testing.T, st *sim.Cluster, prefix string) (map[string]int, int) {
	t.Helper()
	out, total := map[string]int{}, 0
	for node, up := range vethsUpByNode(t, st, prefix) {
		out[node] = len(up)
		total += len(up)
	}
	return out, total
}

// upRouters applies count routers whose host veths are up, and waits
// until every one is up in the kernels and status is converged.
func upRouters(t *testing.T, st *sim.Cluster, prefix string, count int) {
	t.Helper()
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
}

// routersFromEnv is how many routers the fault tests serve: def, or
// NSFLEET_FAULT_ROUTERS for a run at scale (docs/RELIABILITY.md).
func routersFromEnv(def int) int {
	if n, err := strconv.Atoi(os.Getenv("NSFLEET_FAULT_ROUTERS")); err == nil && n > 0 {
		return n
	}
	return def
}

// etcdLeader returns the index (1..3) of the sim's etcd leader.
func etcdLeader(t *testing.T, st *sim.Cluster) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ep := "http://" + st.ProxyAddr
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: []string{ep}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	status, err := cli.Status(ctx, ep)
	if err != nil {
		t.Fatal(err)
	}
	members, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members.Members {
		if m.ID == status.Leader {
			k, err := strconv.Atoi(strings.TrimPrefix(m.Name, "m"))
			if err != nil {
				t.Fatalf("leader %q: %v", m.Name, err)
			}
			return k
		}
	}
	t.Fatalf("no leader among %v", members.Members)
	return 0
}

// TestEtcdQuorumLoss: etcd loses quorum for three lease TTLs while every
// node runs and reaches its peers. No node can renew its lease, none can
// take anything over, so none fences: every router's host veth stays up
// throughout (sampled every 100 ms in the nodes' kernels), and after etcd
// is back nothing fails over and nothing is re-created.
func TestEtcdQuorumLoss(t *testing.T) {
	nstest.RequireRoot(t)
	ttl := 4 * time.Second
	_, st := upSim(t, ttl)
	var stopped []int
	t.Cleanup(func() { // before the sim goes
		for _, pid := range stopped {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	prefix := nstest.Prefix(t)
	count := routersFromEnv(30)
	upRouters(t, st, prefix, count)
	before := map[string]map[string]uint64{}
	for _, n := range st.Nodes {
		before[n.Name] = pinCookies(t, st, n.Name)
	}

	// Quorum lost: two of the three members stopped, the leader among
	// them (the harder case: a leader that resumes revokes the leases
	// that expired by its clock while it was stopped).
	leader := etcdLeader(t, st)
	victims := []sim.Daemon{st.Members[leader-1], st.Members[leader%3]}
	t.Logf("stopping etcd members m%d (the leader) and m%d", leader, leader%3+1)
	for _, m := range victims {
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

// vethsUpByNode returns, per node, the host veths named with prefix that
// are up in that node's kernel.
func vethsUpByNode(t *testing.T, st *sim.Cluster, prefix string) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{}
	for node, up := range sim.UpLinks(st.Nodes) {
		out[node] = map[string]bool{}
		for name := range up {
			if strings.HasPrefix(name, prefix) {
				out[node][name] = true
			}
		}
	}
	live := 0
	for _, n := range st.Nodes {
		if !n.Killed {
			live++
		}
	}
	if len(out) != live {
		t.Fatalf("read the links of %d of %d nodes", len(out), live)
	}
	return out
}

// TestAgentPaused: one agent stopped (SIGSTOP) for two lease TTLs while
// its node runs. Its watchdog sets its host veths down before its lease
// can expire, so no router is up on two nodes at once for longer than the
// stated bound (1 s); the survivors take its routers over; after it
// resumes it tears down what moved and its routers move at most once
// (nothing is handed back while it settles).
func TestAgentPaused(t *testing.T) {
	nstest.RequireRoot(t)
	ttl := 4 * time.Second
	_, st := upSim(t, ttl)
	var paused int
	t.Cleanup(func() { // before the sim goes
		if paused != 0 {
			syscall.Kill(paused, syscall.SIGCONT)
		}
	})
	prefix := nstest.Prefix(t)
	count := routersFromEnv(30)
	upRouters(t, st, prefix, count)
	victim, err := st.Node("node-1")
	if err != nil {
		t.Fatal(err)
	}
	moved := map[string]bool{} // router (host veth) -> was on node-1
	for name := range vethsUpByNode(t, st, prefix)["node-1"] {
		moved[name] = true
	}
	if len(moved) == 0 {
		t.Fatal("node-1 serves nothing")
	}

	if err := syscall.Kill(victim.Agent.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused = victim.Agent.PID
	const sample = 100 * time.Millisecond
	twice := map[string]time.Duration{} // current run of samples up on two nodes
	worstTwice, worstName := time.Duration(0), ""
	watch := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(sample) {
			seen := map[string]int{}
			for _, up := range vethsUpByNode(t, st, prefix) {
				for name := range up {
					seen[name]++
				}
			}
			for name := range moved {
				if seen[name] > 1 {
					twice[name] += sample
					if twice[name] > worstTwice {
						worstTwice, worstName = twice[name], name
					}
				} else {
					twice[name] = 0
				}
			}
		}
	}
	watch(2 * ttl)
	syscall.Kill(paused, syscall.SIGCONT)
	paused = 0
	watch(2 * time.Second)
	t.Logf("agent paused %s: longest a router was up on two nodes: %s (%s)", 2*ttl, worstTwice, worstName)
	if worstTwice > time.Second {
		t.Errorf("%s was up on two nodes for %s (bound 1 s)", worstName, worstTwice)
	}
	// The survivors serve node-1's routers; they stay there while node-1
	// settles (moved once, not twice), and every router is up once.
	waitFor(t, "converged after the pause", 30*time.Second, func() string { return converged(t) })
	for end := time.Now().Add(2 * ttl); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		by := vethsUpByNode(t, st, prefix)
		if n := len(by["node-1"]); n != 0 {
			t.Fatalf("%d routers back on node-1 while it settles (moved twice)", n)
		}
		total := 0
		for _, up := range by {
			total += len(up)
		}
		if total != count {
			t.Fatalf("%d host veths up for %d routers", total, count)
		}
	}
}

// TestMassLossHeldThenForced: two of three nodes lost at once. The
// survivor takes none of their routers (likelier a network or etcd fault
// than two gateways at once); an operator who knows node-2 is gone forces
// its failover, and node-2's routers, only those, come up on the survivor.
// Checked in the survivor's kernel.
func TestMassLossHeldThenForced(t *testing.T) {
	nstest.RequireRoot(t)
	ttl := 4 * time.Second
	dir, st := upSim(t, ttl)
	prefix := nstest.Prefix(t)
	const count = 30
	upRouters(t, st, prefix, count)
	before := vethsUpByNode(t, st, prefix)
	// Half a second apart, as power fails in a rack: their leases then
	// expire in different ticks of etcd's revoke loop, so the first
	// looks like a lone loss unless the other's missed renewal counts.
	must(t, "sim", "kill", "node-2", "--dir", dir)
	time.Sleep(500 * time.Millisecond)
	must(t, "sim", "kill", "node-3", "--dir", dir)
	st, err := sim.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl + 3*time.Second) // both leases expired: a failover would have begun
	if got := vethsUpByNode(t, st, prefix)["node-1"]; len(got) != len(before["node-1"]) {
		t.Fatalf("node-1 serves %d routers, had %d: the failover was not held", len(got), len(before["node-1"]))
	}
	// Leases of nodes killed together expire up to a renewal apart; the
	// survivor's log tells whether this run saw one expire first.
	if b, err := os.ReadFile(filepath.Join(dir, "nodes", "node-1", "agent.log")); err == nil {
		t.Logf("the scheduler saw a dead node beside a suspect one: %v", strings.Contains(string(b), "missed a lease renewal"))
	}
	if out := must(t, "cluster", "status"); !strings.Contains(out, "failover held") {
		t.Errorf("status does not say the failover is held:\n%s", out)
	}
	if _, err := run(t, "cluster", "failover", "node-1"); err == nil || !strings.Contains(err.Error(), "alive") {
		t.Errorf("forcing the failover of a live node: %v", err)
	}

	must(t, "cluster", "failover", "node-2")
	took := waitFor(t, "node-2's routers up on node-1", ttl+10*time.Second, func() string {
		up := vethsUpByNode(t, st, prefix)["node-1"]
		for name := range before["node-2"] {
			if !up[name] {
				return name + " not up on node-1"
			}
		}
		for name := range before["node-3"] {
			if up[name] {
				return name + " (node-3's, still held) up on node-1"
			}
		}
		return ""
	})
	t.Logf("forced failover of node-2: its %d routers up on node-1 %s after the order", len(before["node-2"]), took.Round(time.Millisecond))
}
