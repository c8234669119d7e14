package doctor

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/sysctl"
	"golang.org/x/sys/unix"
)

const (
	report000 = "000: netns creation regression (RCU callback offloading)"
	report003 = "003: /run/netns mount propagation"
	report004 = "004: freeing lags creation until ENOSPC"
)

func checkRunDir(e *Environment) []Finding {
	p := e.RunDir.Path
	f := Finding{Check: CheckRunDir}
	switch {
	case !e.RunDirExists:
		f.Severity, f.Summary = Info, p+" does not exist yet; nsfleet up (or ip netns add) creates it"
	case !e.RunDirState.IsMountPoint:
		f.Severity = Warn
		f.Summary = p + " is not a mount point: pins land in the mount at " + e.RunDirState.Parent
		f.Evidence = []string{"parent mount " + e.RunDirState.Parent + " is " + e.RunDirState.ParentProp}
		f.Advice = "let nsfleet up (or ip netns add) set it up: it binds the run dir onto itself and makes it shared, so an unpin propagates to every mount namespace and the namespace can be freed"
		f.Source = report003
	default:
		f.Severity = OK
		f.Summary = fmt.Sprintf("%s is a %s mount point (parent %s is %s)", p, e.RunDirState.Propagation, e.RunDirState.Parent, e.RunDirState.ParentProp)
		if e.RunDirState.Propagation == "private" {
			f.Severity = Info
			f.Advice = "a private run dir does not propagate unpins: copies made in other mount namespaces keep namespaces alive until those exit"
			f.Source = report003
		}
	}
	return []Finding{f}
}

func checkPins(e *Environment) []Finding {
	if !e.RunDirExists {
		return nil
	}
	var out []Finding
	var stale, stacked []string
	byIno := map[uint64][]string{}
	for _, p := range e.Pins {
		switch {
		case p.Symlink:
			out = append(out, Finding{Check: CheckPins, Severity: Warn, Summary: "pin " + p.Name + " is a symbolic link", Advice: "remove it; nothing should follow links out of the run dir"})
		case !p.Mounted && p.Mounts == 0:
			stale = append(stale, p.Name)
		case p.Mounts > 1:
			stacked = append(stacked, fmt.Sprintf("%s (%d mounts)", p.Name, p.Mounts))
		}
		if p.Mounted {
			byIno[p.Inode] = append(byIno[p.Inode], p.Name)
		}
	}
	if len(stale) > 0 {
		marked := 0
		for _, n := range stale {
			if e.RunDir.MarkedStale(n) {
				marked++
			}
		}
		out = append(out, Finding{Check: CheckPins, Severity: Warn,
			Summary:  plural(len(stale), "stale pin file", "stale pin files") + " (no namespace mounted)",
			Evidence: []string{list(stale, 8), fmt.Sprintf("%d with nsfleet's mark (%s)", marked, netns.PinMark)},
			Advice:   "left by a crash between creating the file and mounting on it, or by a failed ip netns add; ip netns list shows them but they hold nothing. nsfleet doctor --fix removes nsfleet's; the next nsfleet up reuses them",
		})
	}
	// Double pins: the same namespace at several places.
	var doubles []string
	elsewhere := map[uint64][]string{}
	for ino, h := range e.NetNS {
		for _, mp := range h.Pins {
			if !strings.HasPrefix(mp, e.RunDir.Path+"/") {
				elsewhere[ino] = append(elsewhere[ino], mp)
			}
		}
	}
	for ino, names := range byIno {
		if len(names) > 1 {
			sort.Strings(names)
			doubles = append(doubles, fmt.Sprintf("net:[%d] pinned as %s", ino, strings.Join(names, " and ")))
		}
		for _, mp := range elsewhere[ino] {
			doubles = append(doubles, fmt.Sprintf("net:[%d] pinned as %s and at %s", ino, names[0], mp))
		}
	}
	sort.Strings(doubles)
	if len(stacked) > 0 || len(doubles) > 0 {
		out = append(out, Finding{Check: CheckPins, Severity: Warn,
			Summary:  "double pins: " + plural(len(stacked)+len(doubles), "namespace is", "namespaces are") + " pinned more than once",
			Evidence: append(stacked, doubles...),
			Advice:   "a namespace pinned twice is not freed by one ip netns del (for example a pin under both /run/netns and a separately mounted /var/run/netns, or two racing ip netns add); unmount the extra mounts. nsfleet doctor --fix collapses stacked mounts on nsfleet's own pins",
			Source:   report003,
		})
	}
	// nsfs mounts whose file was deleted: the namespace can never be freed
	// through the run dir any more. Since Linux 3.18 the kernel detaches
	// mounts whose file is unlinked from another mount namespace, so this
	// is seen on older kernels only.
	var orphans []string
	for _, m := range e.Mounts {
		if m.FSType == "nsfs" && strings.HasSuffix(m.MountPoint, "//deleted") {
			orphans = append(orphans, strings.TrimSuffix(m.MountPoint, "//deleted")+" ("+m.Root+")")
		}
	}
	if len(orphans) > 0 {
		out = append(out, Finding{Check: CheckPins, Severity: Warn,
			Summary:  plural(len(orphans), "namespace mount has", "namespace mounts have") + " lost its pin file",
			Evidence: []string{list(orphans, 8)},
			Advice:   "the file under the mount was removed while mounted, so nothing in the run dir names the namespace; unmount it with umount -l PATH//deleted... or reboot. It holds its namespace alive",
		})
	}
	if len(out) == 0 {
		out = append(out, Finding{Check: CheckPins, Severity: OK, Summary: fmt.Sprintf("%s in %s, none stale or doubled", plural(len(e.Pins), "pin", "pins"), e.RunDir.Path)})
	}
	return out
}

