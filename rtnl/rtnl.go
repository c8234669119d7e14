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
//
// # Reading without namespace ids
//
// Any rtnetlink answer that describes a veth whose peer is in another
// namespace gives the asking namespace an id for that one, and ids make
// the kernel's teardown of every namespace dearer. A fleet's reads use
// Survey, which asks by ioctls (on the Conn's socket, so for its
// namespace) and by dumps that describe no veth; LinkByName, LinkByIndex
// and Links do describe them.
package rtnl

import (
	"errors"
	"fmt"
	"time"

	"github.com/nsfleet/nsfleet/internal/pool"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// dumpRetries bounds the retries of an interrupted dump; between tries the
// wait doubles from 1 ms up to 128 ms, so that a burst of changes (another
// tool creating links) can pass. About 4.5 s in all; under changes that
// never pause, callers fall back to lookups one by one (see IsInterrupted).
const dumpRetries = 40

// backoff sleeps before retry number try (0-based) of an interrupted dump.
func backoff(try int) {
	time.Sleep(time.Millisecond << min(try, 7))
}

// retryDump runs one dump until it is not interrupted, at most dumpRetries
// times with back-off.
func retryDump(dump func() error) error {
	for try := 0; try < dumpRetries; try++ {
		err := dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) && !errors.Is(err, nl.ErrDumpInterrupted) {
			return err
		}
		backoff(try)
	}
	return ErrDumpInterrupted
}

// Inside runs fn with a Conn opened (by open: Open or OpenLite) inside ns,
// on a thread switched into it by netns.Do; the Conn is closed afterwards.
func Inside(ns *netns.NS, open func() (*Conn, error), fn func(*Conn) error) error {
	return InsideOn(nil, ns, open, fn)
}

// InsideOn is Inside on a thread the caller holds (netns.Thread); on a nil
// t it is Inside.
func InsideOn(t *netns.Thread, ns *netns.NS, open func() (*Conn, error), fn func(*Conn) error) error {
	return t.Do(ns, func() error {
		c, err := open()
		if err != nil {
			return err
		}
		defer c.Close()
		return fn(c)
	})
}

// IsInterrupted reports whether err means that every retry of a dump was
// interrupted by concurrent changes.
func IsInterrupted(err error) bool { return errors.Is(err, ErrDumpInterrupted) }

// ErrDumpInterrupted is returned when every retry of a dump was interrupted.
var ErrDumpInterrupted = errors.New("netlink dump interrupted repeatedly by concurrent changes")

// Conn is a route-netlink connection bound to one network namespace.
//
// It holds a raw socket, on which the hot-path writes (lo, veth creation,
// link flags) are sent as single requests, and, unless opened with
// OpenLite, a vishvananda/netlink handle for dumps, addresses and routes.
// (The handle's own veth creation looks the new link up by name afterwards:
// a round trip per veth that nsfleet does not need.)
type Conn struct {
	raw *sock
	h   *netlink.Handle
}

// ErrLite is returned by calls that need the full Conn on one from OpenLite.
var ErrLite = errors.New("rtnl: call needs a Conn from Open, not OpenLite")

