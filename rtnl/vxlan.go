package rtnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// VxlanInfo is what a VXLAN device tunnels as.
type VxlanInfo struct {
	VNI   uint32
	Local netip.Addr // the underlay address it sends from (invalid: none set)
	Port  int        // the UDP port it sends to and listens on
}

// parseVxlan reads IFLA_INFO_DATA of a VXLAN device.
func parseVxlan(b []byte) (*VxlanInfo, error) {
	v := &VxlanInfo{}
	ne := nl.NativeEndian()
	err := walkAttrs(b, func(a attr) {
		switch a.typ {
		case nl.IFLA_VXLAN_ID:
			if len(a.val) >= 4 {
				v.VNI = ne.Uint32(a.val)
			}
		case nl.IFLA_VXLAN_LOCAL:
			if ip, ok := netip.AddrFromSlice(a.val); ok {
				v.Local = ip
			}
		case nl.IFLA_VXLAN_PORT:
			if len(a.val) >= 2 {
				v.Port = int(binary.BigEndian.Uint16(a.val))
			}
		}
	})
	return v, err
}

// Vxlan is a VXLAN device to create.
type Vxlan struct {
	Name  string
	VNI   uint32
	Local netip.Addr // the underlay address to send from
	Port  int        // UDP port
	MTU   int        // 0: the kernel's choice
	MAC   net.HardwareAddr
	// NsFd, if 0 or more, is the namespace the device is made in. Its
	// underlay stays the namespace of the Conn that makes it: the device
	// tunnels through this namespace's network from inside the other.
	NsFd int
}

// AddVxlan creates a VXLAN device that learns remote addresses from what
// it receives (as a bridge learns ports) and sends frames for unknown
// addresses to its flood list (SetFlood). Works on a lite Conn.
func (c *Conn) AddVxlan(v Vxlan) error {
	if !v.Local.Is4() {
		return fmt.Errorf("vxlan %s: local address %v: want IPv4", v.Name, v.Local)
	}
	req := c.request(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(v.Name)))
	if v.MTU > 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(v.MTU))))
	}
	if len(v.MAC) == 6 {
		req.AddData(nl.NewRtAttr(unix.IFLA_ADDRESS, v.MAC))
	}
	if v.NsFd >= 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(v.NsFd))))
	}
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("vxlan"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	data.AddRtAttr(nl.IFLA_VXLAN_ID, nl.Uint32Attr(v.VNI))
	l4 := v.Local.As4()
	data.AddRtAttr(nl.IFLA_VXLAN_LOCAL, l4[:])
	port := make([]byte, 2)
	binary.BigEndian.PutUint16(port, uint16(v.Port))
	data.AddRtAttr(nl.IFLA_VXLAN_PORT, port)
	data.AddRtAttr(nl.IFLA_VXLAN_LEARNING, []byte{1})
	req.AddData(info)
	if err := c.raw.exec(req, 0, nil); err != nil {
		return fmt.Errorf("vxlan %s (VNI %d): %w", v.Name, v.VNI, err)
	}
	return nil
}

// zeroMAC is the forwarding entry of a VXLAN device for frames to
// addresses it has not learned (and broadcast, multicast).
var zeroMAC = net.HardwareAddr{0, 0, 0, 0, 0, 0}

// SetFlood makes the VXLAN device index send frames for unknown addresses
// to exactly remotes (head-end replication: one copy each), adding and
// removing its all-zero forwarding entries; it says what it changed.
// Needs a full Conn.
func (c *Conn) SetFlood(index int, remotes []netip.Addr) ([]string, error) {
	if c.h == nil {
		return nil, ErrLite
	}
	have, err := c.h.NeighList(index, unix.AF_BRIDGE)
	if err != nil {
		return nil, fmt.Errorf("forwarding entries of %d: %w", index, err)
	}
	var did []string
	var haveIPs []netip.Addr
	for _, n := range have {
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok || !slices.Equal(n.HardwareAddr, zeroMAC) {
			continue // learned, or not a flood entry
		}
		ip = ip.Unmap()
		if slices.Contains(remotes, ip) {
			haveIPs = append(haveIPs, ip)
			continue
		}
		did = append(did, "flood to "+ip.String()+" removed")
		if err := c.h.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			return did, fmt.Errorf("remove flood entry %s: %w", ip, err)
		}
	}
	for _, r := range remotes {
		if slices.Contains(haveIPs, r) {
			continue
		}
		did = append(did, "flood to "+r.String())
		n := &netlink.Neigh{LinkIndex: index, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
			State: netlink.NUD_PERMANENT | netlink.NUD_NOARP, HardwareAddr: zeroMAC, IP: r.AsSlice()}
		if err := c.h.NeighAppend(n); err != nil && !errors.Is(err, unix.EEXIST) {
			return did, fmt.Errorf("flood entry %s: %w", r, err)
		}
	}
	return did, nil
}
