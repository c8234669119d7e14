package sim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/sysctl"
	"golang.org/x/sys/unix"
)

// Options of Up.
type Options struct {
	Dir            string
	Nodes          int
	Binary         string        // nsfleet-cluster to run the daemons; "": this executable
	AgentBinary    string        // runs the agents instead; "": Binary
	LeaseTTL       time.Duration // agents' --lease-ttl; 0: their default
	Capacity       int
	AllowProcesses bool
	Log            func(format string, a ...any)
}

// MaxNodes is bounded by the node subnets (198.19.k.0/24).
const MaxNodes = 250

// Up makes the sim: hub, etcd members, proxy, nodes with agents. On
// failure it removes what it made.
func Up(ctx context.Context, o Options) (st *Cluster, err error) {
	if o.Nodes < 1 || o.Nodes > MaxNodes {
		return nil, fmt.Errorf("sim up: --nodes %d: want 1 to %d", o.Nodes, MaxNodes)
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(statePath(dir)); err == nil {
		return nil, fmt.Errorf("sim up: %s already holds a sim (nsfleet sim down --dir %s removes it)", dir, dir)
	}
	made := false
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		made = true
	}
	if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o700); err != nil {
		return nil, fmt.Errorf("sim up: %w", err)
	}
	bin := o.Binary
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	if o.AgentBinary != "" {
		if o.AgentBinary, err = filepath.Abs(o.AgentBinary); err != nil {
			return nil, err
		}
	}
	st = &Cluster{Dir: dir, Binary: bin, AgentBinary: o.AgentBinary, MadeDir: made, Capacity: o.Capacity, Procs: o.AllowProcesses}
	if o.LeaseTTL > 0 {
		st.LeaseTTL = o.LeaseTTL.String()
	}
	defer func() {
		if err != nil {
			st.save()
			Down(st.Dir, o.Log)
			err = fmt.Errorf("sim up: %w (everything made was removed)", err)
		}
	}()
	if err := st.makeHub(); err != nil {
		return st, err
	}
	o.Log("hub namespace made; starting 3 etcd members")
	if err := st.startMembers(); err != nil {
		return st, err
	}
	if err := st.startProxy(); err != nil {
		return st, err
	}
	if err := st.save(); err != nil {
		return st, err
	}
	env := fmt.Sprintf("NSFLEET_ETCD=http://%s\n", st.ProxyAddr)
	if err := os.WriteFile(filepath.Join(dir, "etcd.env"), []byte(env), 0o644); err != nil {
		return st, err
	}
	for k := 1; k <= o.Nodes; k++ {
		if err := st.addNode(k); err != nil {
			return st, err
		}
		if err := st.save(); err != nil {
			return st, err
		}
	}
	o.Log("%d nodes started; waiting for etcd and the agents", o.Nodes)
	return st, nil
}

// Add adds one node with the next free index.
func Add(dir string) (*NodeInfo, error) {
	st, err := Load(dir)
	if err != nil {
		return nil, err
	}
	k := 1
	for _, n := range st.Nodes {
		k = max(k, n.Index+1)
	}
	if k > MaxNodes {
		return nil, fmt.Errorf("sim add: at most %d nodes", MaxNodes)
	}
	if err := st.addNode(k); err != nil {
		st.save()
		return nil, fmt.Errorf("sim add: %w", err)
	}
	return &st.Nodes[len(st.Nodes)-1], st.save()
}

func (st *Cluster) nsPin(name string) string { return filepath.Join(st.Dir, "ns", name) }

// pinNet makes a network namespace, runs setup inside it, and pins it.
func pinNet(path string, setup func(in *rtnl.Conn) error) (*netns.NS, error) {
	ns, err := netns.Create(func(inside *netns.NS) error {
		c, err := rtnl.Open()
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.SetUp(rtnl.LoopbackIndex, true); err != nil {
			return err
		}
		return setup(c)
	})
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		ns.Close()
		return nil, err
	}
	f.Close()
	if err := unix.Mount(ns.Path(), path, "", unix.MS_BIND, ""); err != nil {
		ns.Close()
		os.Remove(path)
		return nil, fmt.Errorf("pin %s: %w", path, err)
	}
	return ns, nil
}

