package rtnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// rtextFilterSkipStats asks the kernel to leave the per-link statistics out
// of a dump (RTEXT_FILTER_SKIP_STATS, Linux 5.11; older kernels ignore it).
// With tens of thousands of links they are most of the dump's bytes.
const rtextFilterSkipStats = 1 << 3

var errShort = errors.New("message too short")

// parseLink decodes the payload of an RTM_NEWLINK message into the few
// fields nsfleet uses. It never panics on malformed input.
func parseLink(b []byte) (Link, error) {
	if len(b) < unix.SizeofIfInfomsg {
		return Link{}, fmt.Errorf("link message: %w", errShort)
	}
	ne := nl.NativeEndian()
	l := Link{
		Index:    int(int32(ne.Uint32(b[4:8]))),
		Up:       ne.Uint32(b[8:12])&unix.IFF_UP != 0,
		Type:     "device",
		PeerNsID: -1,
	}
	var ierr error
	err := walkAttrs(b[unix.SizeofIfInfomsg:], func(a attr) {
		switch a.typ {
		case unix.IFLA_IFNAME:
			l.Name = cstring(a.val)
		case unix.IFLA_IFALIAS:
			l.Alias = cstring(a.val)
		case unix.IFLA_MTU:
			if len(a.val) >= 4 {
				l.MTU = int(ne.Uint32(a.val))
			}
		case unix.IFLA_LINK:
			if len(a.val) >= 4 {
				l.PeerIndex = int(int32(ne.Uint32(a.val)))
			}
		case unix.IFLA_MASTER:
			if len(a.val) >= 4 {
				l.Master = int(ne.Uint32(a.val))
			}
		case unix.IFLA_LINK_NETNSID:
			if len(a.val) >= 4 {
				l.PeerNsID = int(int32(ne.Uint32(a.val)))
				l.PeerElsewhere = true
			}
		case unix.IFLA_LINKINFO:
			var data []byte
			err := walkAttrs(a.val, func(i attr) {
				switch i.typ {
				case unix.IFLA_INFO_KIND:
					l.Type = cstring(i.val)
				case unix.IFLA_INFO_DATA:
					data = i.val
				}
			})
			if err == nil && l.Type == "vxlan" && data != nil {
				l.Vxlan, err = parseVxlan(data)
			}
			if err != nil && ierr == nil {
				ierr = fmt.Errorf("link %d linkinfo: %w", l.Index, err)
			}
		}
	})
	if err != nil {
		return Link{}, fmt.Errorf("link %d: %w", l.Index, err)
	}
	if ierr != nil {
		return Link{}, ierr
	}
	if l.Name == "" {
		return Link{}, fmt.Errorf("link %d: no name", l.Index)
	}
	return l, nil
}

type attr struct {
	typ uint16
	val []byte
}

// walkAttrs calls fn with each attribute of b, in order (NLA_F_NESTED and
// NLA_F_NET_BYTEORDER bits are masked off the type), without building a
// list: a link message has some sixty attributes, and a fleet's reads
// parse three such messages per namespace.
func walkAttrs(b []byte, fn func(attr)) error {
	for len(b) >= unix.SizeofRtAttr {
		n := int(binary.NativeEndian.Uint16(b[0:2]))
		typ := binary.NativeEndian.Uint16(b[2:4]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if n < unix.SizeofRtAttr || n > len(b) {
			return fmt.Errorf("attribute of length %d in %d bytes", n, len(b))
		}
		fn(attr{typ: typ, val: b[unix.SizeofRtAttr:n]})
		aligned := (n + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1)
		if aligned > len(b) {
			break
		}
		b = b[aligned:]
	}
	return nil
}

func cstring(b []byte) string {
	s := string(b)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	return s
}

// getLinks sends an RTM_GETLINK (a dump when index is 0) and parses the
// replies; an interrupted dump is retried with backoff.
func (c *Conn) getLinks(index int, name string, nsid int) ([]Link, error) {
	var out []Link
	err := retryDump(func() error {
		return c.raw.run(c.linksCall(index, name, nsid, &out))
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// linksCall is the RTM_GETLINK request (a dump when index is 0 and name
// empty) whose replies are parsed into *out.
func (c *Conn) linksCall(index int, name string, nsid int, out *[]Link) call {
	flags := unix.NLM_F_ACK
	if index == 0 && name == "" {
		flags = unix.NLM_F_DUMP
	}
	req := c.request(unix.RTM_GETLINK, flags)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_EXT_MASK, nl.Uint32Attr(rtextFilterSkipStats)))
	if name != "" {
		req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	}
	if nsid >= 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_TARGET_NETNSID, nl.Uint32Attr(uint32(nsid))))
	}
	*out = make([]Link, 0, 4) // a namespace of a fleet has a few
	return call{req: req, resType: unix.RTM_NEWLINK, f: func(m []byte) error {
		l, err := parseLink(m)
		if err != nil {
			return err
		}
		*out = append(*out, l)
		return nil
	}}
}

