package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Drain cordons a node: the scheduler moves its namespaces away (two-step)
// and gives it none until Uncordon.
func Drain(ctx context.Context, cli *clientv3.Client, node, reason string) error {
	if err := ValidNodeName(node); err != nil {
		return err
	}
	_, err := cli.Put(ctx, CordonKey(node), encode(Cordon{Since: time.Now().UTC(), Reason: reason}))
	return err
}

// Pending says what keeps the namespaces named (none: every stored
// namespace) from being ready in the kernels at the stored revision, or ""
// when they are. A namespace is ready when a live node holds it in its
// assignment and that node reports, from its kernel, that it matches what
// is stored and its assignment (NodeStatus) at or after the last apply.
func Pending(s *Snapshot, names []string) string {
	if len(s.Names) == 0 && len(names) > 0 {
		return "no namespaces stored"
	}
	holder := map[string]string{}
	for node, a := range s.Assign {
		for _, n := range a.Names {
			holder[n] = node
		}
	}
	nodeReady := func(node string) string {
		if _, alive := s.Nodes[node]; !alive {
			return node + " is lost"
		}
		st := s.Status[node]
		switch {
		case st.Fenced:
			return node + " is fenced"
		case !st.Converged(s.AssignRev[node]) || st.SpecRev < s.SpecRev:
			return fmt.Sprintf("%s has not converged to spec revision %d (%d of %d ready)", node, s.SpecRev, st.Ready, st.Assigned)
		}
		return ""
	}
	if len(names) > 0 {
		for _, n := range names {
			node, ok := holder[n]
			if !ok {
				return n + " is not assigned to any node"
			}
			if why := nodeReady(node); why != "" {
				return n + ": " + why
			}
		}
		return ""
	}
	missing := 0
	for _, n := range s.Names {
		if _, ok := holder[n]; !ok {
			missing++
		}
	}
	if missing > 0 {
		return fmt.Sprintf("%d namespaces not assigned to any node", missing)
	}
	for _, node := range sortedKeys(s.Assign) {
		if why := nodeReady(node); why != "" {
			return why
		}
	}
	// A node with nothing assigned (a spec deleted, a node drained) is
	// done only when its status says it serves nothing any more.
	for _, node := range sortedKeys(s.Nodes) {
		if _, assigned := s.Assign[node]; !assigned && s.Status[node].Assigned > 0 {
			return fmt.Sprintf("%s still serves %d namespaces no longer assigned to it", node, s.Status[node].Assigned)
		}
	}
	return ""
}

// ForceFailover orders the scheduler to move a lost node's namespaces even
// though more than half of the nodes are lost at once (when they are
// really gone, not cut off). It refuses a node that is alive or holds
// nothing.
func ForceFailover(ctx context.Context, cli *clientv3.Client, node string) error {
	if err := ValidNodeName(node); err != nil {
		return err
	}
	s, err := Read(ctx, cli)
	if err != nil {
		return err
	}
	if _, alive := s.Nodes[node]; alive {
		return fmt.Errorf("node %s is alive (it holds its lease): drain it instead", node)
	}
	if a, ok := s.Assign[node]; !ok || len(a.Names)+len(a.Releasing) == 0 {
		return fmt.Errorf("node %s holds no namespaces", node)
	}
	_, err = cli.Put(ctx, ForceKey(node), time.Now().UTC().Format(time.RFC3339))
	return err
}

// Uncordon lets a node take namespaces again.
func Uncordon(ctx context.Context, cli *clientv3.Client, node string) (bool, error) {
	if err := ValidNodeName(node); err != nil {
		return false, err
	}
	resp, err := cli.Delete(ctx, CordonKey(node))
	if err != nil {
		return false, err
	}
	return resp.Deleted > 0, nil
}

// NodeReport is one node's line in Report.
type NodeReport struct {
	Name           string   `json:"name"`
	Alive          bool     `json:"alive"`
	LeaseTTL       int64    `json:"lease_ttl_left_seconds"` // -1: no lease
	Capacity       int      `json:"capacity"`
	AllowProcesses bool     `json:"allow_processes"`
	Cordoned       bool     `json:"cordoned"`
	Assigned       int      `json:"assigned"`
	Releasing      int      `json:"releasing"`
	Ready          int      `json:"ready"`
	Failed         int      `json:"failed"`
	Converged      bool     `json:"converged"`
	Fenced         bool     `json:"fenced"`
	Refused        string   `json:"refused,omitempty"`
	Errors         []string `json:"errors,omitempty"`
	Scheduler      bool     `json:"scheduler"`
	// Legacy: the node's agent still runs key layout 1 (an upgrade in
	// progress): it keeps serving what it holds; restart it with this
	// version.
	Legacy bool `json:"legacy,omitempty"`
	// Held: lost, but its namespaces stay assigned to it because more
	// than half of the nodes are lost at once (cluster failover NODE
	// forces the move).
	Held bool `json:"failover_held,omitempty"`
}

