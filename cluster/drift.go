package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// driftWatch reports namespaces that may have drifted, from two sources
// that cost nothing while nothing happens:
//
//   - the run dir (inotify): a pin removed or replaced;
//   - one rtnetlink socket in the host namespace with
//     NETLINK_LISTEN_ALL_NSID: link, address, route and netconf (sysctl
//     forwarding) events of the host and of every namespace that has an id
//     here, which a namespace with a veth to the host always has. Host
//     events name the namespace through the host veth's name; the others
//     through their namespace id, learned from host veths' link-netnsid.
//
// Other sysctls send no event; the periodic full resync repairs them.
type driftWatch struct {
	mu      sync.Mutex
	byHost  map[string]string // host veth name -> namespace
	byNsid  map[int32]string  // namespace id in the host -> namespace
	pending map[string]bool
	unknown bool // an event from a namespace not mapped yet: check all
	notify  chan struct{}
	fds     []int
}

const (
	rtnlgrpIPv4Netconf = 24
	rtnlgrpIPv6Netconf = 25
)

func newDriftWatch(runDir string) (*driftWatch, error) {
	d := &driftWatch{byHost: map[string]string{}, byNsid: map[int32]string{}, pending: map[string]bool{}, notify: make(chan struct{}, 1)}
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(in, runDir, unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO|unix.IN_CREATE); err != nil {
		unix.Close(in)
		return nil, fmt.Errorf("inotify %s: %w", runDir, err)
	}
	nl, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		unix.Close(in)
		return nil, fmt.Errorf("netlink: %w", err)
	}
	d.fds = []int{in, nl}
	groups := uint32(unix.RTMGRP_LINK | unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR | unix.RTMGRP_IPV4_ROUTE | unix.RTMGRP_IPV6_ROUTE)
	if err := unix.Bind(nl, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: groups}); err != nil {
		d.close()
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	for _, g := range []int{rtnlgrpIPv4Netconf, rtnlgrpIPv6Netconf} {
		unix.SetsockoptInt(nl, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, g)
	}
	if err := unix.SetsockoptInt(nl, unix.SOL_NETLINK, unix.NETLINK_LISTEN_ALL_NSID, 1); err != nil {
		d.close()
		return nil, fmt.Errorf("netlink listen-all-nsid: %w", err)
	}
	// A burst (a fleet created) must not overflow the queue; if it does,
	// ENOBUFS says so and everything is checked.
	unix.SetsockoptInt(nl, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	return d, nil
}

func (d *driftWatch) close() {
	for _, fd := range d.fds {
		unix.Close(fd)
	}
	d.fds = nil
}

// learn maps a namespace's host veth names and namespace id.
func (d *driftWatch) learn(ns string, hostVeths []string, nsid int32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, h := range hostVeths {
		d.byHost[h] = ns
	}
	if nsid >= 0 {
		d.byNsid[nsid] = ns
	}
}

func (d *driftWatch) mark(ns string) {
	d.mu.Lock()
	d.pending[ns] = true
	d.mu.Unlock()
	select {
	case d.notify <- struct{}{}:
	default:
	}
}

func (d *driftWatch) markAll() {
	d.mu.Lock()
	d.unknown = true
	d.mu.Unlock()
	select {
	case d.notify <- struct{}{}:
	default:
	}
}

// take returns the namespaces marked since the last call, and whether
// everything must be checked.
func (d *driftWatch) take() (map[string]bool, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, all := d.pending, d.unknown
	d.pending, d.unknown = map[string]bool{}, false
	return p, all
}

// run reads both sources until ctx ends.
func (d *driftWatch) run(ctx context.Context) {
	in, nl := d.fds[0], d.fds[1]
	buf := make([]byte, 1<<16)
	oob := make([]byte, 64)
	fds := []unix.PollFd{{Fd: int32(in), Events: unix.POLLIN}, {Fd: int32(nl), Events: unix.POLLIN}}
	for ctx.Err() == nil {
		n, err := unix.Poll(fds, 250)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		if n <= 0 {
			continue
		}
		if fds[0].Revents&unix.POLLIN != 0 {
			if m, err := unix.Read(in, buf); err == nil {
				d.inotifyEvents(buf[:m])
			}
		}
		if fds[1].Revents&unix.POLLIN != 0 {
			for {
				m, oobn, _, _, err := unix.Recvmsg(nl, buf, oob, unix.MSG_DONTWAIT)
				if errors.Is(err, unix.ENOBUFS) {
					d.markAll()
					continue
				}
				if err != nil {
					break
				}
				d.netlinkEvents(buf[:m], nsidOf(oob[:oobn]))
			}
		}
	}
}

func (d *driftWatch) inotifyEvents(b []byte) {
	for len(b) >= unix.SizeofInotifyEvent {
		nameLen := int(binary.NativeEndian.Uint32(b[12:16]))
		end := unix.SizeofInotifyEvent + nameLen
		if end > len(b) {
			return
		}
		name := string(b[unix.SizeofInotifyEvent:end])
		for i := 0; i < len(name); i++ {
			if name[i] == 0 {
				name = name[:i]
				break
			}
		}
		if name != "" && filepath.Base(name) == name {
			d.mark(name)
		}
		b = b[end:]
	}
}

// nsidOf returns the namespace id carried in a NETLINK_LISTEN_ALL_NSID
// control message; -1 for the socket's own namespace.
func nsidOf(oob []byte) int32 {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return -1
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_NETLINK && m.Header.Type == unix.NETLINK_LISTEN_ALL_NSID && len(m.Data) >= 4 {
			return int32(binary.NativeEndian.Uint32(m.Data))
		}
	}
	return -1
}

func (d *driftWatch) netlinkEvents(b []byte, nsid int32) {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return
	}
	for _, m := range msgs {
		if nsid >= 0 {
			d.mu.Lock()
			ns, ok := d.byNsid[nsid]
			d.mu.Unlock()
			if ok {
				d.mark(ns)
			}
			// An unmapped id is a namespace created since the last
			// learn (ours, being made) or someone else's: not drift.
			continue
		}
		// The host's own: a link event names the host veth.
		if m.Header.Type != unix.RTM_NEWLINK && m.Header.Type != unix.RTM_DELLINK {
			continue
		}
		name, peerNsid := linkNameAndNsid(m.Data)
		d.mu.Lock()
		ns, ok := d.byHost[name]
		if ok && peerNsid >= 0 {
			d.byNsid[peerNsid] = ns
		}
		d.mu.Unlock()
		if ok {
			d.mark(ns)
		}
	}
}

// linkNameAndNsid reads IFLA_IFNAME and IFLA_LINK_NETNSID of a link message.
func linkNameAndNsid(b []byte) (string, int32) {
	if len(b) < unix.SizeofIfInfomsg {
		return "", -1
	}
	b = b[unix.SizeofIfInfomsg:]
	name, nsid := "", int32(-1)
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		t := binary.NativeEndian.Uint16(b[2:4])
		if l < unix.SizeofRtAttr || l > len(b) {
			break
		}
		v := b[unix.SizeofRtAttr:l]
		switch t {
		case unix.IFLA_IFNAME:
			for i, c := range v {
				if c == 0 {
					v = v[:i]
					break
				}
			}
			name = string(v)
		case unix.IFLA_LINK_NETNSID:
			if len(v) >= 4 {
				nsid = int32(binary.NativeEndian.Uint32(v))
			}
		}
		al := (l + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1)
		if al > len(b) {
			break
		}
		b = b[al:]
	}
	return name, nsid
}
