package fleet

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
	"github.com/nsfleet/nsfleet/sysctl"
)

// Marker is the alias nsfleet gives lo in every namespace it makes
// (rtnl.OwnerMark, which says why).
const Marker = rtnl.OwnerMark

// Observed is what the kernel holds for one pinned namespace, read by
// observe. It is plain data, so Diff can be tested without root.
type Observed struct {
	Links   []rtnl.Link            // inside the namespace
	Addrs   map[int][]netip.Prefix // inside, by ifindex
	Routes  []rtnl.Route           // inside, main table
	Sysctls map[string]string      // the spec's keys; missing keys are absent
	// HostLinks are the host namespace's links that the spec names for
	// this namespace (its veths' host ends), by name, as rtnl.Devices
	// reads them: index, and state and MTU where the spec sets them; no
	// type. PeerIndex is the index they are linked to (a veth's peer's)
	// where it was read, -1 where not. Nothing here names a namespace:
	// see pairedHere.
	HostLinks map[string]rtnl.Link
	HostAddrs map[int][]netip.Prefix
	// HostIPv6On: the host ends the spec wants without IPv6
	// (spec.Veth.HostIPv6Off) that have it on.
	HostIPv6On map[string]bool
}

// pairedHere reports whether the host link h is a veth whose other end is
// in this namespace, and returns that end: the veth inside whose peer is
// h's index (and, where h's own peer index was read, whose index that
// is). Neither end says which namespace its peer is in (asking would give
// the namespace an id for the host: see rtnl.Survey). Taken from this
// side alone, with the names the spec gives both ends, a wrong match
// needs a veth of that name here paired into a third namespace with an
// end numbered as the host end is, a number from the host's own count,
// which is not reused until it wraps at 2^31. Before nsfleet changes a
// host link on this word, it asks the host side too (worker.confirm).
func (o *Observed) pairedHere(h rtnl.Link) (rtnl.Link, bool) {
	if h.Index <= 0 {
		return rtnl.Link{}, false
	}
	for _, in := range o.Links {
		if in.Type == "veth" && in.PeerIndex == h.Index && (h.PeerIndex < 0 || in.Index == h.PeerIndex) {
			return in, true
		}
	}
	return rtnl.Link{}, false
}

// pairedInside reports whether the veth l's peer is in this namespace too:
// another veth here, numbered as l's peer, that names l back. Not l
// itself: a veth whose peer elsewhere has the same number as it (a host
// end numbered 2 in a host of few links, paired with a router's first
// veth, also 2) is no pair of its own.
func (o *Observed) pairedInside(l rtnl.Link) bool {
	p, ok := o.linkByIndex(l.PeerIndex)
	return ok && p.Index != l.Index && p.Type == "veth" && p.PeerIndex == l.Index
}

func (o *Observed) link(name string) (rtnl.Link, bool) {
	for _, l := range o.Links {
		if l.Name == name {
			return l, true
		}
	}
	return rtnl.Link{}, false
}

func (o *Observed) linkByIndex(i int) (rtnl.Link, bool) {
	for _, l := range o.Links {
		if l.Index == i {
			return l, true
		}
	}
	return rtnl.Link{}, false
}

// Owned reports whether lo carries nsfleet's marker.
func (o *Observed) Owned() bool {
	lo, ok := o.linkByIndex(rtnl.LoopbackIndex)
	return ok && lo.Alias == Marker
}

// FixKind is one kind of repair.
type FixKind int

const (
	FixMarker      FixKind = iota // set lo's alias to Marker (adopt)
	FixLoopback                   // set lo up or down
	FixVeth                       // create a missing pair
	FixReplaceVeth                // delete a wrong pair or a stray end inside, then create
	FixVethMTU                    // set MTU on both ends
	FixVethUp                     // set both ends up
	FixHostAddr                   // add an address on the host end
	FixPeerAddr                   // add an address on the peer end
	FixSysctl                     // write a sysctl
	FixRoute                      // add or replace a route
	FixHostIPv6                   // turn IPv6 off on a host end
	FixLoAddr                     // add an address on lo
	FixBridge                     // create a missing bridge (Delete: a stray device of its name)
	FixBridgeMTU                  // set a bridge's MTU
	FixBridgeUp                   // set a bridge up or down
	FixBridgeAddr                 // add an address on a bridge
	FixBridgePort                 // enslave a port (Index) to its bridge
	// What the previous spec asked and the new one does not (Prune).
	FixDropVeth     // delete a veth (its end inside: Index)
	FixDropHostAddr // delete an address from a host end (Index)
	FixDropPeerAddr // delete an address from a peer end (Index)
	FixDropRoute    // delete a route (Old; Index: its device, if named)
	FixDropLink     // delete a link's end here (Index): a veth takes its other end along
)