// Open opens a Conn in the calling thread's network namespace.
func Open() (*Conn, error) {
	c, err := OpenLite()
	if err != nil {
		return nil, err
	}
	if c.h, err = pool.RetryValue(func() (*netlink.Handle, error) { return netlink.NewHandle(unix.NETLINK_ROUTE) }); err != nil {
		c.Close()
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	return c, nil
}

// OpenLite opens a Conn that can do link operations (lookups, dumps,
// SetLoopback, AddVeth, SetUp, SetAlias, SetMTU, DeleteLink, NsID) but not
// addresses or routes. It costs one socket.
func OpenLite() (*Conn, error) {
	s, err := openSock()
	if err != nil {
		return nil, err
	}
	return &Conn{raw: s}, nil
}

// Close closes the sockets.
func (c *Conn) Close() {
	if c == nil {
		return
	}
	if c.h != nil {
		c.h.Close()
		c.h = nil
	}
	c.raw.close()
	c.raw = nil
}

func (c *Conn) request(typ, flags int) *nl.NetlinkRequest {
	return &nl.NetlinkRequest{
		NlMsghdr: unix.NlMsghdr{Len: unix.SizeofNlMsghdr, Type: uint16(typ), Flags: unix.NLM_F_REQUEST | uint16(flags)},
	}
}

func (c *Conn) full() error {
	if c.h == nil {
		return ErrLite
	}
	return nil
}

// setLink sends one RTM_NEWLINK for an existing link: flags under mask, and
// the given attributes.
func (c *Conn) setLink(index int, flags, mask uint32, attrs ...*nl.RtAttr) error {
	req := c.request(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	msg.Flags, msg.Change = flags, mask
	req.AddData(msg)
	for _, a := range attrs {
		req.AddData(a)
	}
	return c.raw.exec(req, 0, nil)
}

// SetLoopback sets lo up or down and its alias in one request.
func (c *Conn) SetLoopback(up bool, alias string) error {
	var flags uint32
	if up {
		flags = unix.IFF_UP
	}
	if err := c.setLink(LoopbackIndex, flags, unix.IFF_UP, nl.NewRtAttr(unix.IFLA_IFALIAS, []byte(alias))); err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	return nil
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
	// seen from here (-1: same namespace, or one without an id, or not
	// asked: Survey never asks, see there).
	PeerIndex int
	PeerNsID  int
	// PeerElsewhere: the peer is in another namespace (IFLA_LINK_NETNSID is
	// present), even when that namespace has no id any more: one being
	// freed has lost its id before its devices are gone.
	PeerElsewhere bool
	Master        int // ifindex of the bridge or bond it is enslaved to, or 0
	// Vxlan, for a VXLAN device: what it tunnels as (nil otherwise).
	Vxlan *VxlanInfo
}

// Links dumps every link (statistics left out). Works on a lite Conn.
func (c *Conn) Links() ([]Link, error) {
	ls, err := c.getLinks(0, "", -1)
	if err != nil {
		return nil, fmt.Errorf("dump links: %w", err)
	}
	return ls, nil
}

// LinkByName looks one link up. Works on a lite Conn.
func (c *Conn) LinkByName(name string) (Link, error) {
	return c.oneLink(0, name, -1)
}

// LinkByIndex looks one link up by ifindex. Works on a lite Conn.
func (c *Conn) LinkByIndex(index int) (Link, error) {
	return c.oneLink(index, "", -1)
}

func (c *Conn) oneLink(index int, name string, nsid int) (Link, error) {
	what := name
	if what == "" {
		what = fmt.Sprint(index)
	}
	if nsid >= 0 {
		what += fmt.Sprintf(" in nsid %d", nsid)
	}
	ls, err := c.getLinks(index, name, nsid)
	if err != nil {
		return Link{}, fmt.Errorf("link %s: %w", what, err)
	}
	if len(ls) != 1 {
		return Link{}, fmt.Errorf("link %s: %d replies", what, len(ls))
	}
	return ls[0], nil
}

// LinkInNamespace looks up a link of another namespace, named by the id
// this namespace uses for it (see NsID), without entering it
// (IFLA_TARGET_NETNSID, Linux 4.20). Works on a lite Conn.
func (c *Conn) LinkInNamespace(nsid, index int) (Link, error) {
	return c.oneLink(index, "", nsid)
}

func byIndex(i int) netlink.Link { return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: i}} }

// SetUp sets the link up or down.
func (c *Conn) SetUp(index int, up bool) error {
	var flags uint32
	if up {
		flags = unix.IFF_UP
	}
	if err := c.setLink(index, flags, unix.IFF_UP); err != nil {
		return fmt.Errorf("link %d set %s: %w", index, map[bool]string{true: "up", false: "down"}[up], err)
	}
	return nil
}

