package sim

// The faults a sim can suffer: an agent restarted, a node killed (power
// loss), a node's path to etcd cut and restored.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"golang.org/x/sys/unix"
)

// loadNode loads the sim and one of its nodes; a killed node is an error
// for every operation but those that accept it.
func loadNode(dir, node string, killedOK bool) (*Cluster, *NodeInfo, error) {
	st, err := Load(dir)
	if err != nil {
		return nil, nil, err
	}
	n, err := st.Node(node)
	if err != nil {
		return nil, nil, err
	}
	if n.Killed && !killedOK {
		return nil, nil, fmt.Errorf("%s was killed (power loss); sim add makes a new node", node)
	}
	return st, n, nil
}

// Restart kills a node's agent (SIGKILL, as a crash) and starts a new one
// in the same node: its namespaces and processes stay. A binary other than
// "" runs the new agent (and the node's next ones): an upgrade.
func Restart(dir, node, binary string) error {
	st, n, err := loadNode(dir, node, false)
	if err != nil {
		return err
	}
	if binary != "" {
		abs, err := filepath.Abs(binary)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("sim restart %s: --binary: %w", node, err)
		}
		n.Binary = abs
	}
	n.Agent.kill(syscall.SIGKILL, 5*time.Second)
	if err := st.startAgent(n); err != nil {
		return err
	}
	return st.save()
}

// Kill is power loss: the node's agent and every process in the node are
// killed, and the node is removed with everything in it.
func Kill(dir, node string) error {
	st, n, err := loadNode(dir, node, true)
	if err != nil {
		return err
	}
	if err := st.removeNode(n); err != nil {
		return err
	}
	n.Killed = true
	return st.save()
}

func (st *Cluster) removeNode(n *NodeInfo) error {
	n.Agent.kill(syscall.SIGKILL, 5*time.Second)
	killInMountNS(n.MntPin)
	var errs []error
	errs = append(errs, netns.UnpinFile(n.MntPin), netns.UnpinFile(n.NetPin))
	return errors.Join(errs...)
}

// killInMountNS SIGKILLs every process in the mount namespace pinned at
// pin: only nsfleet's agent and the processes it started live there.
func killInMountNS(pin string) {
	var want unix.Stat_t
	if unix.Stat(pin, &want) != nil {
		return
	}
	for round := 0; round < 50; round++ {
		found := 0
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			var s unix.Stat_t
			if unix.Stat("/proc/"+e.Name()+"/ns/mnt", &s) != nil || s.Ino != want.Ino || s.Dev != want.Dev {
				continue
			}
			found++
			unix.Kill(pid, unix.SIGKILL)
		}
		if found == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Partition cuts the node's path to etcd (its hub link down); the agent
// keeps running. Heal restores it.
func Partition(dir, node string) error { return setHubLink(dir, node, false) }

// Heal restores a partitioned node's path to etcd.
func Heal(dir, node string) error { return setHubLink(dir, node, true) }

func setHubLink(dir, node string, up bool) error {
	st, n, err := loadNode(dir, node, false)
	if err != nil {
		return err
	}
	hub, err := netns.OpenPath(st.HubPin)
	if err != nil {
		return err
	}
	defer hub.Close()
	return rtnl.Inside(hub, rtnl.OpenLite, func(c *rtnl.Conn) error {
		l, err := c.LinkByName(fmt.Sprintf("n-%d", n.Index))
		if err != nil {
			return fmt.Errorf("%s: hub link: %w", node, err)
		}
		return c.SetUp(l.Index, up)
	})
}
