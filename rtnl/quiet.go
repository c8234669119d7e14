package rtnl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reading a namespace without giving it namespace ids.
//
// rtnetlink describes a veth whose other end is in another namespace with
// the id the asking namespace has for that one, and makes one if it has
// none (rtnl_fill_link_netnsid → peernet2id_alloc). A fleet read that way
// leaves every router with an id for the host, and every id makes the
// kernel's teardown of any namespace dearer: freeing one looks it up among
// the ids of every namespace still alive (unhash_nsid), and an empty table
// is skipped where one of a single entry is walked. 40,000 routers took
// 70 s to free fresh from `up` and 191 s after one such read
// (docs/PERFORMANCE.md, "A fleet that was read costs the kernel more to
// free").
//
// Survey reads the same facts by ways that name no namespace: ethtool's
// netlink dump for the names and indexes, ethtool's driver information for
// which links are veths, a veth's own statistics for its peer's index
// (veth reports it as its first counter, peer_ifindex), two ioctls for its
// state and MTU, and rtnetlink for the rest (lo, and devices that are not
// veths). A veth's peer index then says nothing of the namespace the peer
// is in: a caller pairs it from the other side (Devices.IfLink), where a
// veth's iflink is the index of its own peer.

// Survey reads the links of c's namespace and the netconf configurations
// confs, without giving the namespace an id for any other (see above).
// Links are by index; a veth's PeerIndex is its peer's index in a
// namespace Survey does not know (PeerNsID -1, PeerElsewhere false).
// Where the kernel has no ethtool netlink (before 5.6) it falls back to
// Read, with the ids that costs. Works on a lite Conn; it opens one more
// socket (generic netlink), kept until Close.
func (c *Conn) Survey(confs []NetconfKey) (Reading, error) {
	if c.gen == nil {
		s, err := openSockProto(unix.NETLINK_GENERIC)
		if err != nil {
			return Reading{}, fmt.Errorf("survey: %w", err)
		}
		c.gen = s
	}
	table, err := readLinkTable(c.gen)
	if errors.Is(err, unix.ENOENT) { // no such generic netlink family
		return c.Read(-1, confs)
	}
	if err != nil {
		return Reading{}, fmt.Errorf("survey: %w", err)
	}
	r := Reading{NsID: -1, Links: make([]Link, 0, table.Len())}
	// Links rtnetlink describes: lo (the ownership marker is its alias)
	// and devices that are not veths. Their requests go in one batch with
	// the netconf ones.
	var asked []int
	var failed error
	fd := c.raw.fd // any socket answers the device ioctls of its namespace
	table.All(func(index int, name string) {
		if failed != nil {
			return
		}
		if index != LoopbackIndex {
			l, veth, ok, err := vethByIoctl(fd, name)
			switch {
			case err != nil:
				failed = fmt.Errorf("survey: link %s: %w", name, err)
				return
			case !ok:
				return // gone since the dump
			case veth:
				l.Index = index
				r.Links = append(r.Links, l)
				return
			}
		}
		asked = append(asked, index)
	})
	if failed != nil {
		return Reading{}, failed
	}
	got := make([][]Link, len(asked))
	calls := make([]call, 0, len(asked)+len(confs))
	for i, index := range asked {
		calls = append(calls, c.linksCall(index, "", -1, &got[i]))
	}
	vals := make([]map[uint16]int32, len(confs))
	for i, k := range confs {
		calls = append(calls, c.netconfCall(k, &vals[i]))
	}
	if len(calls) > 0 {
		if err := c.raw.batch(calls); err != nil {
			return Reading{}, fmt.Errorf("survey: %w", err)
		}
	}
	for i := range asked {
		if err := calls[i].result(); err != nil {
			if errors.Is(err, unix.ENODEV) {
				continue // gone since the dump
			}
			return Reading{}, fmt.Errorf("survey: link %d: %w", asked[i], err)
		}
		r.Links = append(r.Links, got[i]...)
	}
	sortLinks(r.Links)
	for i, k := range confs {
		if vals[i] != nil && calls[len(asked)+i].err == nil {
			if r.Netconf == nil {
				r.Netconf = make(map[NetconfKey]map[uint16]int32, len(confs))
			}
			r.Netconf[k] = vals[i]
		}
	}
	return r, nil
}

// sortLinks orders links by index (few: insertion sort).
func sortLinks(ls []Link) {
	for i := 1; i < len(ls); i++ {
		for j := i; j > 0 && ls[j].Index < ls[j-1].Index; j-- {
			ls[j], ls[j-1] = ls[j-1], ls[j]
		}
	}
}