// parseAddr decodes the payload of an RTM_NEWADDR message: the link's
// index and the address with its prefix length, as `ip addr` shows it (the
// local address where there is one, else the address). ok is false for a
// message without an address. It never panics on malformed input.
func parseAddr(b []byte) (index int, p netip.Prefix, ok bool, err error) {
	if len(b) < unix.SizeofIfAddrmsg {
		return 0, netip.Prefix{}, false, fmt.Errorf("address message: %w", errShort)
	}
	bits := int(b[1])
	index = int(nl.NativeEndian().Uint32(b[4:8]))
	var local, addr netip.Addr
	err = walkAttrs(b[unix.SizeofIfAddrmsg:], func(a attr) {
		switch a.typ {
		case unix.IFA_LOCAL:
			local, _ = netip.AddrFromSlice(a.val)
		case unix.IFA_ADDRESS:
			addr, _ = netip.AddrFromSlice(a.val)
		}
	})
	if err != nil {
		return 0, netip.Prefix{}, false, fmt.Errorf("address message: %w", err)
	}
	if local.IsValid() {
		addr = local
	}
	if !addr.IsValid() {
		return index, netip.Prefix{}, false, nil
	}
	addr = addr.Unmap()
	if bits > addr.BitLen() {
		return 0, netip.Prefix{}, false, fmt.Errorf("address message: prefix length %d for %s", bits, addr)
	}
	return index, netip.PrefixFrom(addr, bits), true, nil
}

// parseNetconf decodes the payload of an RTM_NEWNETCONF message: every
// 32-bit attribute by type. It never panics on malformed input.
func parseNetconf(b []byte) (map[uint16]int32, error) {
	const hdr = 4 // struct netconfmsg, aligned
	if len(b) < hdr {
		return nil, fmt.Errorf("netconf message: %w", errShort)
	}
	out := make(map[uint16]int32, 8)
	err := walkAttrs(b[hdr:], func(a attr) {
		if len(a.val) >= 4 {
			out[a.typ] = int32(binary.NativeEndian.Uint32(a.val))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("netconf: %w", err)
	}
	return out, nil
}

// BridgePorts returns the bridge ports of c's namespace, each port's index
// to its bridge's. It dumps the AF_BRIDGE family (as `bridge link` does),
// whose replies name no other namespace: asking a veth port for its master
// by an ordinary RTM_GETLINK would give the namespace an id for its
// peer's (see Survey). Works on a lite Conn.
func (c *Conn) BridgePorts() (map[int]int, error) {
	out := map[int]int{}
	err := retryDump(func() error {
		clear(out)
		req := c.request(unix.RTM_GETLINK, unix.NLM_F_DUMP)
		req.AddData(nl.NewIfInfomsg(unix.AF_BRIDGE))
		return c.raw.run(call{req: req, resType: unix.RTM_NEWLINK, f: func(m []byte) error {
			l, err := parseLink(m)
			if err != nil {
				return err
			}
			if l.Master > 0 {
				out[l.Index] = l.Master
			}
			return nil
		}})
	})
	if err != nil {
		return nil, fmt.Errorf("dump bridge ports: %w", err)
	}
	return out, nil
}