// SpecReport is one stored spec in a Report.
type SpecReport struct {
	Name       string    `json:"name"`
	Source     string    `json:"source"`
	Namespaces int       `json:"namespaces"`
	Applied    time.Time `json:"applied"`
}

// Report is `nsfleet cluster status`.
type Report struct {
	Revision   int64        `json:"revision"`
	Specs      []SpecReport `json:"specs"`
	SpecCount  int          `json:"spec_namespaces"`
	SpecRev    int64        `json:"spec_revision"`
	Assigned   int          `json:"assigned"`
	Unassigned int          `json:"unassigned"`
	Ready      int          `json:"ready"`
	Scheduler  string       `json:"scheduler,omitempty"`
	Nodes      []NodeReport `json:"nodes"`
	Failovers  []Failover   `json:"failovers"`
	// Links between stored namespaces, and how many of them join two
	// nodes (each a VXLAN tunnel, see fleet.Tunnel).
	Links    int `json:"links,omitempty"`
	LinksCut int `json:"links_cut,omitempty"`
	// Unreadable: keys whose value does not decode, and why.
	Unreadable []string `json:"unreadable,omitempty"`
}

// Status reads the cluster into a Report.
func Status(ctx context.Context, cli *clientv3.Client) (*Report, error) {
	s, err := Read(ctx, cli)
	if err != nil {
		return nil, err
	}
	r := &Report{Revision: s.Rev, SpecRev: s.SpecRev, Nodes: []NodeReport{}, Failovers: s.Failovers}
	if r.Failovers == nil {
		r.Failovers = []Failover{}
	}
	held := map[string]bool{}
	if len(s.Assign) > 0 {
		st := ViewOf(s, nil)
		markSettling(&st, s, time.Now(), DefaultSettle)
		for _, n := range Schedule(st).Held {
			held[n] = true
		}
	}
	for _, k := range sortedKeys(s.Bad) {
		r.Unreadable = append(r.Unreadable, k+": "+s.Bad[k].Error())
	}
	r.SpecCount = len(s.Names)
	count := map[string]int{}
	for _, sp := range s.SpecOf {
		count[sp]++
	}
	r.Specs = []SpecReport{}
	for _, name := range sortedKeys(s.Specs) {
		m := s.Specs[name]
		r.Specs = append(r.Specs, SpecReport{Name: name, Source: m.Source, Namespaces: count[name], Applied: m.Applied})
	}
	if leader, err := schedulerName(ctx, cli); err == nil {
		r.Scheduler = leader
	}
	names := map[string]bool{}
	for n := range s.Nodes {
		names[n] = true
	}
	for n := range s.Assign {
		names[n] = true
	}
	for n := range s.Cordons {
		names[n] = true
	}
	for _, n := range sortedKeys(names) {
		info, alive := s.Nodes[n]
		st := s.Status[n]
		a := s.Assign[n]
		_, cord := s.Cordons[n]
		nr := NodeReport{
			Name: n, Alive: alive, LeaseTTL: -1, Capacity: info.Capacity, AllowProcesses: info.AllowProcesses,
			Cordoned: cord, Assigned: len(a.Names), Releasing: len(a.Releasing), Ready: st.Ready, Failed: st.Failed,
			Converged: alive && st.Converged(s.AssignRev[n]) && st.SpecRev >= s.SpecRev, Fenced: st.Fenced, Refused: st.Refused, Errors: st.Errors,
			Scheduler: r.Scheduler == n, Held: held[n], Legacy: s.Legacy[n],
		}
		if alive && info.LeaseID != 0 {
			if ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(info.LeaseID)); err == nil {
				nr.LeaseTTL = ttl.TTL
			}
		}
		r.Assigned += nr.Assigned
		r.Ready += nr.Ready
		r.Nodes = append(r.Nodes, nr)
	}
	if g, err := ReadGraph(ctx, cli, s); err == nil {
		r.Links, r.LinksCut = g.Links(), g.Cut(Placement(s.Assign))
	}
	if r.Unassigned = r.SpecCount - r.Assigned; r.Unassigned < 0 {
		r.Unassigned = 0
	}
	sort.Slice(r.Failovers, func(i, j int) bool { return r.Failovers[i].Detected.After(r.Failovers[j].Detected) })
	return r, nil
}

// schedulerName returns the node that leads the scheduler election.
func schedulerName(ctx context.Context, cli *clientv3.Client) (string, error) {
	resp, err := cli.Get(ctx, ElectionPrefix+"/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		return "", errors.Join(err, concurrency.ErrElectionNoLeader)
	}
	return string(resp.Kvs[0].Value), nil
}