// SetAlias sets the link's alias (ifalias; `ip link show` prints it).
func (c *Conn) SetAlias(index int, alias string) error {
	if err := c.setLink(index, 0, 0, nl.NewRtAttr(unix.IFLA_IFALIAS, []byte(alias))); err != nil {
		return fmt.Errorf("link %d set alias: %w", index, err)
	}
	return nil
}

// SetMTU sets the link's MTU.
func (c *Conn) SetMTU(index, mtu int) error {
	if err := c.setLink(index, 0, 0, nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(mtu)))); err != nil {
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
	// Queues is the number of TX and RX queues of each end; 0 means 1, and
	// -1 leaves it to the kernel (what `ip link add` does).
	// The kernel's default is one per possible CPU, and veth then cuts the
	// real count back to 1 on each end, which costs an expedited RCU grace
	// period (synchronize_net) per end, under rtnl_lock: creating the pair
	// with the queue count it will use anyway avoids both.
	Queues int
}

func (v VethPair) queues() int {
	if v.Queues <= 0 {
		return 1
	}
	return v.Queues
}

// AddVeth creates the pair in one request; the kernel makes both ends or
// neither. nsfleet always gives names (kernel-chosen names cost O(N)); an
// empty name, and PeerNsFd -1 (peer in this namespace), exist for the veth
// benchmark, which measures exactly those costs.
func (c *Conn) AddVeth(v VethPair) error {
	req := c.request(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	if v.Host != "" {
		req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(v.Host)))
	}
	if v.MTU > 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(v.MTU))))
	}
	q := nl.Uint32Attr(uint32(v.queues()))
	if v.Queues >= 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_NUM_TX_QUEUES, q))
		req.AddData(nl.NewRtAttr(unix.IFLA_NUM_RX_QUEUES, q))
	}
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("veth"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	peer := data.AddRtAttr(nl.VETH_INFO_PEER, nil)
	nl.NewIfInfomsgChild(peer, unix.AF_UNSPEC)
	if v.Peer != "" {
		peer.AddRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(v.Peer))
	}
	if v.MTU > 0 {
		peer.AddRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(v.MTU)))
	}
	if v.Queues >= 0 {
		peer.AddRtAttr(unix.IFLA_NUM_TX_QUEUES, q)
		peer.AddRtAttr(unix.IFLA_NUM_RX_QUEUES, q)
	}
	if v.PeerNsFd >= 0 {
		peer.AddRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(v.PeerNsFd)))
	}
	req.AddData(info)
	if err := c.raw.exec(req, 0, nil); err != nil {
		return fmt.Errorf("veth %s/%s: %w", v.Host, v.Peer, err)
	}
	return nil
}

// MoveLink moves a link into the namespace open as nsFd.
func (c *Conn) MoveLink(index, nsFd int) error {
	if err := c.setLink(index, 0, 0, nl.NewRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(nsFd)))); err != nil {
		return fmt.Errorf("move link %d: %w", index, err)
	}
	return nil
}

