// Package cluster spreads one fleet over many nodes with etcd as the only
// shared state: which nodes are alive, what the fleet is, and which node
// serves which namespace.
//
// # Key layout (version 1)
//
// Every key lives under Prefix; a layout change gets a new prefix, so two
// versions never read each other's values. Values are JSON.
//
//	/nsfleet/v1/schema            "1"
//	/nsfleet/v1/spec              SpecDoc: the spec's YAML source
//	/nsfleet/v1/nodes/NODE        NodeInfo, bound to the node's lease
//	/nsfleet/v1/status/NODE       NodeStatus, bound to the node's lease
//	/nsfleet/v1/cordon/NODE       Cordon: the node takes no namespaces
//	/nsfleet/v1/assign/NODE       Assignment: what NODE serves
//	/nsfleet/v1/assign-gen        bumped by every assignment transaction
//	/nsfleet/v1/failovers/REV     Failover, one per node lost (REV: zero-padded)
//	/nsfleet/v1/force-failover/NODE  an operator's order to move a lost node's
//	                              namespaces although most nodes are lost
//	/nsfleet/v1/failover-held/NODE   the scheduler holds NODE's failover (lost
//	                              with most nodes) until it returns or is forced
//	/nsfleet/v1/scheduler/...     the scheduler election (etcd concurrency)
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
	Prefix         = "/nsfleet/v1/"
	KeySchema      = Prefix + "schema"
	KeySpec        = Prefix + "spec"
	KeyAssignGen   = Prefix + "assign-gen"
	NodesPrefix    = Prefix + "nodes/"
	StatusPrefix   = Prefix + "status/"
	CordonPrefix   = Prefix + "cordon/"
	AssignPrefix   = Prefix + "assign/"
	FailoverPrefix = Prefix + "failovers/"
	ForcePrefix    = Prefix + "force-failover/"
	HeldPrefix     = Prefix + "failover-held/"
	ElectionPrefix = Prefix + "scheduler"
	SchemaVersion  = "1"
)

// MaxFailovers is how many failover records are kept.
const MaxFailovers = 20

// SpecDoc is the fleet as applied: the YAML as the user wrote it, so that
// every agent validates and expands it with the same code as `nsfleet up`.
type SpecDoc struct {
	Source  string    `json:"source"` // file name, for messages (file:line)
	YAML    string    `json:"yaml"`
	Count   int       `json:"count"` // namespaces it expands to
	Applied time.Time `json:"applied"`
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
	// Returned is when the node came back: its agent joined with a new
	// lease after it had lost one. Balance moves nothing onto it for a
	// while (NodeView.Settling).
	Returned time.Time `json:"returned,omitzero"`
}

// NodeStatus is how far an agent has come with its assignment.
type NodeStatus struct {
	// AssignRev is the mod revision of the node's assignment key that the
	// node has converged to: everything in it present, everything
	// released torn down.
	AssignRev int64 `json:"assign_rev"`
	// SpecRev is the mod revision of the stored spec that the node's
	// kernel matches: every namespace assigned to it made to match the
	// spec as stored at that revision. Set with AssignRev, only when the
	// node has converged.
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
	Node       string         `json:"node"`
	Detected   time.Time      `json:"detected"`
	Moved      int            `json:"moved"`
	To         map[string]int `json:"to"`
	AssignRev  int64          `json:"assign_rev"`
	Ready      time.Time      `json:"ready,omitzero"`
	Seconds    float64        `json:"seconds,omitempty"` // Detected to Ready
	Unassigned int            `json:"unassigned,omitempty"`
}

// NodeKey and the others name one node's keys.
func NodeKey(node string) string   { return NodesPrefix + node }
func StatusKey(node string) string { return StatusPrefix + node }
func CordonKey(node string) string { return CordonPrefix + node }
func AssignKey(node string) string { return AssignPrefix + node }
func ForceKey(node string) string  { return ForcePrefix + node }
func HeldKey(node string) string   { return HeldPrefix + node }

// FailoverKey orders failover records by revision.
func FailoverKey(rev int64) string { return fmt.Sprintf("%s%020d", FailoverPrefix, rev) }

// NodeOf returns the node name in a key under prefix.
func NodeOf(key, prefix string) string { return strings.TrimPrefix(key, prefix) }

// ValidNodeName accepts names that are safe as key parts and file names.
func ValidNodeName(n string) error {
	if n == "" || len(n) > 63 {
		return fmt.Errorf("node name %q: want 1 to 63 characters", n)
	}
	for _, c := range n {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
		if !ok {
			return fmt.Errorf("node name %q: only letters, digits, '-', '_' and '.'", n)
		}
	}
	return nil
}

func encode(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own plain structs are encoded
	}
	return string(b)
}
