package rtnl

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/vishvananda/netlink/nl"
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
// Survey reads the same facts by ways that name no namespace: the dump of
// every device's IPv4 configuration for their indexes (every link with
// IPv4, that is every link whose MTU is at least 68), an ioctl each for
// their names, ethtool's driver information for which are veths, a veth's
// own statistics for its peer's index (veth reports it as its first
// counter, peer_ifindex), two ioctls for its state and MTU, and rtnetlink
// for the rest (lo, and devices that are not veths). A veth's peer index
// says nothing of the namespace the peer is in: a caller pairs it from the
// other side (Devices.IfLink), where a veth's iflink is the index of its
// own peer.
//
// The index dump rides in the round trip that asks for lo and the netconf
// configurations, where ethtool's netlink dump (rtnl.LinkTable) would cost
// a socket of its own per namespace: at 20,000 routers that socket and
// dump were a fifth of `ls`'s CPU time.

// Survey reads the links of c's namespace and the netconf configurations
// confs, without giving the namespace an id for any other (see above).
// Links are by index; a veth's PeerIndex is its peer's index in a
// namespace Survey does not know (PeerNsID -1, PeerElsewhere false). A
// link without IPv4 (MTU under 68: a CAN device, say) is not seen. Works
// on a lite Conn.
func (c *Conn) Survey(confs []NetconfKey) (Reading, error) {
	var r Reading
	err := retryDump(func() error {
		var err error
		r, err = c.survey(confs)
		return err
	})
	if errors.Is(err, ErrDumpInterrupted) {
		return Reading{}, fmt.Errorf("survey: %w", err)
	}
	return r, err
}

