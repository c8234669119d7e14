package doctor

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"golang.org/x/sys/unix"
)

// Environment is the machine's state as the checks see it, gathered once.
type Environment struct {
	RunDir       *netns.RunDir
	RunDirExists bool
	RunDirState  netns.MountState
	RunDirMount  *netns.Mount // the run dir's own mount, if it is a mount point
	Mounts       []netns.Mount
	Pins         []netns.PinInfo

	// MountNamespaces maps each mount namespace (inode) to one PID in it;
	// Receivers are those that receive a copy of every new pin.
	MountNamespaces map[uint64]int
	Receivers       []int // PIDs, one per receiving mount namespace
	OwnMountNS      uint64

	// Network namespaces found alive, by inode, with how they are held.
	NetNS map[uint64]*Holder

	MaxNetNamespaces int
	MountMax         int
	GcThresh3        int
	DevconfInherit   string
	Links            []rtnl.Link
	KernelConfig     map[string]string // nil when unavailable
	KernelConfigFrom string
	Cmdline          string
	RCUExpedited     string
	RCUNormal        string
	Opts             Options
}

// Holder says what keeps a network namespace alive.
type Holder struct {
	Path     string   // one path that opens it (for the owner check)
	Pins     []string // mount points of nsfs mounts (in our mount namespace)
	Procs    []int    // PIDs whose task is in it
	FDs      []int    // PIDs holding an fd on it
	FDsComms []string
}

// Gather reads the machine's state.
func Gather(opts Options) (*Environment, error) {
	rd := opts.RunDir
	if rd == nil {
		rd = &netns.RunDir{Path: netns.DefaultRunDir}
	}
	e := &Environment{RunDir: rd, Opts: opts, NetNS: map[uint64]*Holder{}, MountNamespaces: map[uint64]int{}}
	var err error
	if e.Mounts, err = netns.ReadMountInfo(); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(rd.Path); err == nil && fi.IsDir() {
		e.RunDirExists = true
		e.RunDirState, _ = rd.State()
		for i := range e.Mounts {
			if e.Mounts[i].MountPoint == rd.Path {
				e.RunDirMount = &e.Mounts[i]
			}
		}
		if e.Pins, err = rd.List(); err != nil {
			return nil, err
		}
	}
	e.MaxNetNamespaces = readInt("/proc/sys/user/max_net_namespaces")
	e.MountMax = readInt("/proc/sys/fs/mount-max")
	e.GcThresh3 = readInt("/proc/sys/net/ipv4/neigh/default/gc_thresh3")
	e.DevconfInherit = readTrim("/proc/sys/net/core/devconf_inherit_init_net")
	e.Cmdline = readTrim("/proc/cmdline")
	e.RCUExpedited = readTrim("/sys/kernel/rcu_expedited")
	e.RCUNormal = readTrim("/sys/kernel/rcu_normal")
	e.KernelConfig, e.KernelConfigFrom = readKernelConfig()
	e.scanProcs()
	for _, m := range e.Mounts {
		if ino, ok := netns.ParseNsLink(m.Root); ok && m.FSType == "nsfs" {
			h := e.holder(ino)
			h.Pins = append(h.Pins, m.MountPoint)
			if h.Path == "" {
				h.Path = m.MountPoint
			}
		}
	}
	e.findReceivers()
	if c, err := rtnl.OpenLite(); err == nil {
		e.Links, _ = c.Links()
		c.Close()
	}
	return e, nil
}

func (e *Environment) holder(ino uint64) *Holder {
	h := e.NetNS[ino]
	if h == nil {
		h = &Holder{}
		e.NetNS[ino] = h
	}
	return h
}

