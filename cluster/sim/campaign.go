package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
)

// A fault campaign (a Jepsen-style nemesis) applies random faults to a sim
// for a set time while a checker samples the ground truth from every
// node's kernel: which routers have their host veth up where. It counts
// routers up on two nodes at once for longer than DoubleBound, and routers
// up on no node for longer than AbsentBound.

// Fault is one kind of fault the nemesis applies, and undoes.
type Fault string

// The faults.
const (
	FaultKillNode      Fault = "kill-node"      // power loss; a new node is added
	FaultPartition     Fault = "partition"      // a node cut off from etcd and its peers, then healed
	FaultPauseAgent    Fault = "pause-agent"    // SIGSTOP an agent, SIGCONT after
	FaultStopMember    Fault = "stop-member"    // SIGSTOP one etcd member (quorum kept)
	FaultQuorumLoss    Fault = "quorum-loss"    // SIGSTOP two etcd members
	FaultRestartAgent  Fault = "restart-agent"  // kill an agent, start a new one
	FaultRestartMember Fault = "restart-member" // kill an etcd member, start it again
)

// AllFaults is every fault the nemesis knows.
var AllFaults = []Fault{FaultKillNode, FaultPartition, FaultPauseAgent, FaultStopMember, FaultQuorumLoss, FaultRestartAgent, FaultRestartMember}

// CampaignOptions configure Campaign. Routers maps each router's host
// veth (the first veth of each namespace of the stored spec) to its name.
type CampaignOptions struct {
	Dir      string
	Duration time.Duration
	Seed     uint64
	Faults   []Fault // nil: AllFaults
	Routers  map[string]string
	TTL      time.Duration
	// DoubleBound: how long a router may be up on two nodes (0: 1 s).
	DoubleBound time.Duration
	// AbsentBound: how long a router may be up on no node (0: TTL + 5 s:
	// the lease, then the scheduler and the creation of the moved
	// routers).
	AbsentBound time.Duration
	// Settle: after undoing a fault, how long to wait for every router to
	// be up on exactly one node before the next (0: 60 s).
	Settle time.Duration
	// Plant makes a violation on purpose (a router's host veth made by
	// hand, up, on a second node, for 3 s) to show that the checker sees
	// it.
	Plant bool
	// Healthy, if set, says what keeps the control plane from being
	// healthy ("" when it is): after a fault the next one waits for it
	// too, so that faults do not pile up unseen (an agent in failsafe
	// keeps the kernels right while etcd is still out).
	Healthy func() string
	Log     func(format string, a ...any)
	// Trace, if set, is told every change of where a router is up, and
	// every fault, with the time: the timeline behind a violation.
	Trace func(line string)
}

// Window is one stretch of time during which a router was up on two nodes
// (Nodes) or on none.
type Window struct {
	Router string        `json:"router"`
	Kind   string        `json:"kind"` // "double" or "absent"
	Nodes  []string      `json:"nodes,omitempty"`
	Start  time.Time     `json:"start"`
	Length time.Duration `json:"length_ns"`
	During string        `json:"during"` // the fault in force (or "settling")
}

func (w Window) String() string {
	s := fmt.Sprintf("%s %s for %s from %s during %s", w.Router, w.Kind, w.Length.Round(time.Millisecond), w.Start.Format("15:04:05.0"), w.During)
	if len(w.Nodes) > 0 {
		s += " on " + strings.Join(w.Nodes, "+")
	}
	return s
}

// CampaignReport is what a campaign found.
type CampaignReport struct {
	Seed        uint64                  `json:"seed"`
	Duration    time.Duration           `json:"duration_ns"`
	Routers     int                     `json:"routers"`
	Faults      map[Fault]int           `json:"faults"`
	Samples     int                     `json:"samples"`
	Violations  []Window                `json:"violations"`
	WorstDouble Window                  `json:"worst_double"`
	WorstAbsent Window                  `json:"worst_absent"`
	Unsettled   []string                `json:"unsettled,omitempty"` // faults after which the cluster did not settle in time
	Planted     string                  `json:"planted,omitempty"`   // the router of the planted violation
	Caught      bool                    `json:"caught,omitempty"`    // the checker reported it
	SettleTimes map[Fault]time.Duration `json:"settle_ns,omitempty"` // longest undo-to-settled per fault
}

