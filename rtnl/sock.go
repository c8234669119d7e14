package rtnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/nsfleet/nsfleet/internal/pool"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// sock is the raw route-netlink socket of a Conn: one blocking file
// descriptor, one request at a time. The requests are built with
// vishvananda/netlink's message types; sending and receiving are done here
// because its socket allocates a 64 KiB receive buffer and asks the kernel
// for the socket's address on every request, and registers the socket with
// Go's poller: on a fleet's hot path (a socket per namespace, three
// requests each) that was a third of `ls`'s own time and most of its
// garbage.
type sock struct {
	mu  sync.Mutex
	fd  int
	seq uint32
	ack bool // extended acknowledgements asked for
}

// recvBufSize holds any message the kernel sends: it caps a dump's
// messages at 32 KiB, and a single reply is smaller.
const recvBufSize = 64 << 10

var recvBufs = sync.Pool{New: func() any { b := make([]byte, recvBufSize); return &b }}

func openSock() (*sock, error) { return openSockProto(unix.NETLINK_ROUTE) }

// openSockProto opens a socket of another netlink protocol (generic
// netlink, for ethtool's).
func openSockProto(proto int) (*sock, error) {
	fd, err := pool.RetryValue(func() (int, error) {
		return unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	})
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	// No bind: the first send binds the socket to a port the kernel picks,
	// and replies are told apart by sequence number.
	return &sock{fd: fd}, nil
}

func (s *sock) close() {
	if s != nil && s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}

// call is one request of a batch, and what is done with its replies: f is
// called with the payload of every reply of type resType (any type when
// 0); err is the kernel's answer to it, intr whether a dump was
// interrupted by a change.
type call struct {
	req      *nl.NetlinkRequest
	resType  uint16
	f        func([]byte) error
	err      error
	intr     bool
	answered bool
}

// exec sends req and calls f with the payload of every reply of type
// resType (any type when 0) until the request is answered: the end of a
// dump, an acknowledgement, an error, or a single reply. It returns the
// kernel's error (an errno, with the kernel's message when it gave one),
// or nl.ErrDumpInterrupted when a dump was interrupted by a change.
func (s *sock) exec(req *nl.NetlinkRequest, resType uint16, f func([]byte) error) error {
	return s.run(call{req: req, resType: resType, f: f})
}

// run is exec for a call already made (nsidCall, linksCall, ...).
func (s *sock) run(c call) error {
	cs := [1]call{c}
	if err := s.batch(cs[:]); err != nil {
		return err
	}
	return cs[0].result()
}

// result is exec's answer for one call of a batch.
func (c *call) result() error {
	if c.err == nil && c.intr {
		return nl.ErrDumpInterrupted
	}
	return c.err
}

// batch sends the requests in one datagram and reads until each is
// answered (the kernel handles them one after the other; a failed one
// does not stop the rest). At most one may be a dump: the kernel refuses a
// second on a socket whose first is still being read. A dump's end comes
// after the replies to the requests behind it (the kernel finishes a dump
// as its replies are read). The error returned is the socket's (sending,
// receiving, a malformed reply); each call's own answer is in the call.
// One round trip instead of one per request: on a fleet's reads, each
// namespace asks three things.
func (s *sock) batch(calls []call) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []byte
	first := s.seq + 1
	for i := range calls {
		req := calls[i].req
		if !s.ack && req.Type&3 != 2 { // not an RTM_GET*: it may fail with a reason
			s.ack = true
			// The kernel's own words on an error ("Invalid MTU specified",
			// ...), with the request not echoed back; kernels without them
			// ignore this. Not asked for on sockets that only read (a
			// fleet's reads open one per namespace).
			_ = unix.SetsockoptInt(s.fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
			_ = unix.SetsockoptInt(s.fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
		}
		s.seq++
		req.Seq = s.seq
		if len(calls) == 1 {
			out = req.Serialize()
		} else {
			out = append(out, req.Serialize()...)
		}
	}
	// An address of its own per send: Sendto writes into it (its raw
	// form), so one shared by every socket is a data race.
	if err := unix.Sendto(s.fd, out, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	bp := recvBufs.Get().(*[]byte)
	defer recvBufs.Put(bp)
	buf := *bp
	w := walker{first: first, calls: calls, left: len(calls)}
	for w.left > 0 {
		n, _, err := unix.Recvfrom(s.fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if err := w.messages(buf[:n]); err != nil {
			return err
		}
	}
	return nil
}

// walker hands the replies of a batch to its calls: calls[i] was sent as
// request first+i; left of them are not answered yet.
type walker struct {
	first uint32
	calls []call
	left  int
}

func (w *walker) answer(c *call) {
	c.answered = true
	w.left--
}

// messages walks one datagram of replies.
func (w *walker) messages(b []byte) error {
	ne := binary.NativeEndian
	for len(b) >= unix.NLMSG_HDRLEN && w.left > 0 {
		l := int(ne.Uint32(b[0:4]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return fmt.Errorf("netlink: message of length %d in %d bytes", l, len(b))
		}
		typ, flags, seq := ne.Uint16(b[4:6]), ne.Uint16(b[6:8]), ne.Uint32(b[8:12])
		data := b[unix.NLMSG_HDRLEN:l]
		if next := (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1); next < len(b) {
			b = b[next:]
		} else {
			b = nil
		}
		d := seq - w.first // wraps to a huge number below first
		if d >= uint32(len(w.calls)) || w.calls[d].answered {
			continue // the late acknowledgement of an earlier request
		}
		c := &w.calls[d]
		if flags&unix.NLM_F_DUMP_INTR != 0 {
			c.intr = true
		}
		switch typ {
		case unix.NLMSG_DONE, unix.NLMSG_ERROR:
			if len(data) >= 4 {
				if errno := int32(ne.Uint32(data[0:4])); errno != 0 {
					c.err = kernelError(unix.Errno(-errno), flags, data[4:])
				}
			}
			w.answer(c)
			continue
		}
		if (c.resType == 0 || typ == c.resType) && c.err == nil && c.f != nil {
			c.err = c.f(data)
		}
		if flags&unix.NLM_F_MULTI == 0 {
			w.answer(c)
		}
	}
	return nil
}

// kernelError adds the kernel's extended acknowledgement message, when
// there is one, to errno.
func kernelError(errno unix.Errno, flags uint16, rest []byte) error {
	if flags&unix.NLM_F_ACK_TLVS == 0 || len(rest) < unix.NLMSG_HDRLEN {
		return errno
	}
	echoed := int(binary.NativeEndian.Uint32(rest[0:4]))
	if flags&unix.NLM_F_CAPPED != 0 {
		echoed = unix.NLMSG_HDRLEN // only the request's header came back
	}
	echoed = (echoed + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1)
	if echoed < unix.NLMSG_HDRLEN || echoed > len(rest) {
		return errno
	}
	msg := ""
	walkAttrs(rest[echoed:], func(a attr) {
		if a.typ == unix.NLMSGERR_ATTR_MSG {
			msg = cstring(a.val)
		}
	})
	if msg == "" {
		return errno
	}
	return fmt.Errorf("%w: %s", errno, msg)
}