// scanProcs reads who holds each network namespace and one process per
// mount namespace from netns's walk of /proc.
func (e *Environment) scanProcs() {
	var st unix.Stat_t
	if unix.Stat("/proc/self/ns/mnt", &st) == nil {
		e.OwnMountNS = st.Ino
	}
	s := netns.ScanProcs()
	e.MountNamespaces = s.MountNS
	for ino, pids := range s.Inside {
		h := e.holder(ino)
		h.Procs = pids
	}
	for ino, pids := range s.Open {
		h := e.holder(ino)
		h.FDs = pids
		for _, pid := range pids {
			h.FDsComms = append(h.FDsComms, netns.Comm(pid))
		}
	}
	for ino, path := range s.Path {
		if h := e.holder(ino); h.Path == "" {
			h.Path = path
		}
	}
}

// findReceivers lists the other mount namespaces that hold a copy of the
// run dir's mount in its peer group (shared or slave): each new pin is
// propagated into all of them.
func (e *Environment) findReceivers() {
	group := 0
	if e.RunDirMount != nil {
		group = e.RunDirMount.Shared()
	} else if e.RunDirExists {
		// Pins land in the parent mount: its peer group is what spreads.
		for i := range e.Mounts {
			if e.Mounts[i].MountPoint == e.RunDirState.Parent {
				group = e.Mounts[i].Shared()
			}
		}
	}
	if group == 0 {
		return
	}
	for ino, pid := range e.MountNamespaces {
		if ino == e.OwnMountNS {
			continue
		}
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
		if err != nil {
			continue
		}
		ms, err := netns.ParseMountInfo(bytes.NewReader(data))
		if err != nil {
			continue
		}
		for _, m := range ms {
			if m.Shared() == group || m.Master() == group {
				e.Receivers = append(e.Receivers, pid)
				break
			}
		}
	}
	sort.Ints(e.Receivers)
}

func readTrim(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func readInt(p string) int {
	n, err := strconv.Atoi(readTrim(p))
	if err != nil {
		return -1
	}
	return n
}

// readKernelConfig reads /proc/config.gz, else /boot/config-RELEASE.
func readKernelConfig() (map[string]string, string) {
	if f, err := os.Open("/proc/config.gz"); err == nil {
		defer f.Close()
		if zr, err := gzip.NewReader(f); err == nil {
			if b, err := io.ReadAll(io.LimitReader(zr, 16<<20)); err == nil {
				return ParseKernelConfig(b), "/proc/config.gz"
			}
		}
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		rel := unix.ByteSliceToString(u.Release[:])
		p := filepath.Join("/boot", "config-"+rel)
		if b, err := os.ReadFile(p); err == nil {
			return ParseKernelConfig(b), p
		}
	}
	return nil, ""
}

// ParseKernelConfig parses a kernel .config: CONFIG_X=value lines, and
// "# CONFIG_X is not set" as "n".
func ParseKernelConfig(b []byte) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "# "); ok {
			if name, ok := strings.CutSuffix(rest, " is not set"); ok && strings.HasPrefix(name, "CONFIG_") {
				out[name] = "n"
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(k, "CONFIG_") {
			continue
		}
		out[k] = strings.Trim(v, `"`)
	}
	return out
}

func commOf(pid int) string {
	return readTrim(fmt.Sprintf("/proc/%d/comm", pid))
}

// ownedHere reports whether the network namespace at path is owned by the
// user namespace doctor runs in: user.max_net_namespaces counts only those.
// When it cannot tell, it says yes.
func ownedHere(path string) bool {
	var self unix.Stat_t
	if unix.Stat("/proc/self/ns/user", &self) != nil {
		return true
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return true
	}
	defer unix.Close(fd)
	ufd, err := unix.IoctlRetInt(fd, unix.NS_GET_USERNS)
	if err == unix.EPERM {
		return false // owned by a user namespace above ours
	}
	if err != nil {
		return true
	}
	defer unix.Close(ufd)
	var st unix.Stat_t
	if unix.Fstat(ufd, &st) != nil {
		return true
	}
	return st.Ino == self.Ino
}
