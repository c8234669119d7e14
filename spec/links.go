package spec

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Link joins an interface of one namespace to an interface of another: a
// veth pair whose two ends are created directly in their namespaces, with
// no stop in nsfleet's own. Both namespaces list it (Namespace.Links).
type Link struct {
	A   LinkEnd `json:"a"`
	B   LinkEnd `json:"b"`
	MTU int     `json:"mtu,omitempty"` // 0: the kernel's default
	Up  bool    `json:"up"`
	// VNI is the VXLAN network identifier of the tunnel that carries the
	// link when its ends are served by two nodes of a cluster (which
	// allocates it when the spec is applied); 0 in a spec file.
	VNI uint32 `json:"vni,omitempty"`
	// Origin is the links: template and its index; Namespace.Same does
	// not compare it.
	Origin Origin `json:"origin,omitzero"`
}

// LinkEnd is one end of a Link: an interface of a namespace.
type LinkEnd struct {
	Namespace string         `json:"namespace"`
	Interface string         `json:"interface"`
	Addrs     []netip.Prefix `json:"addresses,omitempty"`
}

func (e LinkEnd) String() string { return e.Namespace + ":" + e.Interface }

func (l *Link) String() string { return l.A.String() + "=" + l.B.String() }

// Ends returns the end of l in namespace ns and the other one.
func (l *Link) Ends(ns string) (mine, other LinkEnd) {
	if l.A.Namespace == ns {
		return l.A, l.B
	}
	return l.B, l.A
}

// Bridge is a Linux bridge inside a namespace (a switch for a LAN
// segment); its ports are interfaces of the namespace: veth peers or
// link ends.
type Bridge struct {
	Name  string         `json:"name"`
	Ports []string       `json:"ports,omitempty"`
	Up    bool           `json:"up"`
	MTU   int            `json:"mtu,omitempty"`
	Addrs []netip.Prefix `json:"addresses,omitempty"`
}

type linkTemplate struct {
	Count      *int     `yaml:"count"`
	Start      *int     `yaml:"start"`
	A          string   `yaml:"a"`
	B          string   `yaml:"b"`
	MTU        int      `yaml:"mtu"`
	Up         *bool    `yaml:"up"`
	AAddresses []string `yaml:"a_addresses"`
	BAddresses []string `yaml:"b_addresses"`
}

type bridgeTemplate struct {
	Name      string   `yaml:"name"`
	Ports     []string `yaml:"ports"`
	Up        *bool    `yaml:"up"`
	MTU       int      `yaml:"mtu"`
	Addresses []string `yaml:"addresses"`
}

// expandLinks checks one links: template and produces its links.
func expandLinks(path string, t *linkTemplate, line int) ([]Link, error) {
	name := t.A + "=" + t.B
	bad := func(idx int, format string, a ...any) error {
		at := ""
		if idx >= 0 {
			at = fmt.Sprintf(" index %d", idx)
		}
		return &Error{File: path, Line: line, Msg: fmt.Sprintf("link %q%s: ", name, at) + fmt.Sprintf(format, a...)}
	}
	if t.A == "" || t.B == "" {
		return nil, bad(-1, "both 'a' and 'b' are required, as NAMESPACE:INTERFACE")
	}
	count, start := 1, 1
	if t.Count != nil {
		count = *t.Count
	}
	if t.Start != nil {
		start = *t.Start
	}
	switch {
	case count < 0:
		return nil, bad(-1, "count %d is negative", count)
	case count > MaxCount:
		return nil, bad(-1, "count %d is above nsfleet's limit of %d", count, MaxCount)
	case count > 1 && !strings.Contains(name, "{i"):
		return nil, bad(-1, "count is %d but 'a' and 'b' have no {i} placeholder, so every link would be the same", count)
	case start < 0:
		return nil, bad(-1, "start %d is negative", start)
	case t.MTU != 0 && (t.MTU < 68 || t.MTU > 65535):
		return nil, bad(-1, "mtu %d outside 68..65535", t.MTU)
	}
	out := make([]Link, 0, count)
	for k := range count {
		idx := start + k
		env := expandEnv{i: idx}
		l := Link{MTU: t.MTU, Up: t.Up == nil || *t.Up, Origin: Origin{File: path, Line: line, Template: name, Index: idx}}
		var err error
		if l.A, err = linkEnd(t.A, t.AAddresses, env); err != nil {
			return nil, bad(idx, "a: %v", err)
		}
		if l.B, err = linkEnd(t.B, t.BAddresses, env); err != nil {
			return nil, bad(idx, "b: %v", err)
		}
		if l.A.Namespace == l.B.Namespace {
			return nil, bad(idx, "both ends are in namespace %q: a link joins two namespaces", l.A.Namespace)
		}
		out = append(out, l)
	}
	return out, nil
}

// linkEnd expands "NAMESPACE:INTERFACE" and the end's addresses.
func linkEnd(s string, addrs []string, env expandEnv) (LinkEnd, error) {
	e, err := expand(s, env)
	if err != nil {
		return LinkEnd{}, err
	}
	i := strings.LastIndexByte(e, ':')
	if i < 0 {
		return LinkEnd{}, fmt.Errorf("%q: want NAMESPACE:INTERFACE, like r1:eth0", e)
	}
	end := LinkEnd{Namespace: e[:i], Interface: e[i+1:]}
	if err := ValidNamespaceName(end.Namespace); err != nil {
		return LinkEnd{}, err
	}
	if err := ValidInterfaceName(end.Interface); err != nil {
		return LinkEnd{}, err
	}
	if end.Addrs, err = expandPrefixes(addrs, env); err != nil {
		return LinkEnd{}, fmt.Errorf("%s addresses: %v", end, err)
	}
	return end, nil
}

