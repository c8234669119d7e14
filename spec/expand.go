package spec

// Expanding one template into namespaces: sysctls, veths, routes, processes.

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// expander expands one template at one index, a part at a time; every
// error names the file, the line, the template and the index.
type expander struct {
	path      string
	t         template
	idx, line int
	env       expandEnv
	withLinks bool // route devs may name link ends, checked later
}

func (x *expander) bad(l int, format string, a ...any) error {
	return &Error{File: x.path, Line: l, Msg: fmt.Sprintf("template %q index %d: ", x.t.Name, x.idx) + fmt.Sprintf(format, a...)}
}

// sysctls expands the sysctls, in key order, each key once.
func (x *expander) sysctls() ([]Sysctl, error) {
	keys := make([]string, 0, len(x.t.Sysctls))
	for k := range x.t.Sysctls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []Sysctl
	seen := map[string]bool{}
	for _, k := range keys {
		key, err := expand(k, x.env)
		if err != nil {
			return nil, x.bad(x.line, "sysctl %q: %v", k, err)
		}
		val, err := expand(x.t.Sysctls[k], x.env)
		if err != nil {
			return nil, x.bad(x.line, "sysctl %q value: %v", k, err)
		}
		if err := ValidSysctl(key, val); err != nil {
			return nil, x.bad(x.line, "%v", err)
		}
		key = normalizeSysctlKey(key)
		if seen[key] {
			return nil, x.bad(x.line, "sysctl %q is set twice", key)
		}
		seen[key] = true
		out = append(out, Sysctl{Key: key, Value: val})
	}
	return out, nil
}

// veths expands the veth pairs; it also returns the namespace's interface
// names (lo and the peers), which routes may name.
func (x *expander) veths(lines []int) ([]Veth, map[string]bool, error) {
	peers := map[string]bool{"lo": true}
	hosts := map[string]bool{}
	var out []Veth
	for vi, vt := range x.t.Veths {
		vl := lineAt(lines, vi, x.line)
		if vt.Host == "" || vt.Peer == "" {
			return nil, nil, x.bad(vl, "veth %d: both 'host' and 'peer' are required", vi+1)
		}
		v := Veth{MTU: vt.MTU, Up: vt.Up, HostIPv6Off: vt.HostIPv6 != nil && !*vt.HostIPv6}
		var err error
		if v.Host, err = expand(vt.Host, x.env); err != nil {
			return nil, nil, x.bad(vl, "veth host: %v", err)
		}
		if v.Peer, err = expand(vt.Peer, x.env); err != nil {
			return nil, nil, x.bad(vl, "veth peer: %v", err)
		}
		if err := ValidInterfaceName(v.Host); err != nil {
			return nil, nil, x.bad(vl, "veth host end: %v", err)
		}
		if err := ValidInterfaceName(v.Peer); err != nil {
			return nil, nil, x.bad(vl, "veth peer end: %v", err)
		}
		if peers[v.Peer] {
			return nil, nil, x.bad(vl, "peer interface %q appears twice in namespace %q", v.Peer, x.env.name)
		}
		if hosts[v.Host] {
			return nil, nil, x.bad(vl, "host interface %q appears twice", v.Host)
		}
		peers[v.Peer], hosts[v.Host] = true, true
		if vt.MTU != 0 && (vt.MTU < 68 || vt.MTU > 65535) {
			return nil, nil, x.bad(vl, "veth %s/%s: mtu %d outside 68..65535", v.Host, v.Peer, vt.MTU)
		}
		if v.HostAddrs, err = expandPrefixes(vt.HostAddresses, x.env); err != nil {
			return nil, nil, x.bad(vl, "veth %s host_addresses: %v", v.Host, err)
		}
		if v.PeerAddrs, err = expandPrefixes(vt.PeerAddresses, x.env); err != nil {
			return nil, nil, x.bad(vl, "veth %s peer_addresses: %v", v.Peer, err)
		}
		for _, a := range v.HostAddrs {
			if v.HostIPv6Off && a.Addr().Is6() {
				return nil, nil, x.bad(vl, "veth %s: host_addresses has the IPv6 address %s, but host_ipv6 is false", v.Host, a)
			}
		}
		out = append(out, v)
	}
	return out, peers, nil
}