func checkMounts(e *Environment) []Finding {
	var out []Finding
	n := len(e.Mounts)
	f := Finding{Check: CheckMounts, Severity: OK, Summary: fmt.Sprintf("%d mounts in this mount namespace (fs.mount-max %d)", n, e.MountMax)}
	if f.Severity = againstLimit(n, e.MountMax); f.Severity > OK {
		f.Advice = "each pin is a mount: raise fs.mount-max or delete unused namespaces before new mounts (and new namespaces) fail with ENOSPC"
	}
	out = append(out, f)
	rf := Finding{Check: CheckMounts, Severity: OK,
		Summary: fmt.Sprintf("%s on the machine; %d receive every new pin by propagation", plural(len(e.MountNamespaces), "mount namespace", "mount namespaces"), len(e.Receivers))}
	if len(e.Receivers) > 0 {
		var ev []string
		for i, pid := range e.Receivers {
			if i == 8 {
				ev = append(ev, fmt.Sprintf("... and %d more", len(e.Receivers)-8))
				break
			}
			ev = append(ev, fmt.Sprintf("pid %d (%s)", pid, commOf(pid)))
		}
		rf.Evidence = ev
		rf.Severity = Info
		if len(e.Receivers) >= 50 {
			rf.Severity = Warn
		}
		rf.Advice = "every ip netns add/del (and nsfleet pin) is copied into each of these mount namespaces, and each ip netns exec copies all pins: add and delete slow down as both grow. Start long-lived services with a private or slave /run/netns, or keep fewer idle mount namespaces"
		rf.Source = report003
	}
	return append(out, rf)
}

func checkHeadroom(e *Environment) []Finding {
	var out []Finding
	f := Finding{Check: CheckHeadroom, Severity: OK}
	pinned, procs, others := 0, 0, 0
	var fdOnly []string
	for ino, h := range e.NetNS {
		if h.Path != "" && !ownedHere(h.Path) {
			others++ // another user namespace's: its own limit applies
			continue
		}
		if len(h.Pins) > 0 {
			pinned++
		}
		if len(h.Procs) > 0 {
			procs++
		}
		if len(h.Pins) == 0 && len(h.Procs) == 0 && len(h.FDs) > 0 {
			fdOnly = append(fdOnly, fmt.Sprintf("net:[%d] held by an open fd of pid %d (%s)", ino, h.FDs[0], h.FDsComms[0]))
		}
	}
	sort.Strings(fdOnly)
	live := len(e.NetNS) - others
	f.Summary = fmt.Sprintf("%s found alive, limit user.max_net_namespaces %d", plural(live, "network namespace", "network namespaces"), e.MaxNetNamespaces)
	f.Evidence = []string{fmt.Sprintf("%d pinned, %d used by a process, %d held only by an open descriptor; %d owned by other user namespaces (not counted)", pinned, procs, len(fdOnly), others),
		"namespaces held only inside the kernel (a socket, a namespace being freed) are not visible without listns(), which this kernel lacks"}
	if f.Severity = againstLimit(live, e.MaxNetNamespaces); f.Severity > OK {
		f.Advice = "new namespaces will fail with ENOSPC; namespaces being freed still count, so creating right after deleting many can fail too. Raise user.max_net_namespaces or delete unused namespaces and wait for the kernel (nsfleet down waits)"
		f.Source = report004
	}
	out = append(out, f)
	if len(fdOnly) > 0 {
		out = append(out, Finding{Check: CheckHeadroom, Severity: Info,
			Summary:  plural(len(fdOnly), "namespace is", "namespaces are") + " alive but neither pinned nor used by any process",
			Evidence: []string{list(fdOnly, 8)},
			Advice:   "a program keeps a descriptor on them; they are freed when it closes it or exits",
		})
	}
	return out
}