// OK reports whether the campaign found nothing wrong (with Plant: only
// the planted violation, and it was caught).
func (r *CampaignReport) OK() bool {
	n := 0
	for _, v := range r.Violations {
		if r.Planted == "" || v.Router != r.Planted {
			n++
		}
	}
	return n == 0 && len(r.Unsettled) == 0 && (r.Planted == "" || r.Caught)
}

// checker samples the nodes' kernels.
type checker struct {
	o      CampaignOptions
	mu     sync.Mutex
	nodes  []NodeInfo // live nodes, as the nemesis last left them
	during string
	double map[string]*Window
	absent map[string]*Window
	report *CampaignReport
	where  map[string]string // router -> nodes up, as last traced
}

func (c *checker) setNodes(st *Cluster, during string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.o.Trace != nil && during != "" && during != c.during {
		c.o.Trace(time.Now().Format("15:04:05.000") + " -- " + during)
	}
	c.nodes = c.nodes[:0]
	for _, n := range st.Nodes {
		if !n.Killed {
			c.nodes = append(c.nodes, n)
		}
	}
	if during != "" {
		c.during = during
	}
}

// upByRouter reads which nodes have each watched router's host veth up.
func (c *checker) upByRouter() map[string][]string {
	c.mu.Lock()
	nodes := slices.Clone(c.nodes)
	c.mu.Unlock()
	out := map[string][]string{}
	for node, up := range UpLinks(nodes) {
		for name := range up {
			if r, ok := c.o.Routers[name]; ok {
				out[r] = append(out[r], node)
			}
		}
	}
	return out
}

// UpLinks reads, from each node's own kernel (its network namespace, not
// etcd), the links that are up there: the host ends of what it serves.
// A node whose namespace is gone (killed meanwhile) is left out.
func UpLinks(nodes []NodeInfo) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, n := range nodes {
		if n.Killed {
			continue
		}
		h, err := netns.OpenPath(n.NetPin)
		if err != nil {
			continue
		}
		up := map[string]bool{}
		err = rtnl.Inside(h, rtnl.OpenLite, func(conn *rtnl.Conn) error {
			links, err := conn.Links()
			for _, l := range links {
				if l.Up {
					up[l.Name] = true
				}
			}
			return err
		})
		h.Close()
		if err == nil {
			out[n.Name] = up
		}
	}
	return out
}

// sample takes one sample and updates the windows.
func (c *checker) sample(now time.Time) {
	up := c.upByRouter()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.report.Samples++
	for _, r := range c.o.Routers {
		nodes := up[r]
		if c.o.Trace != nil {
			slices.Sort(nodes)
			if w := strings.Join(nodes, "+"); w != c.where[r] {
				c.where[r] = w
				c.o.Trace(fmt.Sprintf("%s %s up on [%s]", now.Format("15:04:05.000"), r, w))
			}
		}
		c.track(c.double, r, "double", len(nodes) > 1, nodes, now, c.o.DoubleBound, &c.report.WorstDouble)
		c.track(c.absent, r, "absent", len(nodes) == 0, nil, now, c.o.AbsentBound, &c.report.WorstAbsent)
	}
}

// track extends or closes router r's window of kind; a window longer than
// bound is a violation (recorded once, with its final length).
func (c *checker) track(open map[string]*Window, r, kind string, on bool, nodes []string, now time.Time, bound time.Duration, worst *Window) {
	w := open[r]
	if !on {
		if w != nil {
			c.close(w, bound)
			delete(open, r)
		}
		return
	}
	if w == nil {
		w = &Window{Router: r, Kind: kind, Start: now, During: c.during}
		open[r] = w
	}
	w.Length = now.Sub(w.Start)
	if len(nodes) > len(w.Nodes) {
		w.Nodes = slices.Clone(nodes)
	}
	if w.Length > worst.Length {
		*worst = *w
	}
}

func (c *checker) close(w *Window, bound time.Duration) {
	if w.Length > bound {
		c.report.Violations = append(c.report.Violations, *w)
		if w.Router == c.report.Planted && w.Kind == "double" {
			c.report.Caught = true
		}
	}
}

// settled reports whether every router is up on exactly one node.
func (c *checker) settled() string {
	up := c.upByRouter()
	for _, r := range c.o.Routers {
		if n := len(up[r]); n != 1 {
			return fmt.Sprintf("%s up on %d nodes", r, n)
		}
	}
	return ""
}

