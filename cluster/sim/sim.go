// Package sim makes a whole nsfleet cluster on one machine, like kind does
// for Kubernetes: a three-member etcd cluster and N nodes, each node its
// own network namespace and mount namespace (so its run dir, its pins and
// its host-side veth names are its own, as on a real machine), each with
// a real agent process running inside it.
//
// Network: a hub namespace holds the etcd members (198.18.0.1-3 on its
// lo); node k reaches it over a veth, node side 198.19.k.2/24 and hub side
// 198.19.k.1/24 (the hub end is called n-k). Partitioning a node sets its
// hub end down; healing sets it up. From where sim runs, etcd is reached
// through a small proxy on 127.0.0.1 (written to DIR/etcd.env), so that no
// address is added to the host's own namespace.
//
// Everything sim makes is under DIR and in namespaces it made; it ends only
// processes it started, by PID checked against their start time.
package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/nsfleet/nsfleet/process"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Cluster is DIR/sim.json: what sim made, to find and remove it again.
type Cluster struct {
	Dir    string `json:"dir"`
	Binary string `json:"binary"` // the nsfleet-cluster that runs the daemons
	// AgentBinary runs new nodes' agents, if not Binary.
	AgentBinary string     `json:"agent_binary,omitempty"`
	MadeDir     bool       `json:"made_dir"`
	LeaseTTL    string     `json:"lease_ttl"`
	Capacity    int        `json:"capacity"`
	Procs       bool       `json:"allow_processes"`
	HubPin      string     `json:"hub_pin"`
	Members     []Daemon   `json:"etcd_members"`
	Proxy       Daemon     `json:"proxy"`
	ProxyAddr   string     `json:"proxy_addr"`
	Nodes       []NodeInfo `json:"nodes"`
}

// Daemon is a process sim started.
type Daemon struct {
	Name  string `json:"name"`
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // start time in clock ticks since boot (/proc/PID/stat)
	Log   string `json:"log"`
}

// NodeInfo is one simulated node.
type NodeInfo struct {
	Name   string `json:"name"`
	Index  int    `json:"index"`
	NetPin string `json:"net_pin"`
	MntPin string `json:"mnt_pin"`
	RunDir string `json:"run_dir"`
	Agent  Daemon `json:"agent"`
	Killed bool   `json:"killed,omitempty"`
	// Binary runs this node's agent, if not the sim's (an upgrade
	// rehearsed node by node).
	Binary string `json:"binary,omitempty"`
}

// PeerAddr is where node k's agent answers its peers: its address on the
// link to the hub, which routes between nodes.
func PeerAddr(k int) string { return fmt.Sprintf("198.19.%d.2:9466", k) }

// MetricsAddr is where node k's agent serves /metrics and /healthz: its
// address on the link to the hub, so that a Prometheus in the hub's
// namespace scrapes every node.
func MetricsAddr(k int) string { return fmt.Sprintf("198.19.%d.2:9465", k) }

// MemberAddr is the hub address of etcd member k (1..3).
func MemberAddr(k int) string { return fmt.Sprintf("198.18.0.%d", k) }

// Endpoints are the etcd client URLs as the nodes reach them.
func Endpoints() []string {
	var out []string
	for k := 1; k <= 3; k++ {
		out = append(out, "http://"+MemberAddr(k)+":2379")
	}
	return out
}

func statePath(dir string) string { return filepath.Join(dir, "sim.json") }

// Load reads DIR/sim.json.
func Load(dir string) (*Cluster, error) {
	b, err := os.ReadFile(statePath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no sim in %s (nsfleet sim up --dir %s makes one)", dir, dir)
	}
	if err != nil {
		return nil, err
	}
	var s Cluster
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", statePath(dir), err)
	}
	return &s, nil
}

func (s *Cluster) save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := statePath(s.Dir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, statePath(s.Dir))
}

// Node returns the node called name.
func (s *Cluster) Node(name string) (*NodeInfo, error) {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i], nil
		}
	}
	var names []string
	for _, n := range s.Nodes {
		names = append(names, n.Name)
	}
	return nil, fmt.Errorf("no node %q in this sim (it has %s)", name, strings.Join(names, ", "))
}

// procStart reads a process's start time, to tell it from a later process
// that got the same PID; a zombie counts as gone.
func procStart(pid int) (uint64, error) {
	start, state, err := process.StartTime(pid)
	if err == nil && (state == 'Z' || state == 'X') {
		return 0, os.ErrProcessDone
	}
	return start, err
}

// alive reports whether d is still the process sim started.
func (d Daemon) alive() bool {
	if d.PID <= 0 {
		return false
	}
	st, err := procStart(d.PID)
	return err == nil && st == d.Start
}

// kill sends sig to d if it is still the process sim started, and waits up
// to wait for it to go.
func (d Daemon) kill(sig os.Signal, wait time.Duration) {
	if !d.alive() {
		return
	}
	if p, err := os.FindProcess(d.PID); err == nil {
		p.Signal(sig)
	}
	deadline := time.Now().Add(wait)
	for d.alive() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}
