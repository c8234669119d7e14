package clustercli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/internal/reexec"

	"github.com/nsfleet/nsfleet/bench"
	"github.com/nsfleet/nsfleet/cluster"
	"github.com/nsfleet/nsfleet/cluster/sim"
	"github.com/nsfleet/nsfleet/internal/companion"
	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"golang.org/x/sys/unix"
)

// The sim's daemons run this test binary: with this variable set it is
// the cluster binary.
const mainEnv = "NSFLEET_CLUSTER_TEST_MAIN"

func TestMain(m *testing.M) {
	reexec.Dispatch()
	if os.Getenv(mainEnv) == "1" {
		os.Exit(Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Setenv(mainEnv, "1")
	nstest.Main(m)
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Run(context.Background(), args, &out, &errb)
	if code != 0 {
		return out.String(), fmt.Errorf("nsfleet %s: exit %d: %s", strings.Join(args, " "), code, errb.String())
	}
	return out.String(), nil
}

func must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := run(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// where returns, for each router, the nodes that hold it (from the
// nodes' mount tables).
func where(t *testing.T, dir string) map[string][]string {
	t.Helper()
	m, err := sim.Ls(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for node, names := range m {
		for _, n := range names {
			out[n] = append(out[n], node)
		}
	}
	return out
}

// exactlyOnce says what is wrong with the placement, or "".
func exactlyOnce(w map[string][]string, names []string, not string) string {
	var bad []string
	for _, n := range names {
		switch nodes := w[n]; {
		case len(nodes) == 0:
			bad = append(bad, n+" on no node")
		case len(nodes) > 1:
			bad = append(bad, n+" on "+strings.Join(nodes, "+"))
		case nodes[0] == not:
			bad = append(bad, n+" still on "+not)
		}
	}
	if len(bad) > 3 {
		bad = append(bad[:3], fmt.Sprintf("and %d more", len(bad)-3))
	}
	return strings.Join(bad, "; ")
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() string) time.Duration {
	t.Helper()
	start := time.Now()
	last := ""
	for time.Since(start) < timeout {
		if last = cond(); last == "" {
			return time.Since(start)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s: %s", what, timeout, last)
	return 0
}

func status(t *testing.T) *cluster.Report {
	t.Helper()
	r, err := tryStatus(t)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// tryStatus is status for a loop that may wait out an etcd that does not
// answer for a while.
func tryStatus(t *testing.T) (*cluster.Report, error) {
	t.Helper()
	out, err := run(t, "cluster", "status", "-o", "json")
	if err != nil {
		return nil, err
	}
	var r cluster.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	return &r, nil
}

// pinCookies returns the network namespace cookie of each pin on a node:
// unlike a namespace's inode number, which the kernel reuses as soon as
// the namespace is freed, a cookie is never given twice.
func pinCookies(t *testing.T, st *sim.Cluster, node string) map[string]uint64 {
	t.Helper()
	n, err := st.Node(node)
	if err != nil {
		t.Fatal(err)
	}
	var handles []*netns.NS
	var names []string
	err = netns.InMountNS(n.MntPin, func() error {
		ents, err := os.ReadDir(n.RunDir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if h, err := netns.OpenPath(filepath.Join(n.RunDir, e.Name())); err == nil {
				handles = append(handles, h)
				names = append(names, e.Name())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for i, h := range handles {
		netns.Do(h, func() error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
			if err == nil {
				out[names[i]] = c
			}
			return err
		})
		h.Close()
	}
	return out
}

// upSim makes a 3-node sim for a test, reached through NSFLEET_ETCD; it is
// removed when the test ends, and its agents' last log lines are shown if
// the test failed. args go to sim up.
func upSim(t *testing.T, ttl time.Duration, args ...string) (string, *sim.Cluster) {
	t.Helper()
	return upSimIn(t, filepath.Join(t.TempDir(), "sim"), ttl, args...)
}

// upSimIn is upSim in dir (which must not exist yet).
func upSimIn(t *testing.T, dir string, ttl time.Duration, args ...string) (string, *sim.Cluster) {
	t.Helper()
	must(t, append([]string{"sim", "up", "--nodes", "3", "--dir", dir, "--lease-ttl", ttl.String()}, args...)...)
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "agent.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("%s (last 40 lines):\n%s", l, strings.Join(lines[max(0, len(lines)-40):], "\n"))
			}
			members, _ := filepath.Glob(filepath.Join(dir, "etcd", "*", "member.log"))
			for _, l := range members {
				b, _ := os.ReadFile(l)
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("%s (last 15 lines):\n%s", l, strings.Join(lines[max(0, len(lines)-15):], "\n"))
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
	return dir, st
}

// TestSim runs one sim through the life of a gateway fleet: apply, agent
// restart, drain, uncordon, partition and heal, node loss, bad input.
func TestSim(t *testing.T) {
	nstest.RequireRoot(t)
	// Long enough for a restarted agent to renew its predecessor's lease
	// on a loaded CI machine.
	ttl := 4 * time.Second
	dir, st := upSim(t, ttl)

	prefix := nstest.Prefix(t)
	const count = 90
	specFile := filepath.Join(t.TempDir(), "routers.yaml")
	if err := os.WriteFile(specFile, []byte(nstest.FakeRouters(prefix, count)), 0o644); err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := 1; i <= count; i++ {
		names = append(names, fmt.Sprintf("%sbar-%d", prefix, i))
	}
	once := func(not string) func() string {
		return func() string { return exactlyOnce(where(t, dir), names, not) }
	}

	t.Run("apply", func(t *testing.T) {
		must(t, "cluster", "apply", "-f", specFile)
		if out := must(t, "cluster", "apply", "-f", specFile); !strings.Contains(out, "nothing written") {
			t.Errorf("second apply: %q", out)
		}
		waitFor(t, "every router on exactly one node", 30*time.Second, once(""))
		for node, names := range func() map[string][]string { m, _ := sim.Ls(dir); return m }() {
			if len(names) != count/3 {
				t.Errorf("%s holds %d, want %d (balanced)", node, len(names), count/3)
			}
		}
		waitFor(t, "status all ready", 10*time.Second, func() string {
			r := status(t)
			if r.Ready != count || r.Unassigned != 0 {
				return fmt.Sprintf("%d ready, %d unassigned", r.Ready, r.Unassigned)
			}
			return ""
		})
	})

	t.Run("completion", func(t *testing.T) {
		// What a TAB after drain, uncordon, delete, wait or sim kill offers.
		for _, c := range []struct{ args, want string }{
			{"cluster drain ", "node-1 node-2 node-3"},
			{"cluster delete r", "routers"},
			{"cluster wait " + prefix + "bar-8", prefix + "bar-8 " + prefix + "bar-80 " + prefix + "bar-81 " + prefix + "bar-82 " + prefix + "bar-83 " + prefix + "bar-84 " + prefix + "bar-85 " + prefix + "bar-86 " + prefix + "bar-87 " + prefix + "bar-88 " + prefix + "bar-89"},
			{"sim kill --dir " + dir + " node-", "node-1 node-2 node-3"},
		} {
			args := strings.Split(c.args, " ")
			out := must(t, append([]string{"__complete"}, args...)...)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if got := strings.Join(lines[:len(lines)-1], " "); got != c.want || lines[len(lines)-1] != ":4" {
				t.Errorf("%s<TAB>: %q %s, want %q", c.args, got, lines[len(lines)-1], c.want)
			}
		}
	})

	t.Run("drift repaired from events", func(t *testing.T) {
		n, err := st.Node("node-1")
		if err != nil {
			t.Fatal(err)
		}
		before := pinCookies(t, st, "node-1")
		var victim, other string
		for name := range before {
			if victim == "" {
				victim = name
			} else if other == "" {
				other = name
			}
		}
		// Another tool deletes one namespace and sets lo down in another.
		err = netns.InMountNS(n.MntPin, func() error {
			if err := netns.UnpinFile(filepath.Join(n.RunDir, victim)); err != nil {
				return err
			}
			h, err := netns.OpenPath(filepath.Join(n.RunDir, other))
			if err != nil {
				return err
			}
			defer h.Close()
			return rtnl.Inside(h, rtnl.OpenLite, func(c *rtnl.Conn) error { return c.SetUp(rtnl.LoopbackIndex, false) })
		})
		if err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, "both repaired", 2*time.Second, func() string {
			after := pinCookies(t, st, "node-1")
			if after[victim] == 0 || after[victim] == before[victim] {
				return victim + " not re-created"
			}
			up := false
			netns.InMountNS(n.MntPin, func() error {
				h, err := netns.OpenPath(filepath.Join(n.RunDir, other))
				if err != nil {
					return err
				}
				defer h.Close()
				return rtnl.Inside(h, rtnl.OpenLite, func(c *rtnl.Conn) error {
					lo, err := c.LinkByIndex(rtnl.LoopbackIndex)
					up = err == nil && lo.Up
					return err
				})
			})
			if !up {
				return other + ": lo still down"
			}
			return ""
		})
		t.Logf("drift repaired %s after it was made", took.Round(time.Millisecond))
	})

	t.Run("restart adopts", func(t *testing.T) {
		before := pinCookies(t, st, "node-3")
		must(t, "sim", "restart", "node-3", "--dir", dir)
		time.Sleep(ttl) // longer than the restart: a failover would show
		waitFor(t, "status all ready", 10*time.Second, func() string {
			if r := status(t); r.Ready != count {
				return fmt.Sprintf("%d ready", r.Ready)
			}
			return ""
		})
		after := pinCookies(t, st, "node-3")
		if len(after) != len(before) || len(before) == 0 {
			t.Fatalf("node-3 had %d pins, has %d", len(before), len(after))
		}
		for n, ino := range before {
			if after[n] != ino {
				t.Errorf("%s re-created by the restarted agent", n)
			}
		}
		if r := status(t); len(r.Failovers) != 0 {
			t.Errorf("restart caused a failover: %+v", r.Failovers)
		}
	})

	t.Run("drain and uncordon", func(t *testing.T) {
		must(t, "cluster", "drain", "node-1", "--wait", "30s")
		waitFor(t, "node-1 empty, the rest once", 10*time.Second, once("node-1"))
		must(t, "cluster", "uncordon", "node-1")
		waitFor(t, "node-1 takes its share again", 30*time.Second, func() string {
			if bad := once("")(); bad != "" {
				return bad
			}
			m, _ := sim.Ls(dir)
			if len(m["node-1"]) < count/3-1 {
				return fmt.Sprintf("node-1 holds %d", len(m["node-1"]))
			}
			return ""
		})
	})

	t.Run("partition and heal", func(t *testing.T) {
		must(t, "sim", "partition", "node-2", "--dir", dir)
		// The survivors take node-2's routers once its lease expires.
		waitFor(t, "survivors hold every router", ttl+15*time.Second, func() string {
			w := where(t, dir)
			for _, n := range names {
				ok := false
				for _, node := range w[n] {
					ok = ok || node != "node-2"
				}
				if !ok {
					return n + " only on node-2"
				}
			}
			return ""
		})
		must(t, "sim", "heal", "node-2", "--dir", dir)
		took := waitFor(t, "after heal: no router twice, none lost", ttl+2*time.Second, once(""))
		t.Logf("converged %s after heal", took.Round(time.Millisecond))
	})

	t.Run("node lost", func(t *testing.T) {
		waitFor(t, "balanced before the kill", 30*time.Second, func() string {
			m, _ := sim.Ls(dir)
			if len(m["node-3"]) == 0 {
				return "node-3 holds nothing yet"
			}
			return once("")()
		})
		start := time.Now()
		must(t, "sim", "kill", "node-3", "--dir", dir)
		took := waitFor(t, "node-3's routers on the survivors", ttl+20*time.Second, once("node-3"))
		t.Logf("failover: all routers on survivors %s after the kill (lease TTL %s)", took.Round(time.Millisecond), ttl)
		waitFor(t, "failover recorded", 10*time.Second, func() string {
			for _, f := range status(t).Failovers {
				if f.Node == "node-3" && !f.Ready.IsZero() {
					if f.Moved == 0 {
						return "failover moved nothing"
					}
					return ""
				}
			}
			return "no finished failover for node-3"
		})
		_ = start
	})

	t.Run("bad input", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "bad.yaml")
		os.WriteFile(bad, []byte("namespaces:\n  - name: \"x-{i}\"\n    count: 2\n    veths:\n      - host: \"this-name-is-far-too-long-{i}\"\n        peer: p\n"), 0o644)
		_, err := run(t, "cluster", "apply", "-f", bad)
		if err == nil || !strings.Contains(err.Error(), "bad.yaml:5") {
			t.Errorf("bad spec: want an error at bad.yaml:5, got %v", err)
		}
		if r := status(t); r.SpecCount != count {
			t.Errorf("after a refused apply the cluster serves %d namespaces", r.SpecCount)
		}

		// A heterogeneous spec of 16,000 routers (2.5 MB of YAML, past
		// etcd's request limit) fits: a dry run says how it would be
		// cut (the real write is TestApplyLarge's).
		var big strings.Builder
		big.WriteString("namespaces:\n")
		for i := 0; i < 16000; i++ {
			fmt.Fprintf(&big, "  - name: \"%sbig-%d\"\n    veths:\n      - host: \"%sb%d\"\n        peer: qr\n        peer_addresses: [\"10.%d.%d.1/24\"]\n", prefix, i, prefix, i, i/250, i%250)
		}
		bigFile := filepath.Join(t.TempDir(), "big.yaml")
		os.WriteFile(bigFile, []byte(big.String()), 0o644)
		if out, err := run(t, "cluster", "apply", "-f", bigFile, "--dry-run"); err != nil || !strings.Contains(out, "16000 added") || !strings.Contains(out, "would write 32001 keys") {
			t.Errorf("large spec, dry run: %q, %v", out, err)
		}
		if r := status(t); len(r.Specs) != 1 || r.SpecCount != count {
			t.Errorf("after a dry run: specs %+v, %d namespaces", r.Specs, r.SpecCount)
		}

		// Two applies at once: each succeeds or is refused; the result is
		// one of the two specs, whole.
		other := filepath.Join(t.TempDir(), "other.yaml")
		os.WriteFile(other, []byte(nstest.FakeRouters(prefix, count-10)), 0o644)
		var wg sync.WaitGroup
		for _, f := range []string{specFile, other} {
			wg.Add(1)
			go func() { defer wg.Done(); run(t, "cluster", "apply", "-f", f, "--name", "routers") }()
		}
		wg.Wait()
		if r := status(t); r.SpecCount != count && r.SpecCount != count-10 {
			t.Errorf("after concurrent applies the spec has %d namespaces", r.SpecCount)
		}
		// The same names under another spec: refused, naming both files.
		if _, err := run(t, "cluster", "apply", "-f", other); err == nil || !strings.Contains(err.Error(), "routers.yaml:2") || !strings.Contains(err.Error(), "other.yaml:2") {
			t.Errorf("names claimed by two specs: %v", err)
		}
		must(t, "cluster", "apply", "-f", specFile)

		start := time.Now()
		_, err = run(t, "cluster", "status", "--etcd", "http://127.0.0.1:1", "--dial-timeout", "1s")
		if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") || time.Since(start) > 3*time.Second {
			t.Errorf("unreachable etcd: %v after %s", err, time.Since(start))
		}
	})

	t.Run("metrics and health", func(t *testing.T) {
		n, err := st.Node("node-1")
		if err != nil {
			t.Fatal(err)
		}
		body := httpGetIn(t, n.NetPin, sim.MetricsAddr(n.Index), "/metrics")
		for _, want := range []string{"nsfleet_namespaces_ready{node=\"node-1\"}", "nsfleet_namespaces_desired{node=\"node-1\"}", "nsfleet_reconcile_duration_seconds_count", "nsfleet_fenced{node=\"node-1\"} 0"} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
		if body := httpGetIn(t, n.NetPin, sim.MetricsAddr(n.Index), "/healthz"); !strings.Contains(body, "200 OK") {
			t.Errorf("/healthz: %s", body)
		}
	})

	t.Run("processes refused", func(t *testing.T) {
		withProc := filepath.Join(t.TempDir(), "procs.yaml")
		os.WriteFile(withProc, []byte(nstest.FakeRouters(prefix, count)+"    processes:\n      - name: idle\n        command: [sleep, \"1000\"]\n"), 0o644)
		must(t, "cluster", "apply", "-f", withProc, "--name", "routers")
		waitFor(t, "no node serves a spec with processes", 20*time.Second, func() string {
			r := status(t)
			if r.Unassigned != count {
				return fmt.Sprintf("%d unassigned", r.Unassigned)
			}
			for _, n := range r.Nodes {
				if n.AllowProcesses {
					return n.Name + " says it allows processes"
				}
			}
			m, _ := sim.Ls(dir)
			for node, ns := range m {
				if len(ns) > 0 {
					return fmt.Sprintf("%s still holds %d", node, len(ns))
				}
			}
			return ""
		})
		if out := must(t, "cluster", "status"); !strings.Contains(out, "refused") {
			t.Errorf("status does not show which nodes refuse processes:\n%s", out)
		}
		must(t, "cluster", "apply", "-f", specFile)
		waitFor(t, "served again", 30*time.Second, once(""))
	})

	t.Run("delete", func(t *testing.T) {
		must(t, "cluster", "delete", "-f", specFile)
		waitFor(t, "every node empty", 20*time.Second, func() string {
			m, _ := sim.Ls(dir)
			for node, ns := range m {
				if len(ns) > 0 {
					return fmt.Sprintf("%s holds %d", node, len(ns))
				}
			}
			return ""
		})
	})
}

// TestFailoverScenario runs the lab's failover scenario small, with this
// test binary as the cluster binary.
func TestFailoverScenario(t *testing.T) {
	nstest.RequireRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(companion.Cluster.Env, self)
	s, err := bench.Lookup("failover")
	if err != nil {
		t.Fatal(err)
	}
	run, err := bench.Execute(context.Background(), s, bench.Options{N: 60, Prefix: nstest.Prefix(t), RunDir: nstest.RunDir(t).Path})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, x := range run.Samples {
		got[x.Metric] = x.Value
	}
	if got["routers moved"] < 10 || got["failover (kill to all ready)"] < 1 || got["one-node up of the moved routers"] <= 0 {
		t.Fatalf("implausible failover run: %v (skipped %v)", got, run.Skipped)
	}
	t.Logf("failover of %.0f routers: %.2fs (TTL %s), one-node up %.3fs", got["routers moved"], got["failover (kill to all ready)"], "5s", got["one-node up of the moved routers"])
}

// httpGetIn sends one HTTP GET from inside the namespace pinned at pin
// (the socket is made there) and returns the whole response.
func httpGetIn(t *testing.T, pin, addr, path string) string {
	t.Helper()
	resp, err := tryHTTPGetIn(pin, addr, path)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// tryHTTPGetIn is httpGetIn for a server that may not listen yet.
func tryHTTPGetIn(pin, addr, path string) (string, error) {
	ns, err := netns.OpenPath(pin)
	if err != nil {
		return "", err
	}
	defer ns.Close()
	var conn net.Conn
	if err := netns.Do(ns, func() (err error) { conn, err = net.DialTimeout("tcp", addr, 2*time.Second); return err }); err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr)
	b, _ := io.ReadAll(conn)
	return string(b), nil
}
