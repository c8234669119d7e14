package rtnl

import (
	"encoding/binary"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// notification builds a netlink message of typ with flags, a body of
// family and pad bytes, and total length n (at least the header and 4).
func notification(typ, flags uint16, family byte, n int) []byte {
	b := make([]byte, n)
	binary.NativeEndian.PutUint32(b[0:4], uint32(n))
	binary.NativeEndian.PutUint16(b[4:6], typ)
	binary.NativeEndian.PutUint16(b[6:8], flags)
	b[unix.SizeofNlMsghdr] = family
	return b
}

// isDrift is the filter's contract written in Go, to hold the BPF to.
func isDrift(b []byte) bool {
	typ := binary.NativeEndian.Uint16(b[4:6])
	switch typ {
	case unix.RTM_DELLINK, unix.RTM_DELADDR, unix.RTM_DELROUTE, unix.RTM_NEWLINK:
		return true
	case unix.RTM_NEWADDR:
		return b[unix.SizeofNlMsghdr] == unix.AF_INET6
	case unix.RTM_NEWROUTE:
		return binary.NativeEndian.Uint16(b[6:8])&unix.NLM_F_REPLACE != 0
	case unix.RTM_NEWNETCONF:
		return binary.NativeEndian.Uint32(b[0:4]) == 36
	}
	return false
}

func driftVM(tb testing.TB) *bpf.VM {
	vm, err := bpf.NewVM(driftFilter())
	if err != nil {
		tb.Fatal(err)
	}
	return vm
}

func TestDriftFilter(t *testing.T) {
	vm := driftVM(t)
	for _, c := range []struct {
		name string
		msg  []byte
		keep bool
	}{
		{"link down", notification(unix.RTM_NEWLINK, 0, unix.AF_UNSPEC, 1200), true},
		{"link deleted", notification(unix.RTM_DELLINK, 0, unix.AF_UNSPEC, 1200), true},
		{"address deleted", notification(unix.RTM_DELADDR, 0, unix.AF_INET, 80), true},
		{"IPv4 address added", notification(unix.RTM_NEWADDR, 0, unix.AF_INET, 80), false},
		{"IPv6 address added", notification(unix.RTM_NEWADDR, 0, unix.AF_INET6, 80), true},
		{"route deleted", notification(unix.RTM_DELROUTE, 0, unix.AF_INET, 60), true},
		{"route added", notification(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_EXCL, unix.AF_INET, 60), false},
		{"route replaced", notification(unix.RTM_NEWROUTE, unix.NLM_F_REPLACE, unix.AF_INET, 60), true},
		{"a sysctl written", notification(unix.RTM_NEWNETCONF, 0, unix.AF_INET, 36), true},
		{"a new device's netconf", notification(unix.RTM_NEWNETCONF, 0, unix.AF_INET, 68), false},
		{"neighbour", notification(unix.RTM_NEWNEIGH, 0, unix.AF_INET, 60), false},
	} {
		n, err := vm.Run(c.msg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := n > 0; got != c.keep || got != isDrift(c.msg) {
			t.Errorf("%s: filter keeps %v, want %v", c.name, got, c.keep)
		}
		// The kernel keeps min(n, length): a kept message must be whole.
		if c.keep && n < len(c.msg) {
			t.Errorf("%s: filter keeps %d of %d bytes", c.name, n, len(c.msg))
		}
	}
}

// FuzzDriftFilter: the BPF program and the Go contract agree on every
// message long enough to hold a header and a family.
func FuzzDriftFilter(f *testing.F) {
	vm := driftVM(f)
	f.Add(notification(unix.RTM_NEWADDR, 0, unix.AF_INET6, 24))
	f.Add(notification(unix.RTM_NEWROUTE, unix.NLM_F_REPLACE, unix.AF_INET, 24))
	f.Add(notification(unix.RTM_NEWNETCONF, 0, unix.AF_INET, 36))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < unix.SizeofNlMsghdr+4 {
			return
		}
		n, err := vm.Run(b)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := n > 0, isDrift(b); got != want {
			t.Fatalf("filter keeps %v, contract says %v (% x)", got, want, b[:20])
		}
	})
}
