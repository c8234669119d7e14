package fleet

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
	"github.com/nsfleet/nsfleet/sysctl"
)

// repair inspects a pinned namespace and applies the fixes Diff finds.
func (w *worker) repair(ns *spec.Namespace) Result {
	res := Result{Name: ns.Name}
	h, err := w.rd.Open(ns.Name)
	if err != nil {
		res.Action, res.Err = Failed, &Error{Op: "up", Namespace: ns.Name, Err: err}
		return res
	}
	defer h.Close()
	obs := Observed{HostAddrs: w.snap.addrs}
	if obs.HostLinks, err = w.snap.hostLinks(ns); err == nil {
		obs.HostIPv6On, err = w.snap.hostIPv6(ns)
	}
	if err != nil {
		res.Action, res.Err = Failed, &Error{Op: "up", Namespace: ns.Name, Err: err}
		return res
	}
	if err := w.sysctls.NextNamespace(); err != nil {
		res.Action, res.Err = Failed, &Error{Op: "up", Namespace: ns.Name, Err: err}
		return res
	}
	var fixes []Fix
	prev := w.opts.previous(ns.Name)
	open := rtnl.OpenLite
	if needsFullConn(ns) || prev != nil && needsFullConn(prev) {
		open = rtnl.Open
	}
	err = rtnl.Inside(h, open, func(in *rtnl.Conn) error {
		var err error
		if err := observe(in, w.sysctls, ns, prev, &obs); err != nil {
			return err
		}
		if !obs.Owned() && !w.opts.Adopt {
			return ErrForeign
		}
		if fixes, err = Diff(ns, &obs, w.opts.Adopt); err != nil {
			return err
		}
		fixes = append(Prune(prev, ns, &obs), fixes...)
		if len(fixes) == 0 || w.opts.DryRun {
			return nil
		}
		for _, f := range fixes {
			if err := w.apply(in, h, ns, &obs, f); err != nil {
				return fmt.Errorf("repair (%s): %w", f.Reason, err)
			}
		}
		return nil
	})
	for _, f := range fixes {
		res.Fixes = append(res.Fixes, f.Reason)
	}
	if err == nil && (len(ns.Processes) > 0 || prev != nil && len(prev.Processes) > 0) {
		var started []string
		started, err = w.startProcesses(h, ns, prev)
		res.Fixes = append(res.Fixes, started...)
		if len(started) > 0 && len(fixes) == 0 {
			fixes = append(fixes, Fix{}) // counts as a repair
		}
	}
	switch {
	case errors.Is(err, ErrForeign):
		res.Action, res.Err = Skipped, &Error{Op: "up", Namespace: ns.Name, Err: err}
	case err != nil:
		res.Action, res.Err = Failed, &Error{Op: "up", Namespace: ns.Name, Err: err}
	case len(fixes) == 0:
		res.Action = Unchanged
	case w.opts.DryRun:
		res.Action = WouldRepair
	default:
		res.Action = Repaired
	}
	return res
}

// observe reads the namespace's state; it runs inside the namespace. Its
// links and the sysctls netconf carries (ip_forward, a fake router's one
// sysctl: see sysctl.Netconf) are read by rtnl.Survey, which gives the
// namespace no id for the host; other sysctls are read from procfs.
func observe(in *rtnl.Conn, pfs *sysctl.Procfs, ns, prev *spec.Namespace, obs *Observed) error {
	var confs []rtnl.NetconfKey
	for _, s := range ns.Sysctls {
		if f, ok := sysctl.Netconf(s.Key); ok && !slices.Contains(confs, netconfKey(f)) {
			confs = append(confs, netconfKey(f))
		}
	}
	r, err := in.Survey(confs)
	if err != nil {
		return err
	}
	obs.Links = r.Links
	if len(ns.Bridges) > 0 {
		// Survey reads veths by ioctl, which says nothing of a master.
		ports, err := in.BridgePorts()
		if err != nil {
			return err
		}
		for i := range obs.Links {
			if m, ok := ports[obs.Links[i].Index]; ok {
				obs.Links[i].Master = m
			}
		}
	}
	if needsAddrs(ns, prev) {
		if obs.Addrs, err = in.Addrs(); err != nil {
			return err
		}
	}
	if needsRoutes(ns, prev) {
		if obs.Routes, err = in.Routes(); err != nil {
			return err
		}
	}
	obs.Sysctls = make(map[string]string, len(ns.Sysctls))
	for _, s := range ns.Sysctls {
		if f, ok := sysctl.Netconf(s.Key); ok {
			if v, ok := r.Netconf[netconfKey(f)][f.Attr]; ok {
				obs.Sysctls[s.Key] = strconv.Itoa(int(v))
				continue
			}
			// Not answered (IPv6 disabled, an old kernel): procfs.
		}
		v, err := pfs.Read(s.Key)
		if errors.Is(err, sysctl.ErrUnknownKey) {
			continue
		}
		if err != nil {
			return err
		}
		obs.Sysctls[s.Key] = v
	}
	return nil
}