func (c *Conn) survey(confs []NetconfKey) (Reading, error) {
	var r Reading
	// One round trip: lo, the IPv4 configurations of every device (and of
	// "all" and "default"), and the other families' configurations asked.
	var lo []Link
	var indexes, want4 []int32
	var others []NetconfKey
	for _, k := range confs {
		if k.Family == unix.AF_INET {
			want4 = append(want4, k.Index)
		} else {
			others = append(others, k)
		}
	}
	v4 := make(map[int32]map[uint16]int32, len(want4))
	calls := []call{c.linksCall(LoopbackIndex, "", -1, &lo), c.netconfDump(unix.AF_INET, want4, &indexes, v4)}
	vals := make([]map[uint16]int32, len(others))
	for i, k := range others {
		calls = append(calls, c.netconfCall(k, &vals[i]))
	}
	if err := c.raw.batch(calls); err != nil {
		return Reading{}, fmt.Errorf("survey: %w", err)
	}
	if err := calls[0].result(); err != nil {
		return Reading{}, fmt.Errorf("survey: lo: %w", err)
	}
	if err := calls[1].result(); err != nil {
		if errors.Is(err, nl.ErrDumpInterrupted) {
			return Reading{}, err // retried
		}
		return Reading{}, fmt.Errorf("survey: dump netconf: %w", err)
	}
	for _, k := range confs {
		var v map[uint16]int32
		if k.Family == unix.AF_INET {
			v = v4[k.Index]
		} else if i := slices.Index(others, k); calls[2+i].err == nil {
			v = vals[i]
		}
		if v != nil {
			if r.Netconf == nil {
				r.Netconf = make(map[NetconfKey]map[uint16]int32, len(confs))
			}
			r.Netconf[k] = v
		}
	}
	r.Links = append(make([]Link, 0, len(indexes)), lo...)
	var asked []int
	fd := c.raw.fd // any socket answers the device ioctls of its namespace
	for _, index := range indexes {
		if index <= 0 || index == LoopbackIndex {
			continue // "all", "default", lo
		}
		name, ok, err := nameOf(fd, int(index))
		if err != nil {
			return Reading{}, fmt.Errorf("survey: link %d: %w", index, err)
		}
		if !ok {
			continue // gone since the dump
		}
		l, veth, ok, err := vethByIoctl(fd, name)
		switch {
		case err != nil:
			return Reading{}, fmt.Errorf("survey: link %s: %w", name, err)
		case !ok:
		case veth:
			l.Index = int(index)
			r.Links = append(r.Links, l)
		default:
			asked = append(asked, int(index))
		}
	}
	if len(asked) > 0 {
		got := make([][]Link, len(asked))
		calls = calls[:0]
		for i, index := range asked {
			calls = append(calls, c.linksCall(index, "", -1, &got[i]))
		}
		if err := c.raw.batch(calls); err != nil {
			return Reading{}, fmt.Errorf("survey: %w", err)
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
	}
	slices.SortFunc(r.Links, func(a, b Link) int { return cmp.Compare(a.Index, b.Index) })
	return r, nil
}

// netconfDump is the RTM_GETNETCONF dump of one family's configurations:
// the index of each (-1 "all", -2 "default", or a device's) goes to
// *indexes, and the values of those in want to vals (the others are not
// decoded: a fleet's reads dump five per namespace and want one).
func (c *Conn) netconfDump(family int, want []int32, indexes *[]int32, vals map[int32]map[uint16]int32) call {
	req := c.request(unix.RTM_GETNETCONF, unix.NLM_F_DUMP)
	req.AddData(&nl.RtGenMsg{RtGenmsg: unix.RtGenmsg{Family: uint8(family)}})
	return call{req: req, resType: unix.RTM_NEWNETCONF, f: func(m []byte) error {
		index, found, err := netconfIndex(m)
		if err != nil || !found {
			return err
		}
		*indexes = append(*indexes, index)
		if slices.Contains(want, index) {
			v, err := parseNetconf(m)
			if err != nil {
				return err
			}
			vals[index] = v
		}
		return nil
	}}
}

// netconfIndex finds whose configuration an RTM_NEWNETCONF payload is,
// without decoding the rest. It never panics on malformed input.
func netconfIndex(b []byte) (index int32, found bool, err error) {
	const hdr = 4 // struct netconfmsg, aligned
	if len(b) < hdr {
		return 0, false, fmt.Errorf("netconf message: %w", errShort)
	}
	err = walkAttrs(b[hdr:], func(a attr) {
		if a.typ == netconfaIfindex && len(a.val) >= 4 {
			index, found = int32(binary.NativeEndian.Uint32(a.val)), true
		}
	})
	if err != nil {
		return 0, false, fmt.Errorf("netconf: %w", err)
	}
	return index, found, nil
}

// nameOf asks fd's namespace for the name of the link of that index.
func nameOf(fd, index int) (string, bool, error) {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return "", false, err
	}
	ifr.SetUint32(uint32(index))
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFNAME, ifr); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return "", false, nil
		}
		return "", false, err
	}
	return ifr.Name(), true, nil
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
	if ok, err := stateByIoctl(fd, &l); err != nil || !ok {
		return Link{}, false, false, err
	}
	return l, true, true, nil
}

// vethPeer reads the veth called name's peer index: the first of its
// nStats statistics (0 while it has no peer).
func vethPeer(fd int, name string, nStats uint32) (int, bool, error) {
	room, ok, err := statsRoom(fd, name, nStats)
	if err != nil || !ok {
		return 0, ok, err
	}
	if err := checkVethStats(fd, name, room); err != nil {
		return 0, false, err
	}
	// struct ethtool_stats: cmd, n_stats, then the counters.
	buf := make([]uint64, 1+room)
	*(*uint32)(unsafe.Pointer(&buf[0])) = unix.ETHTOOL_GSTATS
	err = ethtoolIoctl(fd, name, unsafe.Pointer(&buf[0]))
	if errors.Is(err, unix.ENODEV) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("statistics: %w", err)
	}
	if n := *(*uint32)(unsafe.Add(unsafe.Pointer(&buf[0]), 4)); n == 0 || n > room {
		return 0, false, fmt.Errorf("statistics: %d counters, room for %d", n, room)
	}
	return int(buf[1]), true, nil
}

