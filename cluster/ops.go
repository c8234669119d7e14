package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/spec"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Snapshot is every nsfleet key at one revision, decoded.
type Snapshot struct {
	Rev          int64
	Spec         *SpecDoc
	SpecRev      int64 // mod revision of the spec key; 0: none
	Nodes        map[string]NodeInfo
	Status       map[string]NodeStatus
	Cordons      map[string]Cordon
	Assign       map[string]Assignment
	AssignRev    map[string]int64 // mod revision of each assignment key
	AssignGenRev int64
	Failovers    []Failover
	FailoverRevs []int64 // the key revision of each failover record
	// Bad holds the keys whose value does not decode, and why; they are
	// left out of the maps above (Spec and Assign keep no value for
	// them). Readers decide: an agent keeps what it had, the scheduler
	// writes nothing while an assignment is unreadable.
	Bad map[string]error
	// Forced: lost nodes an operator ordered failed over (ForceKey).
	Forced map[string]bool
	// Held: lost nodes whose failover the scheduler holds (HeldKey).
	Held map[string]bool
}

// Unreadable names the keys the scheduler must be able to read (the spec
// and every assignment) that do not decode; nil when there are none.
func (s *Snapshot) Unreadable() error {
	var errs []error
	for _, k := range sortedKeys(s.Bad) {
		if k == KeySpec || strings.HasPrefix(k, AssignPrefix) {
			errs = append(errs, fmt.Errorf("etcd key %s does not decode: %w", k, s.Bad[k]))
		}
	}
	return errors.Join(errs...)
}

// Read takes a Snapshot with one range read.
func Read(ctx context.Context, cli *clientv3.Client) (*Snapshot, error) {
	resp, err := cli.Get(ctx, Prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	s := &Snapshot{
		Rev: resp.Header.Revision, Nodes: map[string]NodeInfo{}, Status: map[string]NodeStatus{},
		Cordons: map[string]Cordon{}, Assign: map[string]Assignment{}, AssignRev: map[string]int64{},
		Bad: map[string]error{}, Forced: map[string]bool{}, Held: map[string]bool{},
	}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		var err error
		switch {
		case k == KeySchema:
			if v := string(kv.Value); v != SchemaVersion {
				return nil, fmt.Errorf("etcd holds nsfleet key layout %q; this nsfleet reads %q", v, SchemaVersion)
			}
		case k == KeySpec:
			var v SpecDoc
			if err = json.Unmarshal(kv.Value, &v); err == nil {
				s.Spec = &v
			}
			s.SpecRev = kv.ModRevision
		case k == KeyAssignGen:
			s.AssignGenRev = kv.ModRevision
		case strings.HasPrefix(k, NodesPrefix):
			var v NodeInfo
			if err = json.Unmarshal(kv.Value, &v); err == nil {
				s.Nodes[NodeOf(k, NodesPrefix)] = v
			}
		case strings.HasPrefix(k, StatusPrefix):
			var v NodeStatus
			if err = json.Unmarshal(kv.Value, &v); err == nil {
				s.Status[NodeOf(k, StatusPrefix)] = v
			}
		case strings.HasPrefix(k, CordonPrefix):
			var v Cordon
			if err = json.Unmarshal(kv.Value, &v); err == nil {
				s.Cordons[NodeOf(k, CordonPrefix)] = v
			}
		case strings.HasPrefix(k, AssignPrefix):
			var v Assignment
			if err = json.Unmarshal(kv.Value, &v); err == nil {
				s.Assign[NodeOf(k, AssignPrefix)] = v
			}
			s.AssignRev[NodeOf(k, AssignPrefix)] = kv.ModRevision
		case strings.HasPrefix(k, ForcePrefix):
			s.Forced[NodeOf(k, ForcePrefix)] = true
		case strings.HasPrefix(k, HeldPrefix):
			s.Held[NodeOf(k, HeldPrefix)] = true
		case strings.HasPrefix(k, FailoverPrefix):
			var v Failover
			rev, perr := strconv.ParseInt(NodeOf(k, FailoverPrefix), 10, 64)
			if err = errors.Join(json.Unmarshal(kv.Value, &v), perr); err == nil {
				s.Failovers = append(s.Failovers, v)
				s.FailoverRevs = append(s.FailoverRevs, rev)
			}
		}
		if err != nil {
			s.Bad[k] = err
		}
	}
	return s, nil
}

// ParseSpec expands the stored spec with the same code as `nsfleet up`.
func (d *SpecDoc) ParseSpec() (*spec.Fleet, error) {
	return spec.Parse(d.Source, []byte(d.YAML), spec.Options{})
}

// MaxSpecBytes is the largest stored spec: etcd's default request limit
// (--max-request-bytes, 1.5 MiB) less room for the rest of the request.
const MaxSpecBytes = 1536*1024 - 4096

// ApplyResult says what Apply did.
type ApplyResult struct {
	Changed bool
	Rev     int64
	Count   int
}