func (st *Cluster) makeHub() error {
	st.HubPin = st.nsPin("hub")
	hub, err := pinNet(st.HubPin, func(c *rtnl.Conn) error {
		for k := 1; k <= 3; k++ {
			if err := c.AddAddr(rtnl.LoopbackIndex, netip.MustParsePrefix(MemberAddr(k)+"/32")); err != nil {
				return err
			}
		}
		// The hub routes between nodes (their agents ask each other).
		p, err := sysctl.Open()
		if err != nil {
			return err
		}
		defer p.Close()
		return p.Write("net.ipv4.ip_forward", "1")
	})
	if err != nil {
		return fmt.Errorf("hub namespace: %w", err)
	}
	hub.Close()
	return nil
}

// start runs the cluster binary with args as a daemon (own session, output
// to log) inside netNS (nil: here) and the mount namespace at mntPin.
func (st *Cluster) start(name string, nice int, args []string, netPin, mntPin, log string) (Daemon, error) {
	out, err := os.OpenFile(log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return Daemon{}, err
	}
	defer out.Close()
	cmd := exec.Command(st.Binary, args...)
	if nice != 0 {
		// nice(1): the process and every thread it starts.
		cmd = exec.Command("nice", append([]string{"-n", strconv.Itoa(nice), st.Binary}, args...)...)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	var ns *netns.NS
	if netPin != "" {
		if ns, err = netns.OpenPath(netPin); err != nil {
			return Daemon{}, err
		}
		defer ns.Close()
	}
	if err := netns.StartIn(cmd, ns, mntPin); err != nil {
		return Daemon{}, fmt.Errorf("start %s: %w", name, err)
	}
	d := Daemon{Name: name, PID: cmd.Process.Pid, Log: log}
	d.Start, _ = procStart(d.PID)
	cmd.Process.Release()
	return d, nil
}

// memberNice is the etcd members' nice value. They stand for etcd's own
// machines, which a real cluster's gateways do not starve: here they share
// two cores with every node's kernel work (a failover of 13,000 routers
// and the kernel freeing the lost node's as many), and at the same
// priority they missed their heartbeats and stopped committing.
const memberNice = -10

func (st *Cluster) startMembers() error {
	for k := 1; k <= 3; k++ {
		d, err := st.startMember(k)
		if err != nil {
			return err
		}
		st.Members = append(st.Members, d)
	}
	return nil
}

// startMember starts etcd member k (1..3) in the hub, on its data dir.
func (st *Cluster) startMember(k int) (Daemon, error) {
	var cluster []string
	for j := 1; j <= 3; j++ {
		cluster = append(cluster, fmt.Sprintf("m%d=http://%s:2380", j, MemberAddr(j)))
	}
	name := fmt.Sprintf("m%d", k)
	data := filepath.Join(st.Dir, "etcd", name)
	if err := os.MkdirAll(data, 0o700); err != nil {
		return Daemon{}, err
	}
	return st.start("etcd "+name, memberNice, []string{"__etcd-member", "--name", name, "--data-dir", data,
		"--client", "http://" + MemberAddr(k) + ":2379", "--peer", "http://" + MemberAddr(k) + ":2380",
		"--initial-cluster", strings.Join(cluster, ",")}, st.HubPin, "", filepath.Join(data, "member.log"))
}

// RestartMember kills etcd member k (1..3) with SIGKILL and starts it
// again on its data: a crashed member that comes back.
func RestartMember(dir string, k int) error {
	st, err := Load(dir)
	if err != nil {
		return err
	}
	if k < 1 || k > len(st.Members) {
		return fmt.Errorf("sim: no etcd member %d", k)
	}
	st.Members[k-1].kill(syscall.SIGKILL, 5*time.Second)
	// The old member's sockets can outlive it for a moment: a member
	// that dies at once for want of its port is started again.
	var d Daemon
	for try := 0; ; try++ {
		if d, err = st.startMember(k); err != nil {
			return fmt.Errorf("sim: restart etcd member %d: %w", k, err)
		}
		time.Sleep(500 * time.Millisecond)
		if d.alive() {
			break
		}
		if try == 10 {
			return fmt.Errorf("sim: restart etcd member %d: it exits at once: %s", k, lastLines(filepath.Join(st.Dir, "etcd", fmt.Sprintf("m%d", k), "member.log")))
		}
	}
	st.Members[k-1] = d
	return st.save()
}

func (st *Cluster) startProxy() error {
	addrFile := filepath.Join(st.Dir, "proxy.addr")
	os.Remove(addrFile)
	d, err := st.start("proxy", 0, []string{"sim", "__sim-proxy", "--hub", st.HubPin, "--addr-file", addrFile,
		"--to", strings.Join(Endpoints(), ",")}, "", "", filepath.Join(st.Dir, "proxy.log"))
	if err != nil {
		return err
	}
	st.Proxy = d
	for i := 0; i < 100; i++ {
		if b, err := os.ReadFile(addrFile); err == nil && len(b) > 0 {
			st.ProxyAddr = strings.TrimSpace(string(b))
			return nil
		}
		if !d.alive() {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("etcd proxy did not start: %s", lastLines(d.Log))
}

func nodeName(k int) string { return fmt.Sprintf("node-%d", k) }

func (st *Cluster) addNode(k int) error {
	n := NodeInfo{Name: nodeName(k), Index: k, NetPin: st.nsPin(nodeName(k)), Binary: st.AgentBinary}
	ndir := filepath.Join(st.Dir, "nodes", n.Name)
	n.RunDir = filepath.Join(ndir, "netns")
	n.MntPin = filepath.Join(ndir, "mnt")
	if err := os.MkdirAll(n.RunDir, 0o755); err != nil {
		return err
	}
	hubSide, nodeSide := netip.MustParsePrefix(fmt.Sprintf("198.19.%d.1/24", k)), netip.MustParsePrefix(fmt.Sprintf("198.19.%d.2/24", k))
	node, err := pinNet(n.NetPin, func(c *rtnl.Conn) error { return nil })
	if err != nil {
		return fmt.Errorf("%s: namespace: %w", n.Name, err)
	}
	defer node.Close()
	hub, err := netns.OpenPath(st.HubPin)
	if err != nil {
		return err
	}
	defer hub.Close()
	// The pair is made from the hub, its other end created in the node.
	hubLink := fmt.Sprintf("n-%d", k)
	err = rtnl.Inside(hub, rtnl.Open, func(c *rtnl.Conn) error {
		if err := c.AddVeth(rtnl.VethPair{Host: hubLink, Peer: "eth0", PeerNsFd: node.Fd()}); err != nil {
			return err
		}
		l, err := c.LinkByName(hubLink)
		if err != nil {
			return err
		}
		if err := c.AddAddr(l.Index, hubSide); err != nil {
			return err
		}
		return c.SetUp(l.Index, true)
	})
	if err != nil {
		return fmt.Errorf("%s: link to the hub: %w", n.Name, err)
	}
	err = rtnl.Inside(node, rtnl.Open, func(c *rtnl.Conn) error {
		l, err := c.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := c.AddAddr(l.Index, nodeSide); err != nil {
			return err
		}
		if err := c.SetUp(l.Index, true); err != nil {
			return err
		}
		if err := c.ReplaceRoute(rtnl.Route{To: netip.MustParsePrefix("198.18.0.0/24"), Via: hubSide.Addr()}); err != nil {
			return err
		}
		// The other nodes, through the hub (the failsafe's peer checks).
		return c.ReplaceRoute(rtnl.Route{To: netip.MustParsePrefix("198.19.0.0/16"), Via: hubSide.Addr()})
	})
	if err != nil {
		return fmt.Errorf("%s: node address: %w", n.Name, err)
	}
	if err := netns.NewMountNS(n.MntPin, nil); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	st.Nodes = append(st.Nodes, n)
	return st.startAgent(&st.Nodes[len(st.Nodes)-1])
}

func (st *Cluster) startAgent(n *NodeInfo) error {
	args := []string{"agent", "--node", n.Name, "--etcd", strings.Join(Endpoints(), ","),
		"--run-dir", n.RunDir, "--metrics-addr", MetricsAddr(n.Index), "--peer-addr", PeerAddr(n.Index)}
	if n.Binary == "" {
		// The sim's own agents serve their Go profiles, read from inside
		// the node (another binary, as in an upgrade, may not know the
		// flag).
		args = append(args, "--enable-pprof")
	}
	if st.LeaseTTL != "" {
		args = append(args, "--lease-ttl", st.LeaseTTL)
	}
	if st.Capacity > 0 {
		args = append(args, "--capacity", strconv.Itoa(st.Capacity))
	}
	if st.Procs {
		args = append(args, "--allow-processes")
	}
	bin := st.Binary
	if n.Binary != "" {
		st.Binary = n.Binary
		defer func() { st.Binary = bin }()
	}
	d, err := st.start("agent "+n.Name, 0, args, n.NetPin, n.MntPin, filepath.Join(filepath.Dir(n.RunDir), "agent.log"))
	if err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	n.Agent = d
	n.Killed = false
	return nil
}

// Ls lists, per node, the namespaces pinned in its run dir as the kernel
// shows them (the node's mount table), not as etcd says.
func Ls(dir string) (map[string][]string, error) {
	st, err := Load(dir)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, n := range st.Nodes {
		if n.Killed {
			continue
		}
		names := []string{}
		err := netns.InMountNS(n.MntPin, func() error {
			f, err := os.Open("/proc/thread-self/mountinfo")
			if err != nil {
				return err
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			prefix := n.RunDir + "/"
			for sc.Scan() {
				// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS ... - FSTYPE SOURCE SUPER
				f := strings.Fields(sc.Text())
				if len(f) < 10 {
					continue
				}
				mp := f[4]
				dash := 6
				for dash < len(f) && f[dash] != "-" {
					dash++
				}
				if dash+1 >= len(f) || f[dash+1] != "nsfs" || !strings.HasPrefix(mp, prefix) {
					continue
				}
				if name := strings.TrimPrefix(mp, prefix); !strings.Contains(name, "/") {
					names = append(names, name)
				}
			}
			return sc.Err()
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.Name, err)
		}
		sort.Strings(names)
		out[n.Name] = dedupe(names)
	}
	return out, nil
}

func dedupe(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// Down removes everything the sim made: agents and their processes, etcd
// members, the proxy, every namespace and pin, and DIR if sim made it.
func Down(dir string, logf func(string, ...any)) error {
	st, err := Load(dir)
	if err != nil {
		return err
	}
	var errs []error
	for i := range st.Nodes {
		if !st.Nodes[i].Killed {
			errs = append(errs, st.removeNode(&st.Nodes[i]))
		}
	}
	for _, m := range st.Members {
		m.kill(syscall.SIGTERM, 5*time.Second)
		m.kill(syscall.SIGKILL, 5*time.Second)
	}
	st.Proxy.kill(syscall.SIGKILL, 5*time.Second)
	if st.HubPin != "" {
		errs = append(errs, netns.UnpinFile(st.HubPin))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if st.MadeDir {
		return os.RemoveAll(st.Dir)
	}
	for _, p := range []string{"ns", "nodes", "etcd", "sim.json", "etcd.env", "proxy.addr", "proxy.log"} {
		os.RemoveAll(filepath.Join(st.Dir, p))
	}
	return nil
}

// lastLines returns the end of a log, for an error about to remove it.
func lastLines(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "no log"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}