// Campaign runs the nemesis and the checker on the sim in o.Dir.
func Campaign(ctx context.Context, o CampaignOptions) (*CampaignReport, error) {
	if o.Faults == nil {
		o.Faults = AllFaults
	}
	if o.DoubleBound <= 0 {
		o.DoubleBound = time.Second
	}
	if o.TTL <= 0 {
		o.TTL = 5 * time.Second
	}
	if o.AbsentBound <= 0 {
		o.AbsentBound = o.TTL + 5*time.Second
	}
	if o.Settle <= 0 {
		o.Settle = 60 * time.Second
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	if len(o.Routers) == 0 {
		return nil, fmt.Errorf("campaign: no routers to watch (apply a spec first)")
	}
	st, err := Load(o.Dir)
	if err != nil {
		return nil, err
	}
	rep := &CampaignReport{Seed: o.Seed, Routers: len(o.Routers), Faults: map[Fault]int{}, SettleTimes: map[Fault]time.Duration{}}
	c := &checker{o: o, double: map[string]*Window{}, absent: map[string]*Window{}, report: rep, during: "start", where: map[string]string{}}
	c.setNodes(st, "start")
	if bad := c.settled(); bad != "" {
		return nil, fmt.Errorf("campaign: the cluster is not settled before the first fault: %s", bad)
	}

	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-cctx.Done():
				return
			case now := <-t.C:
				c.sample(now)
			}
		}
	}()
	start := time.Now()
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))
	plantAt := time.Duration(-1)
	if o.Plant {
		plantAt = time.Duration(rng.Int64N(int64(max(o.Duration/2, time.Second))))
	}
	n := &nemesis{o: o, c: c, rng: rng, rep: rep}
	for time.Since(start) < o.Duration && ctx.Err() == nil {
		if plantAt >= 0 && time.Since(start) >= plantAt {
			plantAt = -1
			if err := n.plant(); err != nil {
				o.Log("campaign: plant: %v", err)
			}
			continue
		}
		f := o.Faults[rng.IntN(len(o.Faults))]
		if err := n.apply(ctx, f); err != nil {
			stop()
			wg.Wait()
			rep.Duration = time.Since(start)
			return rep, fmt.Errorf("campaign: %s: %w", f, err)
		}
	}
	stop()
	wg.Wait()
	// Close the windows still open at the end.
	for _, w := range c.double {
		c.close(w, o.DoubleBound)
	}
	for _, w := range c.absent {
		c.close(w, o.AbsentBound)
	}
	rep.Duration = time.Since(start)
	sort.Slice(rep.Violations, func(i, j int) bool { return rep.Violations[i].Start.Before(rep.Violations[j].Start) })
	return rep, nil
}

// nemesis applies faults one at a time: apply, hold, undo, then wait
// until every router is up on exactly one node again.
type nemesis struct {
	o   CampaignOptions
	c   *checker
	rng *rand.Rand
	rep *CampaignReport
}

func (n *nemesis) hold() time.Duration {
	return n.o.TTL + time.Duration(n.rng.Int64N(int64(2*n.o.TTL)))
}

func (n *nemesis) pickNode(st *Cluster) *NodeInfo {
	var live []*NodeInfo
	for i := range st.Nodes {
		if !st.Nodes[i].Killed {
			live = append(live, &st.Nodes[i])
		}
	}
	return live[n.rng.IntN(len(live))]
}

