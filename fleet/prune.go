package fleet

import (
	"fmt"
	"slices"

	"github.com/nsfleet/nsfleet/spec"
)

// Prune lists the fixes that take away what prev asked of a namespace and
// want no longer asks: veths and links dropped from the spec, addresses
// dropped from a veth that stays, and routes dropped. It touches only what prev
// declared (as `kubectl apply` does with its last-applied configuration):
// an address or route that another program added (keepalived's VIPs, a
// routing daemon's routes) is left alone. Sysctls dropped from the spec
// keep their value (there is no "unset"), and so do MTU and link state.
//
// Prune's fixes come before Diff's: an address that moved from one veth
// to another, or a route whose gateway changed, is removed before it is
// added again.
func Prune(prev, want *spec.Namespace, got *Observed) []Fix {
	if prev == nil || want == nil {
		return nil
	}
	var fixes []Fix
	wantPeers := map[string]bool{}
	for _, v := range want.Veths {
		wantPeers[v.Peer] = true
	}
	for _, pv := range prev.Veths {
		wi := slices.IndexFunc(want.Veths, func(v spec.Veth) bool { return v.Host == pv.Host && v.Peer == pv.Peer })
		if wi < 0 {
			// Dropped: deleting the end inside deletes the pair. Only a
			// veth of that name that is not a pair inside the namespace,
			// and not a name the new spec uses for another pair.
			if l, ok := got.link(pv.Peer); ok && l.Type == "veth" && !wantPeers[pv.Peer] && !got.pairedInside(l) {
				fixes = append(fixes, Fix{Kind: FixDropVeth, Index: l.Index, Reason: fmt.Sprintf("veth %s/%s no longer in the spec", pv.Host, pv.Peer)})
			}
			continue
		}
		wv := want.Veths[wi]
		if peer, ok := got.link(pv.Peer); ok {
			for _, a := range pv.PeerAddrs {
				if !slices.Contains(wv.PeerAddrs, a) && slices.Contains(got.Addrs[peer.Index], a) {
					fixes = append(fixes, Fix{Kind: FixDropPeerAddr, Veth: wi, Index: peer.Index, Addr: a,
						Reason: fmt.Sprintf("address %s on %s no longer in the spec", a, pv.Peer)})
				}
			}
		}
		if host, ok := got.HostLinks[pv.Host]; ok && host.Index > 0 {
			for _, a := range pv.HostAddrs {
				if !slices.Contains(wv.HostAddrs, a) && slices.Contains(got.HostAddrs[host.Index], a) {
					fixes = append(fixes, Fix{Kind: FixDropHostAddr, Veth: wi, Index: host.Index, Addr: a,
						Reason: fmt.Sprintf("address %s on %s no longer in the spec", a, pv.Host)})
				}
			}
		}
	}
	fixes = append(fixes, pruneLinks(prev, want, got)...)
	for _, r := range prev.Routes {
		if slices.Contains(want.Routes, r) || !hasRoute(got, prev, r) {
			continue
		}
		f := Fix{Kind: FixDropRoute, Old: r, Reason: fmt.Sprintf("route %s %s no longer in the spec", r.To, via(r))}
		if r.Dev != "" {
			l, _ := got.link(r.Dev)
			f.Index = l.Index
		}
		fixes = append(fixes, f)
	}
	return fixes
}

// pruneLinks deletes this namespace's end of each link prev had and want
// has not, unless want uses the interface's name for something else (its
// own repair re-makes it then). Deleting a veth's end deletes the other
// end with it; a tunnel end is this node's alone.
func pruneLinks(prev, want *spec.Namespace, got *Observed) []Fix {
	if len(prev.Links) == 0 {
		return nil
	}
	used := want.Interfaces()
	var fixes []Fix
	for i := range prev.Links {
		pl := &prev.Links[i]
		mine, _ := pl.Ends(prev.Name)
		if used[mine.Interface] {
			continue
		}
		if l, ok := got.link(mine.Interface); ok && (l.Type == "veth" || l.Type == "vxlan") {
			fixes = append(fixes, Fix{Kind: FixDropLink, Index: l.Index, Reason: fmt.Sprintf("link %s no longer in the spec", pl)})
		}
	}
	return fixes
}

// needsAddrs reports whether reading ns's state (or what prev asked of it)
// needs the addresses inside.
func needsAddrs(ns, prev *spec.Namespace) bool {
	for _, n := range []*spec.Namespace{ns, prev} {
		if n == nil {
			continue
		}
		if len(n.LoopbackAddrs) > 0 || slices.ContainsFunc(n.Bridges, func(b spec.Bridge) bool { return len(b.Addrs) > 0 }) {
			return true
		}
		for i := range n.Links {
			if mine, _ := n.Links[i].Ends(n.Name); len(mine.Addrs) > 0 {
				return true
			}
		}
		for _, v := range n.Veths {
			if len(v.PeerAddrs) > 0 {
				return true
			}
		}
	}
	return false
}

// needsRoutes reports whether reading ns's state (or what prev asked of
// it) needs the routes.
func needsRoutes(ns, prev *spec.Namespace) bool {
	return len(ns.Routes) > 0 || prev != nil && len(prev.Routes) > 0
}