// Fix is one step that brings a namespace to its spec.
type Fix struct {
	Kind   FixKind
	Veth   int // index into Namespace.Veths
	Bridge int // index into Namespace.Bridges
	Addr   netip.Prefix
	Key    string // sysctl key
	Route  int    // index into Namespace.Routes
	Delete []DeleteLink
	Index  int        // the link a Drop fix acts on
	Old    spec.Route // the route FixDropRoute deletes
	Reason string
}

// DeleteLink names a link to delete before a veth is re-created.
type DeleteLink struct {
	Host  bool // in the host namespace (else inside)
	Index int
	Name  string
}

func (f Fix) String() string { return f.Reason }

// Conflict is a difference nsfleet must not repair on its own: a host
// interface it did not make is in the way.
type Conflict struct {
	Reason string
}

func (c *Conflict) Error() string { return c.Reason }

// Diff lists the fixes that bring a namespace from got to want. It returns
// a *Conflict when a host-side name is taken by something that is not the
// namespace's own pair.
func Diff(want *spec.Namespace, got *Observed, adopt bool) ([]Fix, error) {
	var fixes []Fix
	lo, hasLo := got.linkByIndex(rtnl.LoopbackIndex)
	if !got.Owned() && adopt {
		fixes = append(fixes, Fix{Kind: FixMarker, Reason: "adopt: mark lo with alias " + Marker})
	}
	if hasLo && lo.Up != want.Loopback {
		fixes = append(fixes, Fix{Kind: FixLoopback, Reason: fmt.Sprintf("lo is %s, want %s", upDown(lo.Up), upDown(want.Loopback))})
	}
	for vi, v := range want.Veths {
		vf, err := diffVeth(vi, v, got)
		if err != nil {
			return nil, err
		}
		fixes = append(fixes, vf...)
	}
	for _, a := range want.LoopbackAddrs {
		if !slices.Contains(got.Addrs[rtnl.LoopbackIndex], a) {
			fixes = append(fixes, Fix{Kind: FixLoAddr, Addr: a, Reason: fmt.Sprintf("address %s missing on lo", a)})
		}
	}
	for bi, b := range want.Bridges {
		fixes = append(fixes, diffBridge(bi, b, got)...)
	}
	for _, s := range want.Sysctls {
		cur, ok := got.Sysctls[s.Key]
		if !ok || cur != sysctl.Normalize(s.Value) {
			reason := fmt.Sprintf("sysctl %s is %q, want %q", s.Key, cur, s.Value)
			if !ok {
				reason = fmt.Sprintf("sysctl %s is not set, want %q", s.Key, s.Value)
			}
			fixes = append(fixes, Fix{Kind: FixSysctl, Key: s.Key, Reason: reason})
		}
	}
	for ri, r := range want.Routes {
		if !hasRoute(got, want, r) {
			fixes = append(fixes, Fix{Kind: FixRoute, Route: ri, Reason: fmt.Sprintf("route %s %s missing", r.To, via(r))})
		}
	}
	return fixes, nil
}

func via(r spec.Route) string {
	if r.Via.IsValid() {
		return "via " + r.Via.String()
	}
	return "dev " + r.Dev
}

func upDown(b bool) string {
	if b {
		return "up"
	}
	return "down"
}

func hasRoute(got *Observed, want *spec.Namespace, r spec.Route) bool {
	idx := 0
	if r.Dev != "" {
		l, ok := got.link(r.Dev)
		if !ok {
			return false
		}
		idx = l.Index
	}
	for _, have := range got.Routes {
		if have.To == r.To && have.Via == r.Via && (idx == 0 || have.Index == idx) {
			return true
		}
	}
	return false
}

func diffVeth(vi int, v spec.Veth, got *Observed) ([]Fix, error) {
	host, hostOK := got.HostLinks[v.Host]
	peer, peerOK := got.link(v.Peer)
	end, ours := got.pairedHere(host)
	paired := hostOK && peerOK && ours && end.Index == peer.Index
	pair := v.Host + "/" + v.Peer
	if !paired {
		var del []DeleteLink
		if hostOK {
			// Only a veth whose other end is in this namespace (ours) may
			// be removed; anything else on the host is not ours to touch.
			if !ours {
				return nil, &Conflict{Reason: fmt.Sprintf("veth %s: host interface %s already exists and is not a veth paired with this namespace", pair, v.Host)}
			}
			del = append(del, DeleteLink{Host: true, Index: host.Index, Name: v.Host})
		}
		if peerOK {
			// A stray device of that name inside our namespace: it goes,
			// unless it is the other end of the host link just removed.
			if !(hostOK && peer.PeerIndex == host.Index && peer.Type == "veth") {
				del = append(del, DeleteLink{Index: peer.Index, Name: v.Peer})
			}
		}
		kind, reason := FixVeth, "veth "+pair+" missing"
		if len(del) > 0 {
			kind, reason = FixReplaceVeth, "veth "+pair+" is not a pair between the host and this namespace; re-create it"
		}
		return []Fix{{Kind: kind, Veth: vi, Delete: del, Reason: reason}}, nil
	}
	var fixes []Fix
	if v.MTU != 0 && (host.MTU != v.MTU || peer.MTU != v.MTU) {
		fixes = append(fixes, Fix{Kind: FixVethMTU, Veth: vi, Reason: fmt.Sprintf("veth %s mtu %d/%d, want %d", pair, host.MTU, peer.MTU, v.MTU)})
	}
	if v.HostIPv6Off && got.HostIPv6On[v.Host] {
		// Before the veth goes up (fixes are applied in order).
		fixes = append(fixes, Fix{Kind: FixHostIPv6, Veth: vi, Reason: fmt.Sprintf("IPv6 is on on %s, want off", v.Host)})
	}
	if v.Up && (!host.Up || !peer.Up) {
		fixes = append(fixes, Fix{Kind: FixVethUp, Veth: vi, Reason: fmt.Sprintf("veth %s is %s/%s, want up", pair, upDown(host.Up), upDown(peer.Up))})
	}
	for _, a := range v.HostAddrs {
		if !slices.Contains(got.HostAddrs[host.Index], a) {
			fixes = append(fixes, Fix{Kind: FixHostAddr, Veth: vi, Addr: a, Reason: fmt.Sprintf("address %s missing on %s", a, v.Host)})
		}
	}
	for _, a := range v.PeerAddrs {
		if !slices.Contains(got.Addrs[peer.Index], a) {
			fixes = append(fixes, Fix{Kind: FixPeerAddr, Veth: vi, Addr: a, Reason: fmt.Sprintf("address %s missing on %s", a, v.Peer)})
		}
	}
	return fixes, nil
}

