// Package companion finds nsfleet-cluster, the binary that holds what
// talks to etcd (agent, cluster, sim), for the commands that hand over to
// it and the lab scenario that drives a sim.
package companion

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
)

// Name is the companion binary's name.
const Name = "nsfleet-cluster"

// Env, if set, names the companion binary to use (tests point it at
// themselves).
const Env = "NSFLEET_CLUSTER_BINARY"

// Find returns $NSFLEET_CLUSTER_BINARY, else nsfleet-cluster beside this
// executable, else on PATH.
func Find() (string, error) {
	if p := os.Getenv(Env); p != "" {
		return p, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), Name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath(Name); err == nil {
		return p, nil
	}
	return "", errors.New("needs the " + Name + " binary beside nsfleet or on PATH; build both with:\n" +
		"  go build -o /usr/local/bin/ ./cmd/nsfleet ./cmd/nsfleet-cluster")
}