// statsRoom is how many counters the veth called name can report, now that
// it reports nStats: the kernel writes as many as the device has when it
// is asked, whatever the buffer (ETHTOOL_GSTATS and GSTRINGS take no
// length), and a veth's count grows with its queues in use, which may
// change between two ioctls up to the most it was made with (ethtool -L).
// The count is scaled to that most; nsfleet's veths have one queue each,
// so theirs is what they report.
func statsRoom(fd int, name string, nStats uint32) (uint32, bool, error) {
	// struct ethtool_channels: cmd, max_rx, max_tx, max_other,
	// max_combined, rx_count, tx_count, other_count, combined_count.
	var ch [9]uint32
	ch[0] = unix.ETHTOOL_GCHANNELS
	switch err := ethtoolIoctl(fd, name, unsafe.Pointer(&ch[0])); {
	case errors.Is(err, unix.ENODEV):
		return 0, false, nil
	case errors.Is(err, unix.EOPNOTSUPP):
		// A veth without channels (before Linux 4.19) cannot change them.
		return max(nStats, 1), true, nil
	case err != nil:
		return 0, false, fmt.Errorf("channels: %w", err)
	}
	scale := uint32(1)
	for _, q := range [][2]uint32{{ch[1], ch[5]}, {ch[2], ch[6]}} { // rx, tx: most, in use
		if q[1] > 0 {
			scale = max(scale, (q[0]+q[1]-1)/q[1])
		} else if q[0] > 0 {
			scale = max(scale, q[0])
		}
	}
	if uint64(max(nStats, 1))*uint64(scale) > 1<<20 {
		return 0, false, fmt.Errorf("statistics: %d counters at up to %dx as many queues", nStats, scale)
	}
	return max(nStats, 1) * scale, true, nil
}

// vethStats remembers whether this kernel's veths report their peer's index
// as their first statistic (they have since Linux 3.12; checked once, by
// name, so that a kernel that moved it fails loudly instead of pairing
// links by another counter).
var vethStats struct {
	sync.Mutex
	checked atomic.Bool
}

const (
	ethSSStats    = 1  // ETH_SS_STATS
	ethGStringLen = 32 // ETH_GSTRING_LEN
)

// checkVethStats takes room, not the count the driver information gave:
// see statsRoom.
func checkVethStats(fd int, name string, room uint32) error {
	if vethStats.checked.Load() {
		return nil
	}
	vethStats.Lock()
	defer vethStats.Unlock()
	if vethStats.checked.Load() {
		return nil
	}
	// struct ethtool_gstrings: cmd, string_set, len, then the names.
	buf := make([]byte, 12+int(room)*ethGStringLen)
	ne := binary.NativeEndian
	ne.PutUint32(buf[0:], unix.ETHTOOL_GSTRINGS)
	ne.PutUint32(buf[4:], ethSSStats)
	if err := ethtoolIoctl(fd, name, unsafe.Pointer(&buf[0])); err != nil {
		return fmt.Errorf("statistics names: %w", err)
	}
	if n := ne.Uint32(buf[8:]); n == 0 || n > room {
		return fmt.Errorf("statistics names: %d, room for %d", n, room)
	}
	if first := buf[12 : 12+ethGStringLen]; cstring(first) != "peer_ifindex" {
		return fmt.Errorf("statistics: veth's first counter is %q, not peer_ifindex", bytes.TrimRight(first, "\x00"))
	}
	vethStats.checked.Store(true)
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

// Index returns the index of c's namespace's link called name, and false
// if there is none: one ioctl, which, unlike LinkByName, neither gives the
// namespace an id for a veth's peer's nor, on the host, scans the host's
// ids for it.
func (c *Conn) Index(name string) (int, bool, error) {
	return indexByIoctl(c.raw.fd, name)
}
