package fleet

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
)

// A link whose two namespaces are served by two nodes of a cluster is a
// VXLAN tunnel between the nodes: each node makes its end as a VXLAN
// device named as the link's interface, directly inside the namespace
// from nsfleet's own (whose network carries the tunnel, the underlay),
// with the link's VNI. Frames for an address the device has not learned
// go to every other node (head-end replication); it learns where the
// other end is from what it receives, so a namespace that moves to
// another node is found again without the other node changing anything.
// The other end's device has the same MAC wherever it is made (from the
// VNI and the end), so that neighbours' ARP caches stay right.

// VXLANOverhead is what VXLAN over IPv4 adds to a frame: outer IPv4 (20),
// UDP (8), VXLAN (8) and inner Ethernet (14) headers.
const VXLANOverhead = 50

// Tunnel says how this node makes its tunnel ends.
type Tunnel struct {
	// Remote reports whether another node serves the namespace: a link
	// to it is a tunnel.
	Remote func(namespace string) bool
	Local  netip.Addr   // this node's underlay address
	Peers  []netip.Addr // every other node's: where frames for unknown addresses go
	Port   int          // UDP port; 0: 4789
	// MTU is the underlay's (0: 1500): a tunnel end's MTU is at most
	// MTU - VXLANOverhead, and the link's own when that is lower.
	MTU int
}

func (t *Tunnel) port() int {
	if t.Port == 0 {
		return 4789
	}
	return t.Port
}

// EndMTU is the MTU of a tunnel end of l.
func (t *Tunnel) EndMTU(l *spec.Link) int {
	under := t.MTU
	if under == 0 {
		under = 1500
	}
	m := under - VXLANOverhead
	if l.MTU > 0 && l.MTU < m {
		m = l.MTU
	}
	return m
}

// tunnelMAC is the MAC of one end of a tunnelled link: locally
// administered, from the VNI and the end (0 for A, 1 for B).
func tunnelMAC(vni uint32, end byte) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0x6e, end, byte(vni >> 16), byte(vni >> 8), byte(vni)}
}

// split says which end of l is served here when the other is remote.
func (t *Tunnel) split(l *spec.Link) (local spec.LinkEnd, end byte, ok bool) {
	ra, rb := t.Remote(l.A.Namespace), t.Remote(l.B.Namespace)
	switch {
	case ra && !rb:
		return l.B, 1, true
	case rb && !ra:
		return l.A, 0, true
	}
	return spec.LinkEnd{}, 0, false
}

// tunnelUp makes this node's end of a tunnelled link match: a VXLAN
// device of the link's VNI from this node's address, MTU and MAC as
// above, flooding to every other node, with the end's addresses and
// state. Anything else standing under its name (a veth from when both
// ends were here, a device of another VNI) is removed first.
func (w *linkWorker) tunnelUp(l *spec.Link, t *Tunnel, check func(spec.LinkEnd) bool) ([]string, error) {
	end, side, _ := t.split(l)
	if l.VNI == 0 {
		return nil, fmt.Errorf("link %s: its ends are on two nodes and it has no VNI", l)
	}
	s, err := w.open(end, true, check(end))
	if err != nil {
		return nil, err
	}
	defer s.close()
	mtu, mac := t.EndMTU(l), tunnelMAC(l.VNI, side)
	var did []string
	if why := tunnelDiffers(s, l.VNI, t, mtu); why != "" {
		did = append(did, fmt.Sprintf("tunnel %s (VNI %d, MTU %d): %s", end, l.VNI, mtu, why))
		if w.dryRun {
			return did, nil
		}
		if s.found {
			if err := s.in.DeleteLink(s.link.Index); err != nil {
				return did, fmt.Errorf("%s: %w", end, err)
			}
		}
		if w.host == nil {
			// The worker's thread is in nsfleet's own namespace here: the
			// tunnel's underlay.
			if w.host, err = rtnl.OpenLite(); err != nil {
				return did, err
			}
		}
		err := w.host.AddVxlan(rtnl.Vxlan{Name: end.Interface, VNI: l.VNI, Local: t.Local, Port: t.port(), MTU: mtu, MAC: mac, NsFd: s.ns.Fd()})
		if err == nil {
			err = s.lookup()
		}
		if err != nil {
			return did, fmt.Errorf("%s: %w", end, err)
		}
	}
	f, err := s.in.SetFlood(s.link.Index, t.Peers)
	did = append(did, f...)
	if err != nil {
		return did, fmt.Errorf("%s: %w", end, err)
	}
	d, err := w.finishEnd(l, s)
	did = append(did, d...)
	if err != nil {
		return did, fmt.Errorf("%s: %w", end, err)
	}
	return did, nil
}

// tunnelDiffers says why the device found is not the tunnel end wanted
// ("" when it is).
func tunnelDiffers(s *linkSide, vni uint32, t *Tunnel, mtu int) string {
	switch v := s.link.Vxlan; {
	case !s.found:
		return "missing"
	case v == nil:
		return "a " + s.link.Type + " stands in its place"
	case v.VNI != vni || v.Local != t.Local || v.Port != t.port():
		return fmt.Sprintf("VNI %d from %s port %d, want VNI %d from %s port %d", v.VNI, v.Local, v.Port, vni, t.Local, t.port())
	case s.link.MTU != mtu:
		return fmt.Sprintf("MTU %d", s.link.MTU)
	}
	return ""
}

// TunnelsDown sets down the VXLAN devices among the named interfaces of
// each pinned namespace (ends: namespace to interfaces): a fenced node
// stops carrying the traffic of namespaces another node may be making
// again, as it sets their host veths down. The next Up sets them up. It
// returns how many it set down; a namespace it cannot enter is skipped.
func TunnelsDown(rd *netns.RunDir, ends map[string][]string) int {
	n := 0
	for name, ifaces := range ends {
		h, err := rd.Open(name)
		if err != nil {
			continue
		}
		rtnl.Inside(h, rtnl.OpenLite, func(c *rtnl.Conn) error {
			for _, ifname := range ifaces {
				if l, err := c.LinkByName(ifname); err == nil && l.Vxlan != nil && l.Up && c.SetUp(l.Index, false) == nil {
					n++
				}
			}
			return nil
		})
		h.Close()
	}
	return n
}