// bridges expands the namespace's bridges. ifaces holds the namespace's
// interfaces so far (lo and veth peers); the bridges are added to it.
// Ports are checked in checkPorts, once the links are known.
func (x *expander) bridges(ifaces map[string]bool) ([]Bridge, error) {
	var out []Bridge
	for _, bt := range x.t.Bridges {
		b := Bridge{Up: bt.Up == nil || *bt.Up, MTU: bt.MTU}
		var err error
		if b.Name, err = expand(bt.Name, x.env); err != nil {
			return nil, x.bad(x.line, "bridge name: %v", err)
		}
		if err := ValidInterfaceName(b.Name); err != nil {
			return nil, x.bad(x.line, "bridge: %v", err)
		}
		if ifaces[b.Name] {
			return nil, x.bad(x.line, "bridge %q: interface %q appears twice in namespace %q", b.Name, b.Name, x.env.name)
		}
		ifaces[b.Name] = true
		if bt.MTU != 0 && (bt.MTU < 68 || bt.MTU > 65535) {
			return nil, x.bad(x.line, "bridge %s: mtu %d outside 68..65535", b.Name, bt.MTU)
		}
		for _, p := range bt.Ports {
			port, err := expand(p, x.env)
			if err != nil {
				return nil, x.bad(x.line, "bridge %s port: %v", b.Name, err)
			}
			if err := ValidInterfaceName(port); err != nil {
				return nil, x.bad(x.line, "bridge %s port: %v", b.Name, err)
			}
			b.Ports = append(b.Ports, port)
		}
		if b.Addrs, err = expandPrefixes(bt.Addresses, x.env); err != nil {
			return nil, x.bad(x.line, "bridge %s addresses: %v", b.Name, err)
		}
		out = append(out, b)
	}
	return out, nil
}

// Interfaces returns the names of ns's interfaces: lo, veth peers,
// bridges and link ends.
func (ns *Namespace) Interfaces() map[string]bool {
	out := map[string]bool{"lo": true}
	for _, v := range ns.Veths {
		out[v.Peer] = true
	}
	for _, b := range ns.Bridges {
		out[b.Name] = true
	}
	for i := range ns.Links {
		mine, _ := ns.Links[i].Ends(ns.Name)
		out[mine.Interface] = true
	}
	return out
}

// attachLinks gives each link to the two namespaces it joins, refusing an
// end in a namespace the spec does not declare and an interface name that
// its namespace already has.
func (f *Fleet) attachLinks(path string, links [][]Link) error {
	ifaces := map[string]map[string]bool{}
	for _, ls := range links {
		for _, l := range ls {
			for _, end := range []LinkEnd{l.A, l.B} {
				i, ok := f.byName[end.Namespace]
				if !ok {
					return &Error{File: path, Line: l.Origin.Line, Msg: fmt.Sprintf(
						"link %q index %d: namespace %q is not declared in the spec", l.Origin.Template, l.Origin.Index, end.Namespace)}
				}
				ns := &f.Namespaces[i]
				if ifaces[ns.Name] == nil {
					ifaces[ns.Name] = ns.Interfaces()
				}
				if ifaces[ns.Name][end.Interface] {
					return &Error{File: path, Line: l.Origin.Line, Msg: fmt.Sprintf(
						"link %q index %d: interface %s appears twice in namespace %q", l.Origin.Template, l.Origin.Index, end, ns.Name)}
				}
				ifaces[ns.Name][end.Interface] = true
				ns.Links = append(ns.Links, l)
			}
			f.Links = append(f.Links, l)
		}
	}
	return nil
}

// checkDevices checks what names an interface of its namespace: each
// route's dev and each bridge's ports (a port in one bridge only, and
// not lo or a bridge). It runs once the links are attached, since those
// may name link ends.
func (ns *Namespace) checkDevices(path string) error {
	bad := func(format string, a ...any) error {
		return &Error{File: path, Line: ns.Origin.Line, Msg: fmt.Sprintf("template %q index %d: ", ns.Origin.Template, ns.Origin.Index) + fmt.Sprintf(format, a...)}
	}
	ifaces := ns.Interfaces()
	for _, r := range ns.Routes {
		if r.Dev != "" && !ifaces[r.Dev] {
			return bad("route dev %q is not an interface of namespace %q", r.Dev, ns.Name)
		}
	}
	inBridge := map[string]string{}
	for _, b := range ns.Bridges {
		for _, p := range b.Ports {
			switch {
			case !ifaces[p]:
				return bad("bridge %s port %q is not an interface of namespace %q", b.Name, p, ns.Name)
			case p == "lo" || slices.ContainsFunc(ns.Bridges, func(o Bridge) bool { return o.Name == p }):
				return bad("bridge %s port %q: a port is a veth peer or a link end", b.Name, p)
			case inBridge[p] != "":
				return bad("bridge %s port %q is also a port of bridge %s", b.Name, p, inBridge[p])
			}
			inBridge[p] = b.Name
		}
	}
	return nil
}

// sameLinks compares two namespaces' links, origins left out.
func sameLinks(a, b []Link) bool {
	return slices.EqualFunc(a, b, func(x, y Link) bool {
		return x.MTU == y.MTU && x.Up == y.Up && x.VNI == y.VNI && sameEnd(x.A, y.A) && sameEnd(x.B, y.B)
	})
}

func sameEnd(a, b LinkEnd) bool {
	return a.Namespace == b.Namespace && a.Interface == b.Interface && slices.Equal(a.Addrs, b.Addrs)
}
