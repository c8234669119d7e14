package rtnl

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// A Listener hears every namespace that has an id where it listens, and a
// Neutron router being made sends about 47 notifications (each device's
// registration, addresses and their local and broadcast routes, IPv6
// multicast and link-local routes, netconf of every device). The kernel
// delivers each one to every listener, in the creating thread's context.
// The drift filter is a socket filter that keeps, in the kernel, only
// what can mean that something nsfleet made was taken away or changed
// (22 of the 47); it saves their delivery, not the namespace-id lookup
// the kernel does before any filter runs (Pause does: docs/PERFORMANCE.md):
//
//   - every deletion (RTM_DELLINK, RTM_DELADDR, RTM_DELROUTE);
//   - link changes (RTM_NEWLINK: down, MTU, moved, renamed);
//   - IPv6 addresses added (RTM_NEWADDR of AF_INET6): a host end whose
//     IPv6 was turned back on gets a link-local address;
//   - routes replaced (RTM_NEWROUTE with NLM_F_REPLACE): a declared
//     route given another gateway;
//   - netconf messages that carry one setting (a sysctl written, such as
//     ip_forward), not the whole set each new device announces.
//
// New IPv4 addresses and new routes are never drift: nsfleet leaves what
// it did not declare alone.
func driftFilter() []bpf.Instruction {
	const (
		accept = 0xffffffff
		// Offsets in the first message of the skb (one notification each).
		offLen, offType, offFlags, offFamily = 0, 4, 6, unix.SizeofNlMsghdr
		// A netconf message of one setting: header, netconfmsg padded to 4,
		// the ifindex attribute and the setting's attribute (4 + 4 each).
		netconfOne = unix.SizeofNlMsghdr + 4 + 8 + 8
	)
	// Classic BPF loads in network byte order; netlink is in the host's.
	h := func(v uint16) uint32 {
		var b [2]byte
		binary.NativeEndian.PutUint16(b[:], v)
		return uint32(binary.BigEndian.Uint16(b[:]))
	}
	w := func(v uint32) uint32 {
		var b [4]byte
		binary.NativeEndian.PutUint32(b[:], v)
		return binary.BigEndian.Uint32(b[:])
	}
	p := program{
		{ins: bpf.LoadAbsolute{Off: offType, Size: 2}},
		{ins: bpf.JumpIf{Cond: bpf.JumpEqual, Val: h(unix.RTM_DELLINK)}, yes: "accept"},
		{ins: bpf.JumpIf{Cond: bpf.JumpEqual, Val: h(unix.RTM_DELADDR)}, yes: "accept"},
		{ins: bpf.JumpIf{Cond: bpf.JumpEqual, Val: h(unix.RTM_DELROUTE)}, yes: "accept"},
		{ins: bpf.JumpIf{Cond: bpf.JumpEqual, Val: h(unix.RTM_NEWLINK)}, yes: "accept"},
		{ins: bpf.JumpIf{Cond: bpf.JumpEqual, Val: h(unix.RTM_NEWADDR)}, yes: "addr"},
		{ins: bpf.JumpIf{Cond: bpf.JumpEqual, Val: h(unix.RTM_NEWROUTE)}, yes: "route"},
		{ins: bpf.JumpIf{Cond: bpf.JumpEqual, Val: h(unix.RTM_NEWNETCONF)}, yes: "netconf"},
		{ins: bpf.RetConstant{Val: 0}},
		{label: "addr", ins: bpf.LoadAbsolute{Off: offFamily, Size: 1}},
		{ins: bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_INET6}, yes: "accept", no: "drop"},
		{label: "route", ins: bpf.LoadAbsolute{Off: offFlags, Size: 2}},
		{ins: bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: h(unix.NLM_F_REPLACE)}, yes: "accept", no: "drop"},
		{label: "netconf", ins: bpf.LoadAbsolute{Off: offLen, Size: 4}},
		{ins: bpf.JumpIf{Cond: bpf.JumpEqual, Val: w(netconfOne)}, yes: "accept", no: "drop"},
		{label: "drop", ins: bpf.RetConstant{Val: 0}},
		{label: "accept", ins: bpf.RetConstant{Val: accept}},
	}
	return p.resolve()
}

// program is a classic BPF program whose jumps name labels.
type program []struct {
	label   string
	ins     bpf.Instruction
	yes, no string // a JumpIf's targets; "": the next instruction
}

func (p program) resolve() []bpf.Instruction {
	at := map[string]int{}
	for i, s := range p {
		if s.label != "" {
			at[s.label] = i
		}
	}
	skip := func(from int, label string) uint8 {
		if label == "" {
			return 0
		}
		to, ok := at[label]
		if !ok || to <= from {
			panic("rtnl: bad label " + label)
		}
		return uint8(to - from - 1)
	}
	out := make([]bpf.Instruction, len(p))
	for i, s := range p {
		if j, ok := s.ins.(bpf.JumpIf); ok {
			j.SkipTrue, j.SkipFalse = skip(i, s.yes), skip(i, s.no)
			s.ins = j
		}
		out[i] = s.ins
	}
	return out
}

// attachFilter sets prog as fd's socket filter.
func attachFilter(fd int, prog []bpf.Instruction) error {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return err
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	fp := unix.SockFprog{Len: uint16(len(filter)), Filter: unsafe.SliceData(filter)}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fp); err != nil {
		return fmt.Errorf("netlink socket filter: %w", err)
	}
	return nil
}
