// Package rtnl is nsfleet's route-netlink layer: links, veth pairs,
// addresses and routes in one network namespace, over a socket opened once.
//
// # Threading contract
//
// A netlink socket belongs to the network namespace of the thread that
// opened it, for its whole life. Open therefore binds a Conn to the calling
// thread's namespace: call it inside netns.Create or netns.Do to get a Conn
// for another namespace. Once open, a Conn may be used from any goroutine
// and any thread (calls are serialised on the socket). Veth peers are placed
// in their namespace by file descriptor, never moved there afterwards.
//
// Dumps interrupted by a concurrent change (NLM_F_DUMP_INTR) are retried a
// bounded number of times; no decision is taken from a partial dump.
package rtnl

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// dumpRetries bounds the retries of an interrupted dump.
const dumpRetries = 8

// ErrDumpInterrupted is returned when every retry of a dump was interrupted.
var ErrDumpInterrupted = errors.New("netlink dump interrupted repeatedly by concurrent changes")

// Conn is a route-netlink connection bound to one network namespace.
type Conn struct {
	h *netlink.Handle
}

// Open opens a Conn in the calling thread's network namespace.
func Open() (*Conn, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	return &Conn{h: h}, nil
}

// Close closes the socket.
func (c *Conn) Close() {
	if c != nil && c.h != nil {
		c.h.Close()
		c.h = nil
	}
}

// LoopbackIndex is lo's ifindex in every network namespace.
const LoopbackIndex = 1

// Link is what nsfleet needs to know of a network device.
type Link struct {
	Index int
	Name  string
	Type  string // "veth", "device" (lo), "bridge", ...
	Up    bool   // administratively up (IFF_UP)
	MTU   int
	Alias string
	// For a veth: the peer's ifindex and the id of the peer's namespace as
	// seen from here (-1: same namespace, i.e. no IFLA_LINK_NETNSID).
	PeerIndex int
	PeerNsID  int
}

func fromNetlink(l netlink.Link) Link {
	a := l.Attrs()
	out := Link{
		Index:     a.Index,
		Name:      a.Name,
		Type:      l.Type(),
		Up:        a.Flags&net.FlagUp != 0,
		MTU:       a.MTU,
		Alias:     a.Alias,
		PeerIndex: a.ParentIndex,
		PeerNsID:  a.NetNsID,
	}
	return out
}

// Links dumps every link.
func (c *Conn) Links() ([]Link, error) {
	for try := 0; try < dumpRetries; try++ {
		ls, err := c.h.LinkList()
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("dump links: %w", err)
		}
		out := make([]Link, len(ls))
		for i, l := range ls {
			out[i] = fromNetlink(l)
		}
		return out, nil
	}
	return nil, fmt.Errorf("dump links: %w", ErrDumpInterrupted)
}

// LinkByName looks one link up.
func (c *Conn) LinkByName(name string) (Link, error) {
	l, err := c.h.LinkByName(name)
	if err != nil {
		return Link{}, fmt.Errorf("link %s: %w", name, err)
	}
	return fromNetlink(l), nil
}

// LinkByIndex looks one link up by ifindex.
func (c *Conn) LinkByIndex(index int) (Link, error) {
	l, err := c.h.LinkByIndex(index)
	if err != nil {
		return Link{}, fmt.Errorf("link %d: %w", index, err)
	}
	return fromNetlink(l), nil
}

func byIndex(i int) netlink.Link { return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: i}} }

// SetUp sets the link up or down.
func (c *Conn) SetUp(index int, up bool) error {
	var err error
	if up {
		err = c.h.LinkSetUp(byIndex(index))
	} else {
		err = c.h.LinkSetDown(byIndex(index))
	}
	if err != nil {
		return fmt.Errorf("link %d set up=%v: %w", index, up, err)
	}
	return nil
}

// SetAlias sets the link's alias (ifalias; `ip link show` prints it).
func (c *Conn) SetAlias(index int, alias string) error {
	if err := c.h.LinkSetAlias(byIndex(index), alias); err != nil {
		return fmt.Errorf("link %d set alias: %w", index, err)
	}
	return nil
}

