// Package cluster spreads one fleet over many nodes with etcd as the only
// shared state: which nodes are alive, what the fleet is, and which node
// serves which namespace.
//
// # Key layout (version 2)
//
// Every key lives under Prefix; a layout change gets a new prefix, so two
// versions never read each other's values. Values are JSON, and none is
// larger than MaxValueBytes: a fleet is many small keys (as Kubernetes
// cut Endpoints into EndpointSlices), so that no request passes etcd's
// defaults (1.5 MiB, 128 operations per transaction) at any fleet size,
// and a change to one namespace writes one key and wakes its watchers with
// one small event.
//
//	/nsfleet/v2/schema               "2"
//	/nsfleet/v2/specs/SPEC           SpecMeta: one applied spec (name, file, count)
//	/nsfleet/v2/ns/SPEC/NAME         spec.Namespace: one namespace, expanded
//	/nsfleet/v2/hosts/SPEC/IF        NAME: the spec's claim on a host interface
//	/nsfleet/v2/vni-next             the next VXLAN network identifier for a link
//	/nsfleet/v2/apply-lock/...       applies and deletes take turns (etcd mutex)
//	/nsfleet/v2/nodes/NODE           NodeInfo, bound to the node's lease
//	/nsfleet/v2/status/NODE          NodeStatus, bound to the node's lease
//	/nsfleet/v2/cordon/NODE          Cordon: the node takes no namespaces
//	/nsfleet/v2/assign/NODE/BB       Assignment: what NODE serves of the
//	                                 names in bucket BB (AssignBuckets of them)
//	/nsfleet/v2/assign-gen           bumped by every assignment transaction
//	/nsfleet/v2/failovers/REV/NODE   Failover, one per node lost (REV: the plan's, zero-padded)
//	/nsfleet/v2/force-failover/NODE  an operator's order to move a lost node's
//	                                 namespaces although most nodes are lost
//	/nsfleet/v2/failover-held/NODE   the scheduler holds NODE's failover (lost
//	                                 with most nodes) until it returns or is forced
//	/nsfleet/v2/scheduler/...        the scheduler election (etcd concurrency)
//
// Version 1 (/nsfleet/v1/) stored the whole spec as one YAML value and each
// node's assignment as one value; Migrate moves a running cluster from it
// (migrate.go).
//
// # Guarantees
//
// A node is alive while its lease is: its nodes/NODE key disappears when
// the lease expires. Exactly one scheduler (the elected one) writes
// assignments, and every write is one transaction that compares the
// election key (it is still the leader) and assign-gen (nobody wrote
// assignments since it read them): a second or stale scheduler's write
// fails instead of assigning a namespace twice.
//
// A namespace moves between two live nodes in two steps: the scheduler
// puts it in the old node's Releasing list; the old node tears it down and
// reports that in its status; only then does the scheduler place it
// elsewhere. A dead node's namespaces are placed at once: its agent fenced
// itself (host veths down, no creation) before its lease could expire.
package cluster

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Layout.
const (
	Prefix         = "/nsfleet/v2/"
	KeySchema      = Prefix + "schema"
	KeyAssignGen   = Prefix + "assign-gen"
	SpecsPrefix    = Prefix + "specs/"
	NsPrefix       = Prefix + "ns/"
	HostsPrefix    = Prefix + "hosts/"
	KeyVNINext     = Prefix + "vni-next"
	LockPrefix     = Prefix + "apply-lock"
	NodesPrefix    = Prefix + "nodes/"
	StatusPrefix   = Prefix + "status/"
	CordonPrefix   = Prefix + "cordon/"
	AssignPrefix   = Prefix + "assign/"
	FailoverPrefix = Prefix + "failovers/"
	ForcePrefix    = Prefix + "force-failover/"
	HeldPrefix     = Prefix + "failover-held/"
	ElectionPrefix = Prefix + "scheduler"
	SchemaVersion  = "2"
)

// MaxValueBytes bounds every value nsfleet stores.
const MaxValueBytes = 64 << 10

// AssignBuckets is how many keys one node's assignment is cut into, by a
// hash of the name: a node of 40,000 namespaces has values of about 10 KiB,
// and one of 250,000 stays under MaxValueBytes.
const AssignBuckets = 64

// Transactions are cut to stay inside etcd's defaults (--max-txn-ops 128,
// --max-request-bytes 1.5 MiB) with room to spare.
const (
	maxTxnOps   = 120
	maxTxnBytes = 1 << 20
)

// MaxFailovers is how many failover records are kept.
const MaxFailovers = 20

// SpecMeta describes one applied spec; its namespaces are the ns/SPEC/
// keys. Its key is written last by every apply, so its mod revision is the
// revision at which the spec, as applied, is whole.
type SpecMeta struct {
	Name      string    `json:"name"`
	Source    string    `json:"source"` // the file applied, for messages (file:line)
	Count     int       `json:"count"`
	Processes bool      `json:"processes,omitempty"` // some namespace runs processes
	Links     int       `json:"links,omitempty"`     // links between its namespaces
	Applied   time.Time `json:"applied"`
	Version   string    `json:"version,omitempty"` // of the nsfleet that applied it
}