func (n *nemesis) apply(ctx context.Context, f Fault) error {
	st, err := Load(n.o.Dir)
	if err != nil {
		return err
	}
	node := n.pickNode(st)
	hold := n.hold()
	label := string(f)
	n.c.setNodes(st, label)
	var undo func() error
	switch f {
	case FaultKillNode:
		label += " " + node.Name
		n.o.Log("campaign: %s, then a new node", label)
		if err := Kill(n.o.Dir, node.Name); err != nil {
			return err
		}
		n.reload(label)
		undo = func() error { _, err := Add(n.o.Dir); return err }
	case FaultPartition:
		label += " " + node.Name
		n.o.Log("campaign: %s for %s", label, hold.Round(time.Millisecond))
		if err := Partition(n.o.Dir, node.Name); err != nil {
			return err
		}
		undo = func() error { return Heal(n.o.Dir, node.Name) }
	case FaultPauseAgent:
		label += " " + node.Name
		pid := node.Agent.PID
		n.o.Log("campaign: %s for %s", label, hold.Round(time.Millisecond))
		if err := signalDaemon(node.Agent, syscall.SIGSTOP); err != nil {
			return err
		}
		undo = func() error { return syscall.Kill(pid, syscall.SIGCONT) }
	case FaultStopMember, FaultQuorumLoss:
		k := 1 + n.rng.IntN(3)
		members := []Daemon{st.Members[k-1]}
		if f == FaultQuorumLoss {
			members = append(members, st.Members[k%3])
		}
		n.o.Log("campaign: %s (%d member(s)) for %s", label, len(members), hold.Round(time.Millisecond))
		for _, m := range members {
			if err := signalDaemon(m, syscall.SIGSTOP); err != nil {
				return err
			}
		}
		undo = func() error {
			for _, m := range members {
				syscall.Kill(m.PID, syscall.SIGCONT)
			}
			return nil
		}
	case FaultRestartAgent:
		label += " " + node.Name
		n.o.Log("campaign: %s", label)
		hold = 0
		if err := Restart(n.o.Dir, node.Name, ""); err != nil {
			return err
		}
		undo = func() error { return nil }
	case FaultRestartMember:
		k := 1 + n.rng.IntN(3)
		n.o.Log("campaign: %s m%d", label, k)
		hold = 0
		if err := RestartMember(n.o.Dir, k); err != nil {
			return err
		}
		undo = func() error { return nil }
	default:
		return fmt.Errorf("unknown fault %q", f)
	}
	n.rep.Faults[f]++
	sleepCtx(ctx, hold)
	if err := undo(); err != nil {
		return err
	}
	n.reload("settling after " + label)
	// Settled: every router up on exactly one node and the control plane
	// healthy, and still so one lease TTL later (what a fault sets off,
	// such as leases revoked when etcd returns, shows within a TTL).
	start := time.Now()
	var since time.Time
	for {
		bad := n.c.settled()
		if bad == "" && n.o.Healthy != nil {
			bad = n.o.Healthy()
		}
		switch {
		case bad != "":
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
			n.rep.SettleTimes[f] = max(n.rep.SettleTimes[f], time.Since(start))
		case time.Since(since) >= n.o.TTL:
			return nil
		}
		if time.Since(start) > n.o.Settle || ctx.Err() != nil {
			n.rep.Unsettled = append(n.rep.Unsettled, fmt.Sprintf("%s: not settled %s after: %s", label, n.o.Settle, bad))
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (n *nemesis) reload(during string) {
	if st, err := Load(n.o.Dir); err == nil {
		n.c.setNodes(st, during)
	}
}

// plant makes one router's host veth up on a second node by hand for 3 s:
// a violation the checker must report.
func (n *nemesis) plant() error {
	up := n.c.upByRouter()
	st, err := Load(n.o.Dir)
	if err != nil {
		return err
	}
	for host, r := range n.o.Routers {
		if len(up[r]) != 1 {
			continue
		}
		for i := range st.Nodes {
			other := &st.Nodes[i]
			if other.Killed || other.Name == up[r][0] {
				continue
			}
			h, err := netns.OpenPath(other.NetPin)
			if err != nil {
				continue
			}
			n.rep.Planted = r
			n.c.mu.Lock()
			n.c.during = "planted " + r + " on " + other.Name
			n.c.mu.Unlock()
			n.o.Log("campaign: planting %s (host veth %s) on %s too, for 3 s", r, host, other.Name)
			err = rtnl.Inside(h, rtnl.Open, func(c *rtnl.Conn) error {
				if err := c.AddVeth(rtnl.VethPair{Host: host, Peer: "plant0", PeerNsFd: -1}); err != nil {
					return err
				}
				l, err := c.LinkByName(host)
				if err != nil {
					return err
				}
				if err := c.SetUp(l.Index, true); err != nil {
					return err
				}
				time.Sleep(3 * time.Second)
				return c.DeleteLink(l.Index)
			})
			h.Close()
			return err
		}
	}
	return fmt.Errorf("no router to plant")
}

// signalDaemon signals d if it is still the process sim started.
func signalDaemon(d Daemon, sig syscall.Signal) error {
	if !d.alive() {
		return fmt.Errorf("%s (pid %d) is not running", d.Name, d.PID)
	}
	return syscall.Kill(d.PID, sig)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}