// vethByIoctl asks about the link called name through fd's namespace: if
// it is a veth (veth true), its name, state, MTU and peer's index; ok
// false if there is no such link.
func vethByIoctl(fd int, name string) (l Link, veth, ok bool, err error) {
	var info unix.EthtoolDrvinfo
	info.Cmd = unix.ETHTOOL_GDRVINFO
	switch err := ethtoolIoctl(fd, name, unsafe.Pointer(&info)); {
	case errors.Is(err, unix.ENODEV):
		return Link{}, false, false, nil
	case errors.Is(err, unix.EOPNOTSUPP):
		return Link{}, false, true, nil // no driver information: not a veth
	case err != nil:
		return Link{}, false, false, fmt.Errorf("driver information: %w", err)
	}
	if cstring(info.Driver[:]) != "veth" {
		return Link{}, false, true, nil
	}
	l = Link{Name: name, Type: "veth", PeerNsID: -1}
	peer, ok, err := vethPeer(fd, name, info.N_stats)
	if err != nil || !ok {
		return Link{}, false, ok, err
	}
	l.PeerIndex = peer
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return Link{}, false, false, err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return Link{}, false, false, nil
		}
		return Link{}, false, false, fmt.Errorf("flags: %w", err)
	}
	l.Up = ifr.Uint16()&unix.IFF_UP != 0
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFMTU, ifr); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return Link{}, false, false, nil
		}
		return Link{}, false, false, fmt.Errorf("mtu: %w", err)
	}
	l.MTU = int(ifr.Uint32())
	return l, true, true, nil
}

// vethPeer reads the veth called name's peer index: the first of its
// nStats statistics (0 while it has no peer).
func vethPeer(fd int, name string, nStats uint32) (int, bool, error) {
	if err := checkVethStats(fd, name, nStats); err != nil {
		return 0, false, err
	}
	// struct ethtool_stats: cmd, n_stats, then the counters.
	buf := make([]uint64, 1+max(nStats, 1))
	*(*uint32)(unsafe.Pointer(&buf[0])) = unix.ETHTOOL_GSTATS
	err := ethtoolIoctl(fd, name, unsafe.Pointer(&buf[0]))
	if errors.Is(err, unix.ENODEV) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("statistics: %w", err)
	}
	if n := *(*uint32)(unsafe.Add(unsafe.Pointer(&buf[0]), 4)); n == 0 || n > nStats {
		// Its queues changed since the driver information: the counters
		// were not copied (the kernel refuses a buffer too short).
		return 0, false, fmt.Errorf("statistics: %d counters, %d expected", n, nStats)
	}
	return int(buf[1]), true, nil
}

// vethStats remembers whether this kernel's veths report their peer's index
// as their first statistic (they have since Linux 3.12; checked once, by
// name, so that a kernel that moved it fails loudly instead of pairing
// links by another counter).
var vethStats struct {
	sync.Mutex
	checked bool
}

const (
	ethSSStats    = 1  // ETH_SS_STATS
	ethGStringLen = 32 // ETH_GSTRING_LEN
)

func checkVethStats(fd int, name string, nStats uint32) error {
	vethStats.Lock()
	defer vethStats.Unlock()
	if vethStats.checked {
		return nil
	}
	if nStats == 0 {
		return errors.New("statistics: a veth without counters")
	}
	// struct ethtool_gstrings: cmd, string_set, len, then the names.
	buf := make([]byte, 12+int(nStats)*ethGStringLen)
	ne := binary.NativeEndian
	ne.PutUint32(buf[0:], unix.ETHTOOL_GSTRINGS)
	ne.PutUint32(buf[4:], ethSSStats)
	if err := ethtoolIoctl(fd, name, unsafe.Pointer(&buf[0])); err != nil {
		return fmt.Errorf("statistics names: %w", err)
	}
	if first := buf[12 : 12+ethGStringLen]; cstring(first) != "peer_ifindex" {
		return fmt.Errorf("statistics: veth's first counter is %q, not peer_ifindex", bytes.TrimRight(first, "\x00"))
	}
	vethStats.checked = true
	return nil
}

// ifreqData is struct ifreq with its union holding a pointer (ifr_data),
// as SIOCETHTOOL takes it.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24 - unsafe.Sizeof(uintptr(0))]byte
}

// ethtoolIoctl runs the ethtool command that data starts with on the link
// called name.
func ethtoolIoctl(fd int, name string, data unsafe.Pointer) error {
	if len(name) >= unix.IFNAMSIZ {
		return unix.ENODEV
	}
	ifr := ifreqData{data: data}
	copy(ifr.name[:], name)
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	if e != 0 {
		return e
	}
	return nil
}
