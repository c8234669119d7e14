package fleet

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
	"github.com/nsfleet/nsfleet/sysctl"
)

// snapshot is what every worker needs of the host side: a Devices to ask
// about host links by name in constant time, the host's addresses when the
// spec puts any on host ends, and nsfleet's own namespace. Workers only
// read it; nsfleet holds the run dir lock, so no other nsfleet changes the
// host meanwhile.
type snapshot struct {
	dev *rtnl.Devices
	// links, when read (List reads it; Up does not, as it changes the
	// host ends while it runs), answers the host ends' indexes and names.
	links *rtnl.LinkTable
	addrs map[int][]netip.Prefix
	// sys is the host's procfs, for the host ends' IPv6 switch: opened on
	// first use, shared by the workers, so used one at a time.
	sysMu sync.Mutex
	sys   *sysctl.Procfs
}

func (s *snapshot) close() {
	if s != nil {
		s.dev.Close()
		if s.sys != nil {
			s.sys.Close()
		}
	}
}

// hostIPv6Sysctl runs fn with the host's procfs and the disable_ipv6 key of
// the host link called name. It runs fn on a goroutine of its own: a
// sysctl acts on the namespace of the calling thread, and the caller's may
// be locked inside a namespace (a worker creating one); a new goroutine
// never runs on another's locked thread, and every other thread is in
// nsfleet's own namespace.
func (s *snapshot) hostIPv6Sysctl(name string, fn func(p *sysctl.Procfs, key string) error) error {
	done := make(chan error, 1)
	go func() {
		s.sysMu.Lock()
		defer s.sysMu.Unlock()
		if s.sys == nil {
			p, err := sysctl.Open()
			if err != nil {
				done <- fmt.Errorf("host: %w", err)
				return
			}
			s.sys = p
		}
		done <- fn(s.sys, "net.ipv6.conf."+strings.ReplaceAll(name, ".", "/")+".disable_ipv6")
	}()
	return <-done
}

// hostIPv6On reads whether the host link called name has IPv6 on (false
// where the kernel has none).
func (s *snapshot) hostIPv6On(name string) (bool, error) {
	var on bool
	err := s.hostIPv6Sysctl(name, func(p *sysctl.Procfs, key string) error {
		v, err := p.Read(key)
		if errors.Is(err, sysctl.ErrUnknownKey) {
			return nil
		}
		on = err == nil && v == "0"
		return err
	})
	return on, err
}

// setHostIPv6Off turns IPv6 off on the host link called name.
func (s *snapshot) setHostIPv6Off(name string) error {
	return s.hostIPv6Sysctl(name, func(p *sysctl.Procfs, key string) error {
		if err := p.Write(key, "1"); err != nil && !errors.Is(err, sysctl.ErrUnknownKey) {
			return fmt.Errorf("host: %w", err)
		}
		return nil
	})
}

// hostSnapshot reads what f needs of the host. It does not dump the
// host's links: see rtnl.Devices.
func hostSnapshot(f *spec.Fleet, prev func(string) *spec.Namespace) (*snapshot, error) {
	s := &snapshot{}
	var err error
	if s.dev, err = rtnl.OpenDevices(); err != nil {
		return nil, err
	}
	if hostAddrsNeeded(f, prev) {
		c, err := rtnl.Open()
		if err != nil {
			s.close()
			return nil, err
		}
		if len(f.Namespaces) <= fewNamespaces {
			s.addrs, err = c.AddrsOf(s.hostIndexes(f, prev))
		} else {
			s.addrs, err = c.Addrs()
		}
		c.Close()
		if err != nil {
			s.close()
			return nil, fmt.Errorf("host: %w", err)
		}
	}
	return s, nil
}

// hostIndexes returns the indexes of the host ends named by f's
// namespaces and by what they were before (those that exist).
func (s *snapshot) hostIndexes(f *spec.Fleet, prev func(string) *spec.Namespace) []int {
	var out []int
	add := func(ns *spec.Namespace) {
		for _, v := range ns.Veths {
			if i, ok, _ := s.dev.Index(v.Host); ok {
				out = append(out, i)
			}
		}
	}
	for i := range f.Namespaces {
		add(&f.Namespaces[i])
		if prev != nil {
			if p := prev(f.Namespaces[i].Name); p != nil {
				add(p)
			}
		}
	}
	return out
}

