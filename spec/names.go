package spec

import (
	"fmt"
	"strings"

	"github.com/nsfleet/nsfleet/internal/names"
)

// IFNAMSIZ is the kernel's interface name buffer: 15 bytes and a NUL.
const IFNAMSIZ = names.IFNAMSIZ

// ValidNamespaceName applies iproute2's rules for a namespace name (see
// package names, which holds them).
func ValidNamespaceName(name string) error { return names.Namespace(name) }

// ValidInterfaceName applies the kernel's dev_valid_name (see package names).
func ValidInterfaceName(name string) error { return names.Interface(name) }

// globalNetSysctls are keys under net. that the kernel keeps once for the
// whole machine, not per namespace (net/core/sysctl_net_core.c net_core_table
// and a few ipv4 ones). Setting them "in a namespace" would change the host.
var globalNetSysctls = map[string]bool{
	"net.core.rmem_default":                   true,
	"net.core.rmem_max":                       true,
	"net.core.wmem_default":                   true,
	"net.core.wmem_max":                       true,
	"net.core.mem_pcpu_rsv":                   true,
	"net.core.dev_weight":                     true,
	"net.core.dev_weight_rx_bias":             true,
	"net.core.dev_weight_tx_bias":             true,
	"net.core.netdev_max_backlog":             true,
	"net.core.netdev_rss_key":                 true,
	"net.core.bpf_jit_enable":                 true,
	"net.core.bpf_jit_harden":                 true,
	"net.core.bpf_jit_kallsyms":               true,
	"net.core.bpf_jit_limit":                  true,
	"net.core.netdev_tstamp_prequeue":         true,
	"net.core.message_cost":                   true,
	"net.core.message_burst":                  true,
	"net.core.busy_read":                      true,
	"net.core.busy_poll":                      true,
	"net.core.netdev_budget":                  true,
	"net.core.netdev_budget_usecs":            true,
	"net.core.default_qdisc":                  true,
	"net.core.rps_sock_flow_entries":          true,
	"net.core.rps_default_mask":               true,
	"net.core.flow_limit_cpu_bitmap":          true,
	"net.core.flow_limit_table_len":           true,
	"net.core.fb_tunnels_only_for_init_net":   true,
	"net.core.devconf_inherit_init_net":       true,
	"net.core.high_order_alloc_disable":       true,
	"net.core.gro_normal_batch":               true,
	"net.core.netdev_unregister_timeout_secs": true,
	"net.core.skb_defer_max":                  true,
	"net.core.max_skb_frags":                  true,
	"net.core.warnings":                       true,
	"net.ipv4.tcp_mem":                        true,
	"net.ipv4.udp_mem":                        true,
	"net.ipv4.inet_peer_threshold":            true,
	"net.ipv4.inet_peer_minttl":               true,
	"net.ipv4.inet_peer_maxttl":               true,
	"net.ipv4.fib_sync_mem":                   true,
	"net.ipv4.route.max_size":                 true,
	"net.ipv4.route.gc_thresh":                true,
	"net.ipv4.route.gc_min_interval":          true,
	"net.ipv4.route.gc_min_interval_ms":       true,
	"net.ipv4.route.gc_timeout":               true,
	"net.ipv4.route.gc_interval":              true,
	"net.ipv4.route.redirect_load":            true,
	"net.ipv4.route.redirect_number":          true,
	"net.ipv4.route.redirect_silence":         true,
	"net.ipv4.route.error_cost":               true,
	"net.ipv4.route.error_burst":              true,
	"net.ipv4.route.gc_elasticity":            true,
	"net.ipv4.route.mtu_expires":              true,
	"net.ipv4.route.min_pmtu":                 true,
	"net.ipv4.route.min_adv_mss":              true,
}

// normalizeSysctlKey accepts both net.ipv4.ip_forward and net/ipv4/ip_forward
// and returns the dotted form.
func normalizeSysctlKey(key string) string {
	if strings.Contains(key, "/") && !strings.Contains(key, ".") {
		return strings.ReplaceAll(key, "/", ".")
	}
	return key
}

// SysctlPath turns a dotted key into its path under /proc/sys (see
// package names).
func SysctlPath(key string) string { return names.SysctlPath(key) }

// ValidSysctl refuses keys outside net., keys the kernel keeps machine-wide,
// malformed keys, and values that could not be written as one line.
func ValidSysctl(key, value string) error {
	k := normalizeSysctlKey(key)
	if !strings.HasPrefix(k, "net.") {
		return fmt.Errorf("sysctl %q: only per-namespace net.* keys can be set", key)
	}
	for _, part := range strings.Split(k, ".") {
		if part == "" {
			return fmt.Errorf("sysctl %q: empty component", key)
		}
		if part == ".." {
			return fmt.Errorf("sysctl %q: '..' is not allowed", key)
		}
		for i := 0; i < len(part); i++ {
			c := part[i]
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '/' || c == '@'
			if !ok {
				return fmt.Errorf("sysctl %q: character %q is not allowed in a key", key, c)
			}
		}
	}
	if globalNetSysctls[k] {
		return fmt.Errorf("sysctl %q is machine-wide, not per network namespace; set it on the host instead", key)
	}
	if strings.ContainsAny(value, "\n\x00=") {
		return fmt.Errorf("sysctl %q: value %q contains a newline, NUL or '='", key, value)
	}
	if len(value) > 4096 {
		return fmt.Errorf("sysctl %q: value is %d bytes, above 4096", key, len(value))
	}
	return nil
}
