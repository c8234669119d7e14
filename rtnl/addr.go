package rtnl

// Addresses and routes of one namespace.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// AddAddr adds (or replaces) an address on a link.
func (c *Conn) AddAddr(index int, p netip.Prefix) error {
	if err := c.full(); err != nil {
		return err
	}
	if err := c.h.AddrReplace(byIndex(index), &netlink.Addr{IPNet: ipNet(p)}); err != nil {
		return fmt.Errorf("address %s on link %d: %w", p, index, err)
	}
	return nil
}

// DeleteAddr removes an address from a link; one that is not there is
// not an error.
func (c *Conn) DeleteAddr(index int, p netip.Prefix) error {
	if err := c.full(); err != nil {
		return err
	}
	err := c.h.AddrDel(byIndex(index), &netlink.Addr{IPNet: ipNet(p)})
	if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete address %s on link %d: %w", p, index, err)
	}
	return nil
}

// Addrs returns every address of every link, by ifindex.
func (c *Conn) Addrs() (map[int][]netip.Prefix, error) {
	if err := c.full(); err != nil {
		return nil, err
	}
	var as []netlink.Addr
	if err := retryDump(func() (err error) { as, err = c.h.AddrList(nil, unix.AF_UNSPEC); return err }); err != nil {
		return nil, fmt.Errorf("dump addresses: %w", err)
	}
	out := map[int][]netip.Prefix{}
	for _, a := range as {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		out[a.LinkIndex] = append(out[a.LinkIndex], netip.PrefixFrom(ip.Unmap(), ones))
	}
	return out, nil
}

// AddrsOf returns the addresses of the given links, by ifindex: for a few
// links of a host with many, where Addrs would dump them all. The kernel
// is asked for one link at a time (a dump filtered by index, with strict
// checking: Linux 4.20); a kernel that cannot filter sends everything,
// which is filtered here.
func (c *Conn) AddrsOf(indexes []int) (map[int][]netip.Prefix, error) {
	out := make(map[int][]netip.Prefix, len(indexes))
	if len(indexes) == 0 {
		return out, nil
	}
	_ = unix.SetsockoptInt(c.raw.fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
	for _, want := range indexes {
		if _, done := out[want]; done {
			continue
		}
		var got []netip.Prefix
		err := retryDump(func() error {
			got = got[:0]
			req := c.request(unix.RTM_GETADDR, unix.NLM_F_DUMP)
			msg := nl.NewIfAddrmsg(unix.AF_UNSPEC)
			msg.Index = uint32(want)
			req.AddData(msg)
			return c.raw.run(call{req: req, resType: unix.RTM_NEWADDR, f: func(b []byte) error {
				index, p, ok, err := parseAddr(b)
				if err == nil && ok && index == want {
					got = append(got, p)
				}
				return err
			}})
		})
		if errors.Is(err, unix.ENODEV) {
			err = nil // gone: no addresses
		}
		if err != nil {
			return nil, fmt.Errorf("addresses of link %d: %w", want, err)
		}
		out[want] = slices.Clone(got)
	}
	return out, nil
}

// Route is a unicast route in the main table.
type Route struct {
	To    netip.Prefix
	Via   netip.Addr
	Index int // output device, 0 if unspecified
}

// ReplaceRoute adds or replaces a route in the main table.
func (c *Conn) ReplaceRoute(r Route) error {
	if err := c.full(); err != nil {
		return err
	}
	nr := &netlink.Route{Dst: ipNet(r.To), LinkIndex: r.Index}
	if r.Via.IsValid() {
		nr.Gw = net.IP(r.Via.AsSlice())
	}
	if err := c.h.RouteReplace(nr); err != nil {
		return fmt.Errorf("route %s via %s: %w", r.To, r.Via, err)
	}
	return nil
}

// DeleteRoute removes a route from the main table; one that is not there
// is not an error.
func (c *Conn) DeleteRoute(r Route) error {
	if err := c.full(); err != nil {
		return err
	}
	nr := &netlink.Route{Dst: ipNet(r.To), LinkIndex: r.Index, Table: unix.RT_TABLE_MAIN}
	if r.Via.IsValid() {
		nr.Gw = net.IP(r.Via.AsSlice())
	}
	if err := c.h.RouteDel(nr); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete route %s via %s: %w", r.To, r.Via, err)
	}
	return nil
}

// Routes dumps the main table's unicast routes of both families.
func (c *Conn) Routes() ([]Route, error) {
	if err := c.full(); err != nil {
		return nil, err
	}
	var rs []netlink.Route
	if err := retryDump(func() (err error) {
		rs, err = c.h.RouteListFiltered(unix.AF_UNSPEC, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		return err
	}); err != nil {
		return nil, fmt.Errorf("dump routes: %w", err)
	}
	out := make([]Route, 0, len(rs))
	for _, r := range rs {
		rt := Route{Index: r.LinkIndex}
		switch {
		case r.Dst != nil:
			ip, _ := netip.AddrFromSlice(r.Dst.IP)
			ones, _ := r.Dst.Mask.Size()
			rt.To = netip.PrefixFrom(ip.Unmap(), ones)
		case r.Family == unix.AF_INET6:
			rt.To = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		default:
			rt.To = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		}
		if r.Gw != nil {
			gw, _ := netip.AddrFromSlice(r.Gw)
			rt.Via = gw.Unmap()
		}
		out = append(out, rt)
	}
	return out, nil
}
