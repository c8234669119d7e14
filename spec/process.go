package spec

import (
	"fmt"
	"strconv"
	"strings"
)

// Capabilities are the names the kernel gives its capabilities, in the
// order of their numbers (capability(7)); a name's index is its number.
var Capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER",
	"CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP",
	"CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST",
	"CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
	"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD",
	"CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP",
	"CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
	"CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

// CapabilityNumber returns the number of a capability given as
// "CAP_NET_ADMIN", "cap_net_admin" or "net_admin".
func CapabilityNumber(name string) (int, bool) {
	n := strings.ToUpper(name)
	if !strings.HasPrefix(n, "CAP_") {
		n = "CAP_" + n
	}
	for i, c := range Capabilities {
		if c == n {
			return i, true
		}
	}
	return 0, false
}

// processPrivileges checks and copies a process template's identity,
// capabilities and log settings (its command is expanded by the caller).
func processPrivileges(pt processTemplate) (Process, error) {
	p := Process{Name: pt.Name, Restart: pt.Restart, User: pt.User, Group: pt.Group, NoNewPrivs: pt.NoNewPrivs}
	for _, id := range []struct{ what, v string }{{"user", pt.User}, {"group", pt.Group}} {
		if id.v != "" && (strings.ContainsAny(id.v, ":/\n\x00 ") || len(id.v) > 64) {
			return p, fmt.Errorf("%s %q: want a name or a number", id.what, id.v)
		}
	}
	if pt.Capabilities != nil {
		p.Capabilities = []string{}
		seen := map[int]bool{}
		for _, c := range *pt.Capabilities {
			n, ok := CapabilityNumber(c)
			if !ok {
				return p, fmt.Errorf("capability %q: unknown (want a name from capabilities(7), like net_admin or CAP_NET_BIND_SERVICE)", c)
			}
			if !seen[n] {
				seen[n] = true
				p.Capabilities = append(p.Capabilities, Capabilities[n])
			}
		}
	}
	if pt.LogMax != "" {
		n, err := ParseSize(pt.LogMax)
		if err != nil {
			return p, fmt.Errorf("log_max: %v", err)
		}
		if n < 4096 {
			return p, fmt.Errorf("log_max %q: at least 4KiB", pt.LogMax)
		}
		p.LogMax = n
	}
	if pt.LogKeep != nil {
		if *pt.LogKeep < 1 || *pt.LogKeep > 100 {
			return p, fmt.Errorf("log_keep %d: want 1 to 100", *pt.LogKeep)
		}
		p.LogKeep = *pt.LogKeep
	}
	return p, nil
}

// LogLimits returns the process's log rotation settings, defaults filled in.
func (p Process) LogLimits() (max int64, keep int) {
	max, keep = p.LogMax, p.LogKeep
	if max <= 0 {
		max = DefaultLogMax
	}
	if keep <= 0 {
		keep = DefaultLogKeep
	}
	return max, keep
}

// ParseSize reads a byte count: "4096", "512K", "10MiB", "1G" (K, M, G are
// powers of 1024, with or without "iB" or "B").
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	u := strings.ToUpper(t)
	for _, suf := range []struct {
		s string
		m int64
	}{{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(u, suf.s) {
			mult, t = suf.m, strings.TrimSpace(t[:len(t)-len(suf.s)])
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<50)/mult {
		return 0, fmt.Errorf("%q: want a size like 10MiB, 512K or 1048576", s)
	}
	return n * mult, nil
}
