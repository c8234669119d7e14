// Package companion finds nsfleet's companion binaries, which hold what
// would weigh on the start-up of every nsfleet command: nsfleet-cluster
// (etcd's client and server: agent, cluster, sim) and nsfleet-lab (the
// lab's statistics, plots and SQLite store: bench). nsfleet hands those
// commands over to them; the lab's failover scenario drives a sim.
package companion

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
)

// Binary is one companion: its file name, and the environment variable
// that overrides where it is (tests point it at themselves).
type Binary struct {
	Name string
	Env  string
}

// The companions.
var (
	Cluster = Binary{Name: "nsfleet-cluster", Env: "NSFLEET_CLUSTER_BINARY"}
	Lab     = Binary{Name: "nsfleet-lab", Env: "NSFLEET_LAB_BINARY"}
)

// Find returns $Env, else the binary beside this executable, else the
// one on PATH.
func (b Binary) Find() (string, error) {
	if p := os.Getenv(b.Env); p != "" {
		return p, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), b.Name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath(b.Name); err == nil {
		return p, nil
	}
	return "", errors.New("needs the " + b.Name + " binary beside nsfleet or on PATH; build all three with:\n" +
		"  go build -o /usr/local/bin/ ./cmd/nsfleet ./cmd/nsfleet-cluster ./cmd/nsfleet-lab")
}