func netconfKey(f sysctl.NetconfField) rtnl.NetconfKey {
	return rtnl.NetconfKey{Family: f.Family, Index: f.Index}
}

// confirm makes sure, before a host link is changed, that it is paired with
// a veth of this namespace by the host's word too: Diff took this side's
// (Observed.pairedHere).
func (w *worker) confirm(obs *Observed, name string, index int) error {
	peer, ok, err := w.snap.dev.IfLink(name)
	if err != nil {
		return fmt.Errorf("host: %w", err)
	}
	if _, paired := obs.pairedHere(rtnl.Link{Name: name, Index: index, PeerIndex: peer}); !ok || !paired {
		return &Conflict{Reason: fmt.Sprintf("host interface %s is not a veth paired with this namespace", name)}
	}
	return nil
}

// apply carries out one fix; it runs inside the namespace.
func (w *worker) apply(in *rtnl.Conn, h *netns.NS, ns *spec.Namespace, obs *Observed, f Fix) error {
	switch f.Kind {
	case FixMarker, FixLoopback:
		return in.SetLoopback(ns.Loopback, Marker)
	case FixVeth, FixReplaceVeth:
		for _, d := range f.Delete {
			c := in
			if d.Host {
				if err := w.confirm(obs, d.Name, d.Index); err != nil {
					return err
				}
				c = w.host
			}
			if err := c.DeleteLink(d.Index); err != nil {
				return fmt.Errorf("%s: %w", d.Name, err)
			}
		}
		return w.addVeth(in, h, ns.Veths[f.Veth])
	case FixVethMTU, FixVethUp, FixHostAddr, FixPeerAddr, FixHostIPv6:
		v := ns.Veths[f.Veth]
		host, peer := obs.HostLinks[v.Host], rtnl.Link{}
		peer, _ = obs.link(v.Peer)
		if err := w.confirm(obs, v.Host, host.Index); err != nil {
			return err
		}
		switch f.Kind {
		case FixVethMTU:
			if err := w.host.SetMTU(host.Index, v.MTU); err != nil {
				return err
			}
			return in.SetMTU(peer.Index, v.MTU)
		case FixHostIPv6:
			return w.snap.setHostIPv6Off(v.Host)
		case FixVethUp:
			if err := w.host.SetUp(host.Index, true); err != nil {
				return err
			}
			return in.SetUp(peer.Index, true)
		case FixHostAddr:
			return w.host.AddAddr(host.Index, f.Addr)
		default:
			return in.AddAddr(peer.Index, f.Addr)
		}
	case FixSysctl:
		for _, s := range ns.Sysctls {
			if s.Key == f.Key {
				return w.sysctls.Write(s.Key, s.Value)
			}
		}
	case FixRoute:
		return addRoute(in, ns.Routes[f.Route])
	case FixLoAddr:
		return in.AddAddr(rtnl.LoopbackIndex, f.Addr)
	case FixBridge:
		for _, d := range f.Delete {
			if err := in.DeleteLink(d.Index); err != nil {
				return fmt.Errorf("%s: %w", d.Name, err)
			}
		}
		return addBridge(in, ns.Bridges[f.Bridge])
	case FixBridgeMTU, FixBridgeUp, FixBridgeAddr, FixBridgePort:
		b := ns.Bridges[f.Bridge]
		l, _ := obs.link(b.Name)
		switch f.Kind {
		case FixBridgeMTU:
			return in.SetMTU(l.Index, b.MTU)
		case FixBridgeUp:
			return in.SetUp(l.Index, b.Up)
		case FixBridgeAddr:
			return in.AddAddr(l.Index, f.Addr)
		default:
			return in.SetMaster(f.Index, l.Index)
		}
	case FixDropVeth, FixDropLink:
		return in.DeleteLink(f.Index)
	case FixDropPeerAddr:
		return in.DeleteAddr(f.Index, f.Addr)
	case FixDropHostAddr:
		if err := w.confirm(obs, ns.Veths[f.Veth].Host, f.Index); err != nil {
			return err
		}
		return w.host.DeleteAddr(f.Index, f.Addr)
	case FixDropRoute:
		return in.DeleteRoute(rtnl.Route{To: f.Old.To, Via: f.Old.Via, Index: f.Index})
	}
	return nil
}
