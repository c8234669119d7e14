package rtnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// Listener hears rtnetlink's change notifications (links, addresses,
// routes, IPv4 and IPv6 netconf) of the namespace it was opened in and, with
// NETLINK_LISTEN_ALL_NSID, of every namespace that has an id there: each
// one with a veth to this namespace has one. It is how nsfleet's agent
// learns of drift without polling.
type Listener struct {
	fd       int
	buf, oob []byte
}

// listenGroups are the notification groups a Listener joins.
var listenGroups = []int{
	unix.RTNLGRP_LINK,
	unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR,
	unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE,
	unix.RTNLGRP_IPV4_NETCONF, unix.RTNLGRP_IPV6_NETCONF,
}

// Listen opens a Listener in the calling thread's namespace. It hears
// only what can be drift (driftFilter); a caller about to make many
// namespaces pauses it (Pause), which the filter cannot replace.
func Listen() (*Listener, error) { return listen(true) }

// ListenUnfiltered opens a Listener that hears every notification of its
// groups, as the agent's did before the drift filter: the lab's baseline.
func ListenUnfiltered() (*Listener, error) { return listen(false) }

func listen(filtered bool) (*Listener, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	l := &Listener{fd: fd, buf: make([]byte, 1<<16), oob: make([]byte, 64)}
	// Before joining: no unfiltered notification is ever queued.
	if filtered {
		if err := attachFilter(fd, driftFilter()); err != nil {
			l.Close()
			return nil, err
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		l.Close()
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_LISTEN_ALL_NSID, 1); err != nil {
		l.Close()
		return nil, fmt.Errorf("netlink listen-all-nsid: %w", err)
	}
	// A burst (a fleet created) must not overflow the queue; if it does,
	// Read says so and the caller checks everything.
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	if err := l.Resume(); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Pause leaves the notification groups: the kernel no longer looks at this
// socket for any notification. While one listens to every namespace id,
// each notification of another namespace costs a walk over all of the ids
// (peernet2id, before any filter runs: docs/PERFORMANCE.md), so a fleet of
// N made beside a listener costs O(N²); a caller that makes many
// namespaces pauses, and afterwards checks everything itself, since what
// happened meanwhile was not heard. Notifications queued before stay.
func (l *Listener) Pause() error { return l.membership(unix.NETLINK_DROP_MEMBERSHIP) }

// Resume joins the groups again (Listen has joined them).
func (l *Listener) Resume() error { return l.membership(unix.NETLINK_ADD_MEMBERSHIP) }

func (l *Listener) membership(op int) error {
	for _, g := range listenGroups {
		if err := unix.SetsockoptInt(l.fd, unix.SOL_NETLINK, op, g); err != nil {
			return fmt.Errorf("netlink group %d: %w", g, err)
		}
	}
	return nil
}

// Fd is the socket, to poll for readability.
func (l *Listener) Fd() int { return l.fd }

// Close closes the socket.
func (l *Listener) Close() error { return unix.Close(l.fd) }

// Event is one notification.
type Event struct {
	NsID int32  // the namespace's id here; -1 for this namespace
	Type uint16 // RTM_NEWLINK, RTM_DELADDR, ...
	// For link messages: the link's name, and the id here of the
	// namespace its peer is in (-1 when none is given).
	LinkName string
	PeerNsID int32
}

// Read calls fn with every notification queued, without blocking. It
// reports overrun when the kernel dropped notifications (the queue was
// full): the caller must then assume that anything may have changed.
func (l *Listener) Read(fn func(Event)) (overrun bool) {
	for {
		n, oobn, _, _, err := unix.Recvmsg(l.fd, l.buf, l.oob, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.ENOBUFS) {
			overrun = true
			continue
		}
		if err != nil {
			return overrun
		}
		nsid := nsidOf(l.oob[:oobn])
		msgs, err := syscall.ParseNetlinkMessage(l.buf[:n])
		if err != nil {
			continue
		}
		for _, m := range msgs {
			ev := Event{NsID: nsid, Type: m.Header.Type, PeerNsID: -1}
			if m.Header.Type == unix.RTM_NEWLINK || m.Header.Type == unix.RTM_DELLINK {
				ev.LinkName, ev.PeerNsID = linkNameAndNsid(m.Data)
			}
			fn(ev)
		}
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

// linkNameAndNsid reads IFLA_IFNAME and IFLA_LINK_NETNSID of a link
// message, with the package's one attribute walker.
func linkNameAndNsid(b []byte) (string, int32) {
	if len(b) < unix.SizeofIfInfomsg {
		return "", -1
	}
	name, nsid := "", int32(-1)
	walkAttrs(b[unix.SizeofIfInfomsg:], func(a attr) {
		switch a.typ {
		case unix.IFLA_IFNAME:
			name = cstring(a.val)
		case unix.IFLA_LINK_NETNSID:
			if len(a.val) >= 4 {
				nsid = int32(binary.NativeEndian.Uint32(a.val))
			}
		}
	})
	return name, nsid
}
