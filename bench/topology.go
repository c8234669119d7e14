package bench

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
	"github.com/nsfleet/nsfleet/topo"
)

// topology compares nsfleet with the tool emulated networks are built with
// today, Mininet, on the same generated graph: a k-ary fat-tree, for k
// from --mark to --n in steps of --mark, until a tool fails or passes the
// time limit. nsfleet makes every node a namespace with /31s on its links
// and a loopback address (nsfleet topo fat-tree); Mininet makes the hosts
// namespaces with an address each and the switches Linux bridges in the
// host namespace (no controller, no traffic shaping: this kernel has no
// Open vSwitch). Both make the same number of nodes and links.
type topology struct{}

// TopologyTimeLimit is how long a tool may take to create (or tear down)
// one size; past it, that tool stops there and larger sizes skip it.
var TopologyTimeLimit = 10 * time.Minute

func init() {
	register(&Scenario{
		Name:     "topology",
		Describe: "emulated networks: a k-ary fat-tree made by nsfleet and by Mininet side by side, per k; creation and teardown time per node and link, what each leaves behind",
		N:        16,
		Mark:     4,
		Engines:  []string{"nsfleet", "mininet"},
		Variants: []string{"fat-tree"},
		Keys:     []string{"engine", "variant"},
		Run:      topology{}.Run,
	})
}

// topoOutcome is what one build and teardown of one size gave.
type topoOutcome struct {
	create, teardown    time.Duration
	nodes, links        int // made before the end or the limit
	leftLinks, leftNets int // left behind by the tool's own teardown
}

// errPastLimit marks a tool that passed TopologyTimeLimit.
var errPastLimit = errors.New("passed the time limit")

func (tp topology) Run(ctx context.Context, o Options, run *Run) error {
	sizes, err := fatTreeSizes(o.N, o.Mark)
	if err != nil {
		return err
	}
	run.Params["time_limit"] = TopologyTimeLimit.String()
	run.Notes = append(run.Notes,
		"mark = nodes of the fat-tree (5k²/4 switches + k³/4 hosts); it has 3k³/4 links",
		"nsfleet: every node a namespace, each link a veth made with its ends in their namespaces, a /31 on each end, a loopback address per node; teardown until the kernel has freed the namespaces",
		"mininet: hosts are namespaces (a shell each) with an address, switches Linux bridges with spanning tree in the host namespace, no controller; creation is build + start, teardown is Mininet's stop",
		"leftovers: interfaces and namespaces of the run still there after the tool's own teardown (this scenario then removes them)")
	done := map[string]bool{} // engines that stopped at some size
	for _, eng := range o.Engines {
		if why := topologyEngineMissing(eng); why != "" {
			run.Skipped = append(run.Skipped, "engine="+eng+": "+why)
			done[eng] = true
		}
	}
	for _, k := range sizes {
		t, err := topo.FatTree(o.Prefix, k)
		if err != nil {
			return err
		}
		for _, eng := range o.Engines {
			for rep := 0; rep < o.Runs && !done[eng]; rep++ {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				cfg := map[string]string{"engine": eng, "variant": "fat-tree"}
				o.Log.Info("run", "engine", eng, "k", k, "nodes", t.Routers(), "links", len(t.Edges), "rep", rep+1)
				var out topoOutcome
				if eng == "nsfleet" {
					out, err = tp.nsfleet(ctx, o, t, cfg, rep, run)
				} else {
					out, err = tp.mininet(ctx, o, t, cfg, rep, run)
				}
				if err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					done[eng] = true
					run.Notes = append(run.Notes, fmt.Sprintf("%s stopped at k=%d (%d nodes, %d links): %v; it had made %d nodes and %d links; larger sizes skip it",
						eng, k, t.Routers(), len(t.Edges), err, out.nodes, out.links))
					break
				}
				run.Samples = append(run.Samples, topoSamples(cfg, t.Routers(), rep, out)...)
			}
		}
	}
	return nil
}

// fatTreeSizes is k = mark, 2·mark, ... up to n, and n itself.
func fatTreeSizes(n, mark int) ([]int, error) {
	if n < 2 || n%2 != 0 || mark < 2 || mark%2 != 0 {
		return nil, fmt.Errorf("topology: --n (the largest k) and --mark (the step of k) must be even and at least 2, got %d and %d", n, mark)
	}
	var out []int
	for k := mark; k < n; k += mark {
		out = append(out, k)
	}
	return append(out, n), nil
}