// Apply stores a spec after validating all of it (the caller passes the
// file's bytes; f is its expansion). Storing is one put of one key, so two
// applies at once leave one of the two specs whole, never a mix. Applying
// the stored spec again changes nothing.
func Apply(ctx context.Context, cli *clientv3.Client, source string, yaml []byte, f *spec.Fleet) (ApplyResult, error) {
	doc := SpecDoc{Source: source, YAML: string(yaml), Count: len(f.Namespaces), Applied: time.Now().UTC()}
	if n := len(encode(doc)); n > MaxSpecBytes {
		return ApplyResult{}, fmt.Errorf("%s: the spec takes %.1f MiB stored (%d namespaces); etcd takes at most %.1f MiB in one request (its --max-request-bytes), and this key layout stores a spec whole: declare repeated namespaces as one template with a count, or split the fleet",
			source, float64(n)/(1<<20), len(f.Namespaces), float64(MaxSpecBytes)/(1<<20))
	}
	cur, err := cli.Get(ctx, KeySpec)
	if err != nil {
		return ApplyResult{}, err
	}
	var curRev int64
	if len(cur.Kvs) == 1 {
		var old SpecDoc
		if json.Unmarshal(cur.Kvs[0].Value, &old) == nil && old.YAML == doc.YAML && old.Source == doc.Source {
			return ApplyResult{Rev: cur.Kvs[0].ModRevision, Count: doc.Count}, nil
		}
		curRev = cur.Kvs[0].ModRevision
	}
	schema, err := cli.Get(ctx, KeySchema)
	if err != nil {
		return ApplyResult{}, err
	}
	if len(schema.Kvs) == 1 && string(schema.Kvs[0].Value) != SchemaVersion {
		return ApplyResult{}, fmt.Errorf("etcd holds nsfleet key layout %q; this nsfleet writes %q", schema.Kvs[0].Value, SchemaVersion)
	}
	// The put is guarded by the revision read, so that a concurrent apply
	// is reported instead of silently overwritten.
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(KeySpec), "=", curRev)).
		Then(clientv3.OpPut(KeySpec, encode(doc)), clientv3.OpPut(KeySchema, SchemaVersion)).
		Commit()
	if err != nil {
		return ApplyResult{}, err
	}
	if !resp.Succeeded {
		return ApplyResult{}, errors.New("another apply or delete changed the spec at the same moment: nothing stored; run it again")
	}
	return ApplyResult{Changed: true, Rev: resp.Header.Revision, Count: doc.Count}, nil
}

// ErrOtherSpec is returned by Delete when the cluster serves another spec.
var ErrOtherSpec = errors.New("the cluster serves a different spec")

// Delete removes the stored spec if it is the one given (force: any);
// every agent then tears down what it serves.
func Delete(ctx context.Context, cli *clientv3.Client, source string, yaml []byte, force bool) (bool, error) {
	cur, err := cli.Get(ctx, KeySpec)
	if err != nil {
		return false, err
	}
	if len(cur.Kvs) == 0 {
		return false, nil
	}
	var old SpecDoc
	if err := json.Unmarshal(cur.Kvs[0].Value, &old); err != nil {
		return false, fmt.Errorf("etcd key %s: %w", KeySpec, err)
	}
	if !force && old.YAML != string(yaml) {
		return false, fmt.Errorf("%w (%s, applied %s); give that spec, or --force", ErrOtherSpec, old.Source, old.Applied.Format(time.RFC3339))
	}
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(KeySpec), "=", cur.Kvs[0].ModRevision)).
		Then(clientv3.OpDelete(KeySpec)).Commit()
	if err != nil {
		return false, err
	}
	if !resp.Succeeded {
		return false, errors.New("the spec changed while deleting: nothing deleted; run it again")
	}
	return true, nil
}

// Drain cordons a node: the scheduler moves its namespaces away (two-step)
// and gives it none until Uncordon.
func Drain(ctx context.Context, cli *clientv3.Client, node, reason string) error {
	if err := ValidNodeName(node); err != nil {
		return err
	}
	_, err := cli.Put(ctx, CordonKey(node), encode(Cordon{Since: time.Now().UTC(), Reason: reason}))
	return err
}

// Pending says what keeps the namespaces named (none: every namespace of
// the stored spec) from being ready in the kernels at the stored spec's
// revision, or "" when they are. A namespace is ready when a live node
// holds it in its assignment and that node reports, from its kernel, that
// it matches the spec at that revision and the assignment (NodeStatus).
func Pending(s *Snapshot, names []string) string {
	if s.Spec == nil {
		if len(names) > 0 {
			return "no spec stored"
		}
		return ""
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
	if f, err := s.Spec.ParseSpec(); err == nil {
		missing := 0
		for _, n := range f.Names() {
			if _, ok := holder[n]; !ok {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Sprintf("%d namespaces not assigned to any node", missing)
		}
	}
	for _, node := range sortedKeys(s.Assign) {
		if why := nodeReady(node); why != "" {
			return why
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
	// Held: lost, but its namespaces stay assigned to it because more
	// than half of the nodes are lost at once (cluster failover NODE
	// forces the move).
	Held bool `json:"failover_held,omitempty"`
}

// Report is `nsfleet cluster status`.
type Report struct {
	Revision   int64        `json:"revision"`
	Spec       string       `json:"spec,omitempty"`
	SpecCount  int          `json:"spec_namespaces"`
	SpecRev    int64        `json:"spec_revision"`
	Assigned   int          `json:"assigned"`
	Unassigned int          `json:"unassigned"`
	Ready      int          `json:"ready"`
	Scheduler  string       `json:"scheduler,omitempty"`
	Nodes      []NodeReport `json:"nodes"`
	Failovers  []Failover   `json:"failovers"`
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
		st := StateOf(s, nil, false)
		markSettling(&st, s, time.Now(), DefaultSettle)
		for _, n := range Schedule(st).Held {
			held[n] = true
		}
	}
	for _, k := range sortedKeys(s.Bad) {
		r.Unreadable = append(r.Unreadable, k+": "+s.Bad[k].Error())
	}
	if s.Spec != nil {
		r.Spec, r.SpecCount = s.Spec.Source, s.Spec.Count
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
			Scheduler: r.Scheduler == n, Held: held[n],
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