// checkSysctl times one sysctl lookup in a fresh namespace, through the
// shared /proc and through a private procfs instance.
func checkSysctl(e *Environment) []Finding {
	f := Finding{Check: CheckSysctl, Source: "package sysctl measurements: 0.1 ms at the first namespace, 10 ms at the 5,000th"}
	shared, private, err := timeSysctlLookup()
	if err != nil {
		f.Severity, f.Summary = Info, "could not time a sysctl lookup: "+err.Error()
		return []Finding{f}
	}
	ratio := float64(shared) / float64(max(private, time.Microsecond))
	f.Summary = fmt.Sprintf("a lookup under /proc/sys/net takes %v, %.1fx a fresh procfs instance (%v)", shared.Round(time.Microsecond), ratio, private.Round(time.Microsecond))
	f.Evidence = []string{"timed in new network namespaces: open /proc/sys/net/ipv4/ip_forward, best of 3"}
	switch {
	case shared >= time.Millisecond && ratio >= 10, shared >= 500*time.Microsecond && ratio >= 40:
		// The second: a kernel whose lookups are fast in themselves
		// (6.18 here: 0.8 ms at 5,000 namespaces) but clearly trapped.
		f.Severity = Warn
	case shared >= 200*time.Microsecond && ratio >= 5:
		f.Severity = Info
	}
	if f.Severity > OK {
		f.Advice = "every namespace that ever looked a /proc/sys name up leaves a dentry that later lookups of that name compare against (proc_sys_compare). Scripts that run sysctl or ip netns exec per namespace pay it; nsfleet uses private procfs instances"
	}
	return []Finding{f}
}