func topoSamples(cfg map[string]string, mark, rep int, out topoOutcome) []Sample {
	items := float64(out.nodes + out.links)
	s := func(metric, unit, better string, v float64) Sample {
		return Sample{Config: cfg, Mark: mark, Metric: metric, Unit: unit, Better: better, Rep: rep, Value: v}
	}
	return []Sample{
		s("rate", "nodes+links/s", "higher", items/out.create.Seconds()),
		s("create", "s", "lower", out.create.Seconds()),
		s("create per node and link", "ms", "lower", out.create.Seconds()*1e3/items),
		s("teardown", "s", "lower", out.teardown.Seconds()),
		s("teardown per node and link", "ms", "lower", out.teardown.Seconds()*1e3/items),
		s("leftover interfaces", "count", "lower", float64(out.leftLinks)),
		s("leftover namespaces", "count", "lower", float64(out.leftNets)),
	}
}

func topologyEngineMissing(eng string) string {
	if eng != "mininet" {
		return ""
	}
	if err := exec.Command(systemPython, "-c", "import mininet.net").Run(); err != nil {
		return "Mininet not installed (Debian: apt-get install mininet bridge-utils)"
	}
	for _, p := range []string{"mnexec", "brctl", "ifconfig"} {
		if _, err := exec.LookPath(p); err != nil {
			return p + " not installed (Debian: apt-get install mininet bridge-utils net-tools)"
		}
	}
	return ""
}

// nsfleet makes t with nsfleet's engine from the spec `nsfleet topo`
// writes, then removes it and waits for the kernel.
func (topology) nsfleet(ctx context.Context, o Options, t *topo.Topology, cfg map[string]string, rep int, run *Run) (topoOutcome, error) {
	var out topoOutcome
	var b bytes.Buffer
	if err := t.Write(&b, topo.Options{Addressing: topo.DefaultAddressing}); err != nil {
		return out, err
	}
	fl, err := spec.Parse(t.Shape, b.Bytes(), spec.Options{})
	if err != nil {
		return out, err
	}
	rd, err := netns.OpenRunDir(o.RunDir, true)
	if err != nil {
		return out, err
	}
	defer cleanupNative(rd, o.Prefix)
	cctx, cancel := context.WithTimeout(ctx, TopologyTimeLimit)
	defer cancel()
	made := 0
	start := time.Now()
	sum, err := fleet.Up(cctx, fl, fleet.UpOptions{Options: fleet.Options{RunDir: rd, Workers: o.Workers, OnResult: func(fleet.Result) {
		if made++; o.Progress != nil && made%100 == 0 {
			o.Progress(ConfigKey(cfg, run.Keys), rep, made, t.Routers())
		}
	}}})
	out.create, out.nodes = time.Since(start), made
	if err == nil {
		err = sum.Err()
	}
	if err != nil {
		if cctx.Err() != nil && ctx.Err() == nil {
			return out, errPastLimit
		}
		return out, fmt.Errorf("up: %w (%v)", err, errors.Join(sum.Errors...))
	}
	out.links = len(t.Edges)
	start = time.Now()
	down, err := fleet.Down(cctx, fleet.Selector{Prefix: o.Prefix}, fleet.DownOptions{Options: fleet.Options{RunDir: rd}, Wait: true, Timeout: TopologyTimeLimit})
	out.teardown = time.Since(start)
	if err != nil {
		return out, fmt.Errorf("down: %w", err)
	}
	if len(down.Pending) > 0 {
		return out, fmt.Errorf("down: the kernel had not freed %d namespaces after %s", len(down.Pending), TopologyTimeLimit)
	}
	names, err := rd.Names()
	if err != nil {
		return out, err
	}
	for _, n := range names {
		if strings.HasPrefix(n, o.Prefix) {
			out.leftNets++
		}
	}
	out.leftLinks, err = countHostLinks(o.Prefix)
	return out, err
}

//go:embed mnbuild.py
var mnbuild []byte

// mnEvent is one line of mnbuild.py's output.
type mnEvent struct {
	Event string  `json:"event"`
	S     float64 `json:"s"`
	Nodes int     `json:"nodes"`
	Links int     `json:"links"`
	Error string  `json:"error"`
}

// mininet builds t with Mininet (mnbuild.py), under a short prefix of its
// own (Mininet names interfaces NODE-ethN, which must fit in 15 bytes),
// counts what its stop leaves and removes that.
func (topology) mininet(ctx context.Context, o Options, t *topo.Topology, cfg map[string]string, rep int, run *Run) (topoOutcome, error) {
	var out topoOutcome
	prefix, err := mininetPrefix()
	if err != nil {
		return out, err
	}
	defer removeMininetLeftovers(prefix)
	dir, err := os.MkdirTemp("", "nsfleet-mininet-")
	if err != nil {
		return out, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "mnbuild.py")
	if err := os.WriteFile(script, mnbuild, 0o644); err != nil {
		return out, err
	}
	in, err := json.Marshal(mininetGraph(t, prefix))
	if err != nil {
		return out, err
	}
	cmd := exec.Command(systemPython, script)
	cmd.Stdin = bytes.NewReader(in)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return out, err
	}
	if err := cmd.Start(); err != nil {
		return out, fmt.Errorf("start mininet: %w", err)
	}
	events := make(chan mnEvent)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev mnEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				events <- ev
			}
		}
	}()
	stop := func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	limit := time.NewTimer(TopologyTimeLimit)
	defer limit.Stop()
	total := t.Routers() + len(t.Edges)
	var built float64
	var failed error