// routes expands the routes; a route's dev must be one of ifaces.
func (x *expander) routes(lines []int, ifaces map[string]bool) ([]Route, error) {
	var out []Route
	for ri, rt := range x.t.Routes {
		r, err := x.route(rt, lineAt(lines, ri, x.line), ifaces)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func (x *expander) route(rt routeTemplate, rl int, ifaces map[string]bool) (Route, error) {
	var r Route
	to, err := expand(rt.To, x.env)
	if err != nil {
		return r, x.bad(rl, "route to: %v", err)
	}
	via, err := expand(rt.Via, x.env)
	if err != nil {
		return r, x.bad(rl, "route via: %v", err)
	}
	if r.Dev, err = expand(rt.Dev, x.env); err != nil {
		return r, x.bad(rl, "route dev: %v", err)
	}
	if via == "" && r.Dev == "" {
		return r, x.bad(rl, "route %q needs 'via' or 'dev'", to)
	}
	if via != "" {
		if r.Via, err = netip.ParseAddr(via); err != nil {
			return r, x.bad(rl, "route via %q: %v", via, err)
		}
	}
	switch to {
	case "", "default":
		if r.Via.Is6() {
			r.To = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		} else {
			r.To = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		}
	default:
		p, err := netip.ParsePrefix(to)
		if err != nil {
			return r, x.bad(rl, "route to %q: %v", to, err)
		}
		r.To = p.Masked()
	}
	if r.Via.IsValid() && r.Via.Is4() != r.To.Addr().Is4() {
		return r, x.bad(rl, "route to %s via %s mixes IPv4 and IPv6", r.To, r.Via)
	}
	if r.Dev != "" && !ifaces[r.Dev] && !x.withLinks {
		return r, x.bad(rl, "route dev %q is not an interface of namespace %q", r.Dev, x.env.name)
	}
	return r, nil
}

// processes expands the processes, each name once.
func (x *expander) processes() ([]Process, error) {
	var out []Process
	seen := map[string]bool{}
	for _, pt := range x.t.Processes {
		if err := validProcessName(pt.Name); err != nil {
			return nil, x.bad(x.line, "%v", err)
		}
		if seen[pt.Name] {
			return nil, x.bad(x.line, "process %q appears twice", pt.Name)
		}
		seen[pt.Name] = true
		if len(pt.Command) == 0 || pt.Command[0] == "" {
			return nil, x.bad(x.line, "process %q: 'command' must be a non-empty list, like [\"dnsmasq\", \"--no-daemon\"]", pt.Name)
		}
		p, err := processPrivileges(pt)
		if err != nil {
			return nil, x.bad(x.line, "process %q: %v", pt.Name, err)
		}
		switch p.Restart {
		case "":
			p.Restart = RestartOnFailure
		case RestartAlways, RestartOnFailure, RestartNever:
		default:
			return nil, x.bad(x.line, "process %q: restart %q: want always, on-failure or never", pt.Name, pt.Restart)
		}
		env := x.env
		if pt.Config != "" {
			if p.Config, err = expandConfig(pt.Config, x.env); err != nil {
				return nil, x.bad(x.line, "process %q: config: %v", pt.Name, err)
			}
			env.config = true
		}
		for _, a := range pt.Command {
			e, err := expand(a, env)
			if err != nil {
				return nil, x.bad(x.line, "process %q: %v", pt.Name, err)
			}
			if strings.ContainsRune(e, 0) {
				return nil, x.bad(x.line, "process %q: argument contains NUL", pt.Name)
			}
			p.Command = append(p.Command, e)
		}
		if p.Config != "" && !slices.ContainsFunc(p.Command, func(a string) bool { return strings.Contains(a, ConfigPlaceholder) }) {
			return nil, x.bad(x.line, "process %q has a config, but its command does not name its file: put {config} where the daemon takes its configuration file, like [bird, -c, \"{config}\"]", pt.Name)
		}
		out = append(out, p)
	}
	return out, nil
}

// configPlaceholder is a placeholder nsfleet replaces in a config: {name},
// {loopback} and {i} arithmetic. Every other brace is the daemon's own
// syntax (BIRD, FRR and nginx configs are full of them) and stays.
var configPlaceholder = regexp.MustCompile(`\{\s*(name|loopback|i(\s*[-+*/%]\s*[0-9]+)*)\s*\}`)

// expandConfig expands a process's config for one namespace.
func expandConfig(text string, env expandEnv) (string, error) {
	var err error
	out := configPlaceholder.ReplaceAllStringFunc(text, func(m string) string {
		v, e := evalPlaceholder(m[1:len(m)-1], env)
		if e != nil && err == nil {
			err = fmt.Errorf("placeholder %q: %w", m, e)
		}
		return v
	})
	if err != nil {
		return "", err
	}
	if len(out) > MaxConfig {
		return "", fmt.Errorf("%d bytes expanded; at most %d", len(out), MaxConfig)
	}
	if strings.ContainsRune(out, 0) {
		return "", fmt.Errorf("contains NUL")
	}
	return out, nil
}

func validProcessName(n string) error {
	if n == "" {
		return fmt.Errorf("process without a 'name'")
	}
	if len(n) > 64 || n == "." || n == ".." {
		return fmt.Errorf("process name %q: at most 64 bytes, not . or ..", n)
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("process name %q: only letters, digits, '-', '_' and '.'", n)
		}
	}
	return nil
}

func expandPrefixes(in []string, env expandEnv) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range in {
		e, err := expand(s, env)
		if err != nil {
			return nil, err
		}
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return nil, fmt.Errorf("%q: want an address with a prefix length, like 10.0.0.1/24", e)
		}
		out = append(out, p)
	}
	return out, nil
}