// NodeInfo is what a live agent says about itself.
type NodeInfo struct {
	Name           string    `json:"name"`
	Capacity       int       `json:"capacity"` // 0: no limit
	AllowProcesses bool      `json:"allow_processes"`
	LeaseID        int64     `json:"lease_id"`
	LeaseTTL       float64   `json:"lease_ttl_seconds"`
	Started        time.Time `json:"started"`
	Version        string    `json:"version"`
	// PeerURL is where the agent answers its peers' failsafe question;
	// "": it does not take part.
	PeerURL string `json:"peer_url,omitempty"`
	// TunnelAddr is the node's underlay address for the VXLAN tunnels of
	// links between namespaces on two nodes; "": it makes none.
	TunnelAddr string `json:"tunnel_addr,omitempty"`
	// Returned is when the node came back: its agent joined with a new
	// lease after it had lost one. Balance moves nothing onto it for a
	// while (NodeView.Settling).
	Returned time.Time `json:"returned,omitzero"`
}

// NodeStatus is how far an agent has come with its assignment.
type NodeStatus struct {
	// AssignRev is the etcd revision up to which the node has taken
	// every change to its assignment and converged to it: everything in
	// it present, everything released torn down.
	AssignRev int64 `json:"assign_rev"`
	// SpecRev is the etcd revision up to which the node has taken every
	// change to the stored namespaces: every namespace assigned to it made
	// to match what was stored at that revision. Set with AssignRev, only
	// when the node has converged.
	SpecRev  int64     `json:"spec_rev"`
	Assigned int       `json:"assigned"`
	Ready    int       `json:"ready"`
	Failed   int       `json:"failed"`
	Errors   []string  `json:"errors,omitempty"` // the first few failures
	Fenced   bool      `json:"fenced"`
	Refused  string    `json:"refused,omitempty"` // why the spec is not served
	Updated  time.Time `json:"updated"`
}

// Converged reports whether the node has done what its assignment at
// revision rev asks (what the scheduler waits for before it moves a
// namespace; cluster status also compares SpecRev).
func (s NodeStatus) Converged(rev int64) bool {
	return s.AssignRev >= rev && !s.Fenced
}

// Cordon marks a node that takes no namespaces (drain).
type Cordon struct {
	Since  time.Time `json:"since"`
	Reason string    `json:"reason,omitempty"`
}

// Assignment is what one node serves (Names) and what it must tear down
// before the scheduler places it elsewhere (Releasing).
type Assignment struct {
	Names     []string `json:"names"`
	Releasing []string `json:"releasing,omitempty"`
}

// Failover records one lost node: when its loss was seen, how many
// namespaces moved where, and when all of them were ready again.
type Failover struct {
	Node     string         `json:"node"`
	Detected time.Time      `json:"detected"`
	Moved    int            `json:"moved"`
	To       map[string]int `json:"to"`
	// AssignRev is the revision of the written plan; 0 while the plan is
	// being written (a record goes first, so that a plan cut off between
	// transactions still has one).
	AssignRev  int64     `json:"assign_rev"`
	Ready      time.Time `json:"ready,omitzero"`
	Seconds    float64   `json:"seconds,omitempty"` // Detected to Ready
	Unassigned int       `json:"unassigned,omitempty"`
}

// SpecKey and the others name one spec's keys.
func SpecKey(spec string) string         { return SpecsPrefix + spec }
func NsKey(spec, name string) string     { return NsPrefix + spec + "/" + name }
func HostKey(spec, ifname string) string { return HostsPrefix + spec + "/" + ifname }

// NodeKey and the others name one node's keys.
func NodeKey(node string) string   { return NodesPrefix + node }
func StatusKey(node string) string { return StatusPrefix + node }
func CordonKey(node string) string { return CordonPrefix + node }

// AssignKey names one bucket of a node's assignment; AssignNodePrefix all
// of them.
func AssignKey(node string, bucket int) string {
	return fmt.Sprintf("%s%s/%02x", AssignPrefix, node, bucket)
}
func AssignNodePrefix(node string) string { return AssignPrefix + node + "/" }

// Bucket is the assignment bucket of a namespace name (FNV-1a).
func Bucket(name string) int {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h ^= uint32(name[i])
		h *= 16777619
	}
	return int(h % AssignBuckets)
}

// splitKey cuts a key below prefix into its two parts (SPEC/NAME,
// NODE/BB); ok is false for a key of another shape.
func splitKey(key, prefix string) (a, b string, ok bool) {
	rest, found := strings.CutPrefix(key, prefix)
	if !found {
		return "", "", false
	}
	a, b, ok = strings.Cut(rest, "/")
	return a, b, ok && a != "" && b != "" && !strings.Contains(b, "/")
}
func ForceKey(node string) string { return ForcePrefix + node }
func HeldKey(node string) string  { return HeldPrefix + node }

// FailoverKey orders failover records by the revision of the plan that
// moved the node's namespaces; the node's name keeps apart two nodes lost
// in one plan. (Records written before had no node part; they are read
// as well.)
func FailoverKey(rev int64, node string) string {
	return fmt.Sprintf("%s%020d/%s", FailoverPrefix, rev, node)
}

// NodeOf returns the node name in a key under prefix.
func NodeOf(key, prefix string) string { return strings.TrimPrefix(key, prefix) }

// ValidNodeName accepts names that are safe as key parts and file names.
func ValidNodeName(n string) error { return validKeyPart("node", n) }

// ValidSpecName accepts the names specs are stored under.
func ValidSpecName(n string) error { return validKeyPart("spec", n) }

func validKeyPart(what, n string) error {
	if n == "" || len(n) > 63 {
		return fmt.Errorf("%s name %q: want 1 to 63 characters", what, n)
	}
	for _, c := range n {
		if !keyChar(c) {
			return fmt.Errorf("%s name %q: only letters, digits, '-', '_' and '.'", what, n)
		}
	}
	return nil
}

// keyChar reports whether c may be in a key part (and a file name).
func keyChar(c rune) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
}

func encode(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own plain structs are encoded
	}
	return string(b)
}