read:
	for {
		select {
		case <-ctx.Done():
			stop()
			failed = ctx.Err()
			break read
		case <-limit.C:
			stop()
			failed = errPastLimit
			break read
		case ev, ok := <-events:
			if !ok {
				break read
			}
			switch ev.Event {
			case "progress":
				out.nodes, out.links = ev.Nodes, ev.Links
				if o.Progress != nil {
					o.Progress(ConfigKey(cfg, run.Keys), rep, ev.Nodes+ev.Links, total)
				}
			case "built":
				out.nodes, out.links, built = ev.Nodes, ev.Links, ev.S
			case "started":
				out.create = time.Duration((built + ev.S) * float64(time.Second))
				limit.Reset(TopologyTimeLimit) // teardown has a limit of its own
			case "stopped":
				out.teardown = time.Duration(ev.S * float64(time.Second))
			case "error":
				failed = errors.New(ev.Error)
			}
		}
	}
	for range events { // drain, so that the reader ends
	}
	werr := cmd.Wait()
	if failed == nil && (werr != nil || out.teardown == 0) {
		failed = fmt.Errorf("mininet exited (%v) before it stopped the network: %s", werr, lastLines(stderr.String(), 3))
	}
	if failed != nil {
		return out, failed
	}
	out.leftLinks, err = countHostLinks(prefix)
	if err != nil {
		return out, err
	}
	out.leftNets = len(processesWith("mininet:" + prefix))
	return out, nil
}

// mininetGraph names t's nodes for Mininet: the fat-tree's hosts are
// Mininet hosts (PREFIXhN), every other node a switch (PREFIXsN).
func mininetGraph(t *topo.Topology, prefix string) map[string]any {
	names := make([]string, t.Routers()+1)
	var hosts, switches []string
	k := 1
	for _, r := range t.Roles {
		host := strings.HasSuffix(r.Prefix, "host")
		for range r.Count {
			if host {
				names[k] = fmt.Sprintf("%sh%d", prefix, len(hosts)+1)
				hosts = append(hosts, names[k])
			} else {
				names[k] = fmt.Sprintf("%ss%d", prefix, len(switches)+1)
				switches = append(switches, names[k])
			}
			k++
		}
	}
	links := make([][2]string, len(t.Edges))
	for i, e := range t.Edges {
		links[i] = [2]string{names[e[0]], names[e[1]]}
	}
	return map[string]any{"hosts": hosts, "switches": switches, "links": links}
}

// mininetPrefix is "x" and three hex digits that no interface of the host
// namespace and no Mininet shell uses: what this run makes is then
// recognisable as its own.
func mininetPrefix() (string, error) {
	for try := 0; try < 64; try++ {
		p := fmt.Sprintf("x%03x", (os.Getpid()+try*7919+time.Now().Nanosecond())%0x1000)
		n, err := countHostLinks(p)
		if err != nil {
			return "", err
		}
		if n == 0 && len(processesWith("mininet:"+p)) == 0 {
			return p, nil
		}
	}
	return "", errors.New("mininet: no free name prefix")
}

// countHostLinks counts the host namespace's interfaces named prefix*.
func countHostLinks(prefix string) (int, error) {
	links, err := hostLinks(prefix)
	return len(links), err
}

func hostLinks(prefix string) ([]rtnl.Link, error) {
	c, err := rtnl.OpenLite()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	all, err := c.Links()
	if err != nil {
		return nil, err
	}
	var out []rtnl.Link
	for _, l := range all {
		if strings.HasPrefix(l.Name, prefix) {
			out = append(out, l)
		}
	}
	return out, nil
}

// processesWith lists the processes whose command line holds s.
func processesWith(s string) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []int
	self := os.Getpid()
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil || !bytes.Contains(b, []byte(s)) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if pid != self {
			pids = append(pids, pid)
		}
	}
	return pids
}

// removeMininetLeftovers ends this run's Mininet shells (by PID; their
// command lines carry the run's unique prefix) and deletes its interfaces
// in the host namespace, waiting up to a minute for the kernel.
func removeMininetLeftovers(prefix string) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		for _, pid := range processesWith("mininet:" + prefix) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		links, err := hostLinks(prefix)
		if err != nil || len(links) == 0 && len(processesWith("mininet:"+prefix)) == 0 {
			return
		}
		if c, err := rtnl.OpenLite(); err == nil {
			for _, l := range links {
				c.DeleteLink(l.Index) // a veth's end may go with its peer first
			}
			c.Close()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
}