func hostAddrsNeeded(f *spec.Fleet, prev func(string) *spec.Namespace) bool {
	if f == nil {
		return false
	}
	has := func(ns *spec.Namespace) bool {
		for _, v := range ns.Veths {
			if len(v.HostAddrs) > 0 {
				return true
			}
		}
		return false
	}
	for i := range f.Namespaces {
		if has(&f.Namespaces[i]) {
			return true
		}
		if prev != nil {
			if p := prev(f.Namespaces[i].Name); p != nil && has(p) {
				return true
			}
		}
	}
	return false
}

// hostLinks reads the host ends that ns's veths name: their index, and
// their state and MTU only where the spec sets them (each is one more
// lookup by name). Not the index they are linked to: on the host of
// 40,000 routers that sysfs read was 28% of `ls`'s CPU (see
// Observed.pairedHere).
func (s *snapshot) hostLinks(ns *spec.Namespace) (map[string]rtnl.Link, error) {
	out := make(map[string]rtnl.Link, len(ns.Veths))
	for _, v := range ns.Veths {
		var l rtnl.Link
		var ok bool
		var err error
		switch {
		case v.Up || v.MTU != 0:
			l, ok, err = s.dev.ByName(v.Host)
		case s.links != nil:
			l = rtnl.Link{Name: v.Host, PeerIndex: -1, PeerNsID: -1}
			l.Index, ok = s.links.Index(v.Host)
		default:
			l = rtnl.Link{Name: v.Host, PeerIndex: -1, PeerNsID: -1}
			l.Index, ok, err = s.dev.Index(v.Host)
		}
		if err != nil {
			return nil, fmt.Errorf("host: %w", err)
		}
		l.PeerIndex = -1
		if ok {
			out[v.Host] = l
		}
	}
	return out, nil
}

// hostIPv6 reads which of ns's host ends that the spec wants without IPv6
// have it on (nil if the spec wants it everywhere).
func (s *snapshot) hostIPv6(ns *spec.Namespace) (map[string]bool, error) {
	var on map[string]bool
	for _, v := range ns.Veths {
		if !v.HostIPv6Off {
			continue
		}
		yes, err := s.hostIPv6On(v.Host)
		if err != nil {
			return nil, err
		}
		if yes {
			if on == nil {
				on = map[string]bool{}
			}
			on[v.Host] = true
		}
	}
	return on, nil
}

// hostEnd returns the name of the host link paired with l, a veth of the
// namespace obs was read from, or "" if its peer is not in the host: a
// host end the spec names, paired as Observed.pairedHere says, or else
// the host link of l's peer index if that one names l back (without names,
// numbers alone match too easily: a veth to another namespace, whose end
// there is numbered 4, would be paired with the host's link 4).
func (s *snapshot) hostEnd(obs *Observed, l rtnl.Link) string {
	if l.PeerIndex <= 0 {
		return ""
	}
	for name, hl := range obs.HostLinks {
		if hl.Index == l.PeerIndex && (hl.PeerIndex < 0 || hl.PeerIndex == l.Index) {
			return name // the spec's name, already looked up
		}
	}
	if obs.pairedInside(l) {
		return ""
	}
	var name string
	if s.links != nil {
		name, _ = s.links.NameOf(l.PeerIndex)
	} else if n, ok, err := s.dev.NameOf(l.PeerIndex); err == nil && ok {
		name = n
	}
	if name == "" {
		return ""
	}
	if back, ok, err := s.dev.IfLink(name); err != nil || !ok || back != l.Index {
		return ""
	}
	// A device that is no veth names itself as its link: numbered as l
	// is (a link between two namespaces, numbered as the host's ifb0), it
	// would pass.
	if veth, err := s.dev.IsVeth(name); err != nil || !veth {
		return ""
	}
	return name
}