// DeleteLink deletes a link (and, for a veth, its peer).
func (c *Conn) DeleteLink(index int) error {
	req := c.request(unix.RTM_DELLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	if err := c.raw.exec(req, 0, nil); err != nil {
		return fmt.Errorf("delete link %d: %w", index, err)
	}
	return nil
}

// NsID returns the id this namespace uses for the namespace open as fd, or
// -1 when it has none assigned. The kernel finds it by scanning every id this
// namespace has assigned (peernet2id): on the host of a large fleet that is
// linear in the fleet, so ask from inside a namespace, which knows few.
// Works on a lite Conn (one RTM_GETNSID on the raw socket).
func (c *Conn) NsID(fd int) (int, error) {
	id, found := -1, false
	if err := c.raw.run(c.nsidCall(fd, &id, &found)); err != nil {
		return -1, fmt.Errorf("get nsid: %w", err)
	}
	if !found {
		return -1, errors.New("get nsid: no id in the reply")
	}
	return id, nil
}

// nsidCall is the RTM_GETNSID request for the namespace open as fd.
func (c *Conn) nsidCall(fd int, id *int, found *bool) call {
	req := c.request(unix.RTM_GETNSID, 0)
	req.AddData(nl.NewRtGenMsg())
	req.AddData(nl.NewRtAttr(unix.NETNSA_FD, nl.Uint32Attr(uint32(fd))))
	return call{req: req, resType: unix.RTM_NEWNSID, f: func(m []byte) error {
		if len(m) < 4 {
			return errShort
		}
		return walkAttrs(m[4:], func(a attr) { // after struct rtgenmsg, aligned
			if a.typ == unix.NETNSA_NSID && len(a.val) >= 4 {
				*id, *found = int(int32(nl.NativeEndian().Uint32(a.val))), true
			}
		})
	}}
}

// AddDevice creates a link of a kind that needs no parameters (dummy,
// the veth scenario's control); an empty name lets the kernel choose.
func (c *Conn) AddDevice(kind, name string) error {
	return c.addDevice(kind, name, 0)
}

// AddBridge creates a bridge (with the kernel's defaults: no STP, so a
// port forwards as soon as it is up) and, if mtu > 0, that MTU.
func (c *Conn) AddBridge(name string, mtu int) error {
	return c.addDevice("bridge", name, mtu)
}

// SetMaster enslaves the link to the bridge (or bond) master; master 0
// frees it.
func (c *Conn) SetMaster(index, master int) error {
	if err := c.setLink(index, 0, 0, nl.NewRtAttr(unix.IFLA_MASTER, nl.Uint32Attr(uint32(master)))); err != nil {
		return fmt.Errorf("link %d set master %d: %w", index, master, err)
	}
	return nil
}

func (c *Conn) addDevice(kind, name string, mtu int) error {
	req := c.request(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	if name != "" {
		req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	}
	if mtu > 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(mtu))))
	}
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated(kind))
	req.AddData(info)
	if err := c.raw.exec(req, 0, nil); err != nil {
		return fmt.Errorf("%s %s: %w", kind, name, err)
	}
	return nil
}

// Netconf returns the netconf values (attribute → value) of one family's
// configuration in this namespace: index is a device's ifindex, or -1 for
// "all" and -2 for "default" (see sysctl.Netconf). One RTM_GETNETCONF on
// the raw socket; works on a lite Conn.
func (c *Conn) Netconf(family int, index int32) (map[uint16]int32, error) {
	var out map[uint16]int32
	if err := c.raw.run(c.netconfCall(NetconfKey{family, index}, &out)); err != nil {
		return nil, fmt.Errorf("netconf: %w", err)
	}
	if out == nil {
		return nil, errors.New("netconf: no reply")
	}
	return out, nil
}

// NetconfKey names one netconf configuration: a family's, and a device's
// index or -1 (all) or -2 (default).
type NetconfKey struct {
	Family int
	Index  int32
}

// netconfCall is the RTM_GETNETCONF request for one configuration.
func (c *Conn) netconfCall(k NetconfKey, out *map[uint16]int32) call {
	req := c.request(unix.RTM_GETNETCONF, 0)
	req.AddData(&nl.RtGenMsg{RtGenmsg: unix.RtGenmsg{Family: uint8(k.Family)}})
	req.AddData(nl.NewRtAttr(netconfaIfindex, nl.Uint32Attr(uint32(k.Index))))
	return call{req: req, resType: unix.RTM_NEWNETCONF, f: func(m []byte) error {
		var err error
		*out, err = parseNetconf(m)
		return err
	}}
}

// Reading is what Survey gathers about a namespace.
type Reading struct {
	Links []Link
	// Netconf holds the configurations asked for that the kernel
	// answered; one it refused (IPv6 disabled, an old kernel) is absent.
	Netconf map[NetconfKey]map[uint16]int32
}

const netconfaIfindex = 1