func timeSysctlLookup() (shared, private time.Duration, err error) {
	proc, err := sysctl.Open()
	if err != nil {
		return 0, 0, err
	}
	defer proc.Close()
	if !proc.Private() {
		return 0, 0, fmt.Errorf("no fsopen to compare with")
	}
	procFD, err := unix.Open("/proc", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(procFD)
	lookup := func(dir int) (time.Duration, error) {
		t := time.Now()
		fd, err := unix.Openat(dir, "sys/net/ipv4/ip_forward", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		d := time.Since(t)
		if err == nil {
			unix.Close(fd)
		}
		return d, err
	}
	// The best of three rounds, each in a namespace of its own: one timing
	// of a few microseconds is mostly noise.
	shared, private = time.Hour, time.Hour
	for round := 0; round < 3; round++ {
		h, err := netns.Create(func(*netns.NS) error {
			s, err := lookup(procFD)
			if err != nil {
				return err
			}
			p, err := lookup(proc.Fd())
			shared, private = min(shared, s), min(private, p)
			return err
		})
		if err != nil {
			return 0, 0, err
		}
		h.Close()
	}
	return shared, private, nil
}

func checkKernel(e *Environment) []Finding {
	var out []Finding
	if e.KernelConfig == nil {
		out = append(out, Finding{Check: CheckKernel, Severity: Info, Summary: "kernel config not available (no /proc/config.gz or /boot/config-*)",
			Advice: "the RCU and HZ options the reports blame cannot be checked; CONFIG_IKCONFIG_PROC=y exposes them"})
	} else {
		kc := e.KernelConfig
		var ev []string
		for _, k := range []string{"CONFIG_HZ", "CONFIG_PREEMPT", "CONFIG_PREEMPT_VOLUNTARY", "CONFIG_PREEMPT_NONE", "CONFIG_PREEMPT_DYNAMIC", "CONFIG_RCU_NOCB_CPU", "CONFIG_RCU_NOCB_CPU_DEFAULT_ALL", "CONFIG_RCU_FAST_NO_HZ", "CONFIG_RCU_EXPERT", "CONFIG_RCU_LAZY"} {
			if v, ok := kc[k]; ok {
				ev = append(ev, k+"="+v)
			}
		}
		ev = append(ev, "from "+e.KernelConfigFrom)
		nocbs := ""
		for _, w := range strings.Fields(e.Cmdline) {
			if strings.HasPrefix(w, "rcu_nocbs=") || strings.HasPrefix(w, "nohz_full=") {
				nocbs += w + " "
			}
		}
		f := Finding{Check: CheckKernel, Severity: OK, Summary: "RCU callbacks run on the CPUs that queue them", Evidence: ev}
		allOffloaded := kc["CONFIG_RCU_NOCB_CPU_DEFAULT_ALL"] == "y" || kc["CONFIG_RCU_NOCB_CPU_ALL"] == "y" || strings.Contains(nocbs, "rcu_nocbs=all") || strings.Contains(nocbs, "rcu_nocbs=0-")
		switch {
		case kc["CONFIG_RCU_NOCB_CPU"] == "y" && allOffloaded:
			f.Severity, f.Summary = Warn, "RCU callbacks are offloaded from all CPUs"
			f.Evidence = append(f.Evidence, "kernel command line: "+strings.TrimSpace(nocbs))
			f.Advice = "with every CPU offloaded, namespace creation ran at about half speed in the 2014 report (waiting on callback kthreads); boot with rcu_nocbs= limited to the isolated CPUs, or none"
			f.Source = report000
		case kc["CONFIG_RCU_NOCB_CPU"] == "y":
			f.Severity, f.Summary = Info, "RCU callback offloading is built in"
			if nocbs != "" {
				f.Evidence = append(f.Evidence, "kernel command line: "+strings.TrimSpace(nocbs))
			}
			f.Source = report000
		}
		out = append(out, f)
	}
	ef := Finding{Check: CheckKernel, Severity: OK, Summary: "RCU grace periods: expedited=" + orDash(e.RCUExpedited) + ", normal=" + orDash(e.RCUNormal)}
	if e.RCUNormal == "1" {
		ef.Severity = Info
		ef.Advice = "rcu_normal=1 turns every expedited grace period into a normal one: each unmount and veth queue change then waits milliseconds longer, and bulk teardown slows"
		ef.Source = report004
	}
	out = append(out, ef)
	df := Finding{Check: CheckKernel, Severity: OK, Summary: "net.core.devconf_inherit_init_net=" + orDash(e.DevconfInherit)}
	if e.DevconfInherit != "" && e.DevconfInherit != "0" {
		df.Severity = Info
		df.Advice = "new namespaces copy their IPv4/IPv6 device settings from the host (1) or from defaults (0/2/3); a fleet's sysctls then depend on the host's state at creation time"
	}
	return append(out, df)
}

func checkNeigh(e *Environment) []Finding {
	hostVeths := 0
	for _, l := range e.Links {
		if l.Type == "veth" && l.PeerElsewhere {
			hostVeths++
		}
	}
	need := hostVeths
	if e.Opts.Neighbours > 0 {
		need = e.Opts.Neighbours
	}
	f := Finding{Check: CheckNeigh, Severity: OK,
		Summary: fmt.Sprintf("%d host-side veths into other namespaces; net.ipv4.neigh.default.gc_thresh3 = %d", hostVeths, e.GcThresh3)}
	if e.GcThresh3 > 0 && need > e.GcThresh3*8/10 {
		// Links without traffic need no entries yet: a warning, not a failure.
		f.Severity = Info
		if need > e.GcThresh3 {
			f.Severity = Warn
		}
		f.Evidence = []string{fmt.Sprintf("a fleet with %d host-side links needs at least one neighbour entry per link", need)}
		f.Advice = fmt.Sprintf("above gc_thresh3 the kernel refuses new neighbours (\"neighbour table overflow\") and traffic to the newest routers fails; raise gc_thresh1/2/3 (for IPv6 too) above %d", need*2)
	}
	return []Finding{f}
}

// bridgeMaxPorts is the kernel's BR_MAX_PORTS.
const bridgeMaxPorts = 1 << 10

func checkBridges(e *Environment) []Finding {
	ports := map[int]int{}
	names := map[int]string{}
	for _, l := range e.Links {
		if l.Type == "bridge" {
			names[l.Index] = l.Name
			ports[l.Index] += 0
		}
	}
	for _, l := range e.Links {
		if _, ok := names[l.Master]; ok && l.Master != 0 {
			ports[l.Master]++
		}
	}
	var out []Finding
	for idx, n := range ports {
		if n >= bridgeMaxPorts*9/10 {
			sev := Warn
			if n >= bridgeMaxPorts-1 {
				sev = Fail
			}
			out = append(out, Finding{Check: CheckBridges, Severity: sev,
				Summary:  fmt.Sprintf("bridge %s has %d ports of at most %d", names[idx], n, bridgeMaxPorts),
				Advice:   "a Linux bridge stops at 1,024 ports (BR_MAX_PORTS): adding the next router's port will fail with EXFULL; spread routers over several bridges",
				Source:   report003,
				Evidence: []string{"ports counted from IFLA_MASTER of every link"}})
		}
	}
	if len(out) == 0 {
		most := 0
		for _, n := range ports {
			most = max(most, n)
		}
		out = append(out, Finding{Check: CheckBridges, Severity: OK,
			Summary: fmt.Sprintf("%s; the largest has %d ports (limit %d)", plural(len(ports), "bridge", "bridges"), most, bridgeMaxPorts)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Summary < out[j].Summary })
	return out
}

// againstLimit grades a count against a kernel limit: warn from 80%, fail
// from 95%; ok when the limit is unknown.
func againstLimit(n, limit int) Severity {
	switch {
	case limit <= 0:
		return OK
	case float64(n) >= 0.95*float64(limit):
		return Fail
	case float64(n) >= 0.8*float64(limit):
		return Warn
	}
	return OK
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