// SetMTU sets the link's MTU.
func (c *Conn) SetMTU(index, mtu int) error {
	if err := c.h.LinkSetMTU(byIndex(index), mtu); err != nil {
		return fmt.Errorf("link %d set mtu %d: %w", index, mtu, err)
	}
	return nil
}

// VethPair describes a pair to create: Host in the Conn's namespace, Peer
// created directly in the namespace open as PeerNsFd.
type VethPair struct {
	Host     string
	Peer     string
	MTU      int // 0: kernel default
	PeerNsFd int
}

// AddVeth creates the pair in one request; the kernel makes both ends or
// neither. It returns the host end's ifindex.
func (c *Conn) AddVeth(v VethPair) (int, error) {
	l := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: v.Host, MTU: v.MTU},
		PeerName:      v.Peer,
		PeerNamespace: netlink.NsFd(v.PeerNsFd),
	}
	if err := c.h.LinkAdd(l); err != nil {
		return 0, fmt.Errorf("veth %s/%s: %w", v.Host, v.Peer, err)
	}
	return l.Attrs().Index, nil
}

// DeleteLink deletes a link (and, for a veth, its peer).
func (c *Conn) DeleteLink(index int) error {
	if err := c.h.LinkDel(byIndex(index)); err != nil {
		return fmt.Errorf("delete link %d: %w", index, err)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// AddAddr adds (or replaces) an address on a link.
func (c *Conn) AddAddr(index int, p netip.Prefix) error {
	if err := c.h.AddrReplace(byIndex(index), &netlink.Addr{IPNet: ipNet(p)}); err != nil {
		return fmt.Errorf("address %s on link %d: %w", p, index, err)
	}
	return nil
}

// Addrs returns every address of every link, by ifindex.
func (c *Conn) Addrs() (map[int][]netip.Prefix, error) {
	for try := 0; try < dumpRetries; try++ {
		as, err := c.h.AddrList(nil, unix.AF_UNSPEC)
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("dump addresses: %w", err)
		}
		out := map[int][]netip.Prefix{}
		for _, a := range as {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok {
				continue
			}
			if ip.Is4In6() {
				ip = ip.Unmap()
			}
			ones, _ := a.Mask.Size()
			out[a.LinkIndex] = append(out[a.LinkIndex], netip.PrefixFrom(ip, ones))
		}
		return out, nil
	}
	return nil, fmt.Errorf("dump addresses: %w", ErrDumpInterrupted)
}

// Route is a unicast route in the main table.
type Route struct {
	To    netip.Prefix
	Via   netip.Addr
	Index int // output device, 0 if unspecified
}

// ReplaceRoute adds or replaces a route in the main table.
func (c *Conn) ReplaceRoute(r Route) error {
	nr := &netlink.Route{Dst: ipNet(r.To), LinkIndex: r.Index}
	if r.Via.IsValid() {
		nr.Gw = net.IP(r.Via.AsSlice())
	}
	if err := c.h.RouteReplace(nr); err != nil {
		return fmt.Errorf("route %s via %s: %w", r.To, r.Via, err)
	}
	return nil
}

// Routes dumps the main table's unicast routes of both families.
func (c *Conn) Routes() ([]Route, error) {
	for try := 0; try < dumpRetries; try++ {
		rs, err := c.h.RouteListFiltered(unix.AF_UNSPEC, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("dump routes: %w", err)
		}
		out := make([]Route, 0, len(rs))
		for _, r := range rs {
			var rt Route
			rt.Index = r.LinkIndex
			if r.Dst != nil {
				ip, _ := netip.AddrFromSlice(r.Dst.IP)
				ones, _ := r.Dst.Mask.Size()
				rt.To = netip.PrefixFrom(ip.Unmap(), ones)
			} else if r.Family == unix.AF_INET6 {
				rt.To = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
			} else {
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
	return nil, fmt.Errorf("dump routes: %w", ErrDumpInterrupted)
}

// NsID returns the id this namespace uses for the namespace open as fd, or
// -1 when it has none assigned.
func (c *Conn) NsID(fd int) (int, error) {
	id, err := c.h.GetNetNsIdByFd(fd)
	if err != nil {
		return -1, fmt.Errorf("get nsid: %w", err)
	}
	return id, nil
}