// diffBridge compares one bridge: the device, its MTU, state and
// addresses, and its ports (those that exist: a link's end is made after
// the namespace, and enslaved once it is there).
func diffBridge(bi int, b spec.Bridge, got *Observed) []Fix {
	l, ok := got.link(b.Name)
	if !ok || l.Type != "bridge" {
		f := Fix{Kind: FixBridge, Bridge: bi, Reason: "bridge " + b.Name + " missing"}
		if ok {
			f.Delete = []DeleteLink{{Index: l.Index, Name: b.Name}}
			f.Reason = fmt.Sprintf("%s is a %s, want a bridge; re-create it", b.Name, l.Type)
		}
		return []Fix{f}
	}
	var fixes []Fix
	if b.MTU != 0 && l.MTU != b.MTU {
		fixes = append(fixes, Fix{Kind: FixBridgeMTU, Bridge: bi, Reason: fmt.Sprintf("bridge %s mtu %d, want %d", b.Name, l.MTU, b.MTU)})
	}
	for _, p := range b.Ports {
		if port, ok := got.link(p); ok && port.Master != l.Index {
			fixes = append(fixes, Fix{Kind: FixBridgePort, Bridge: bi, Index: port.Index, Reason: fmt.Sprintf("%s is not a port of bridge %s", p, b.Name)})
		}
	}
	for _, a := range b.Addrs {
		if !slices.Contains(got.Addrs[l.Index], a) {
			fixes = append(fixes, Fix{Kind: FixBridgeAddr, Bridge: bi, Addr: a, Reason: fmt.Sprintf("address %s missing on %s", a, b.Name)})
		}
	}
	if l.Up != b.Up {
		fixes = append(fixes, Fix{Kind: FixBridgeUp, Bridge: bi, Reason: fmt.Sprintf("bridge %s is %s, want %s", b.Name, upDown(l.Up), upDown(b.Up))})
	}
	return fixes
}

// DiffLinkEnds lists how the ends of want's links in this namespace
// differ from the spec, as seen from inside it alone (ls): missing, not a
// veth, down, MTU, addresses. Up repairs links as pairs, with both namespaces open (see
// upLinks); this is for reports.
func DiffLinkEnds(want *spec.Namespace, got *Observed) []string {
	var out []string
	for i := range want.Links {
		l := &want.Links[i]
		mine, _ := l.Ends(want.Name)
		have, ok := got.link(mine.Interface)
		switch {
		case !ok:
			out = append(out, "link "+l.String()+" missing")
			continue
		case have.Type != "veth" || have.PeerIndex <= 0:
			// Which namespace its peer is in is not asked (see
			// rtnl.Survey); numbers alone (pairedInside) match too often
			// between namespaces that all number from 1.
			out = append(out, fmt.Sprintf("link %s: %s is not a veth", l, mine.Interface))
			continue
		}
		if l.MTU != 0 && have.MTU != l.MTU {
			out = append(out, fmt.Sprintf("link %s: %s mtu %d, want %d", l, mine.Interface, have.MTU, l.MTU))
		}
		if have.Up != l.Up {
			out = append(out, fmt.Sprintf("link %s: %s is %s, want %s", l, mine.Interface, upDown(have.Up), upDown(l.Up)))
		}
		for _, a := range mine.Addrs {
			if !slices.Contains(got.Addrs[have.Index], a) {
				out = append(out, fmt.Sprintf("address %s missing on %s", a, mine.Interface))
			}
		}
	}
	return out
}
