package rtnl_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { nstest.Main(m) }

func TestVethPeerInPlace(t *testing.T) {
	nstest.RequireRoot(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	host, err := rtnl.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	var peer rtnl.Link
	var addrs map[int][]netip.Prefix
	h, err := netns.Create(func(in *netns.NS) error {
		if err := host.AddVeth(rtnl.VethPair{Host: p + "h", Peer: "p0", MTU: 1300, PeerNsFd: in.Fd()}); err != nil {
			return err
		}
		c, err := rtnl.Open()
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.SetLoopback(true, "mark"); err != nil {
			return err
		}
		if peer, err = c.LinkByName("p0"); err != nil {
			return err
		}
		if err := c.AddAddr(peer.Index, netip.MustParsePrefix("198.18.0.2/31")); err != nil {
			return err
		}
		if addrs, err = c.Addrs(); err != nil {
			return err
		}
		// Asked link by link, the kernel says the same of those links,
		// and nothing of a link that does not exist.
		of, err := c.AddrsOf([]int{peer.Index, rtnl.LoopbackIndex, 99999})
		if err != nil {
			return err
		}
		for _, i := range []int{peer.Index, rtnl.LoopbackIndex} {
			if !slices.Equal(of[i], addrs[i]) {
				t.Errorf("AddrsOf link %d: %v, Addrs: %v", i, of[i], addrs[i])
			}
		}
		if len(of[99999]) != 0 || len(of) != 3 {
			t.Errorf("AddrsOf: %v", of)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	hl, err := host.LinkByName(p + "h")
	if err != nil {
		t.Fatal(err)
	}
	if hl.Type != "veth" || hl.MTU != 1300 || peer.MTU != 1300 || hl.PeerIndex != peer.Index || peer.PeerIndex != hl.Index {
		t.Fatalf("pair not linked: host %+v peer %+v", hl, peer)
	}
	if !hl.PeerElsewhere || !peer.PeerElsewhere {
		t.Fatalf("the ends do not say their peer is in another namespace: host %+v peer %+v", hl, peer)
	}
	if len(addrs[peer.Index]) != 1 {
		t.Fatalf("addresses %v", addrs)
	}
	// One queue per end, as asked (the kernel's default is one per CPU).
	ents, err := os.ReadDir("/sys/class/net/" + p + "h/queues")
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 2 { // rx-0 and tx-0
		t.Fatalf("queues: %v", ents)
	}
	// The host can read the namespace's lo by nsid without entering it.
	id, err := host.NsID(h.Fd())
	if err != nil || id < 0 {
		t.Fatalf("nsid %d, %v", id, err)
	}
	lo, err := host.LinkInNamespace(id, rtnl.LoopbackIndex)
	if err != nil || lo.Alias != "mark" || !lo.Up {
		t.Fatalf("lo by nsid: %+v, %v", lo, err)
	}
	// A duplicate pair is refused whole, and the error names both ends.
	err = host.AddVeth(rtnl.VethPair{Host: p + "h", Peer: "p1", PeerNsFd: h.Fd()})
	if err == nil || !strings.Contains(err.Error(), p+"h/p1") {
		t.Fatalf("duplicate: %v", err)
	}
}

func FuzzParseAddr(f *testing.F) {
	// A real RTM_NEWADDR payload: 198.18.0.2/31 on link 2.
	f.Add([]byte{2, 31, 0x80, 0, 2, 0, 0, 0, 8, 0, 1, 0, 198, 18, 0, 2, 8, 0, 2, 0, 198, 18, 0, 2})
	f.Add([]byte{10, 200, 0, 0, 1, 0, 0, 0, 8, 0, 1, 0, 1, 2, 3, 4})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, p, ok, err := rtnl.ParseAddrForTest(b)
		if err == nil && ok && (!p.IsValid() || p.Bits() > p.Addr().BitLen()) {
			t.Fatalf("accepted %v", p)
		}
	})
}

func TestLiteConn(t *testing.T) {
	nstest.RequireRoot(t)
	c, err := rtnl.OpenLite()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Addrs(); err != rtnl.ErrLite {
		t.Fatalf("Addrs on a lite conn: %v", err)
	}
	if ls, err := c.Links(); err != nil || len(ls) == 0 {
		t.Fatalf("Links on a lite conn: %v, %v", ls, err)
	}
}

func FuzzParseLink(f *testing.F) {
	// A real RTM_NEWLINK payload for lo, as the kernel sends it.
	f.Add([]byte{0, 0, 4, 3, 1, 0, 0, 0, 73, 0, 1, 0, 0, 0, 0, 0,
		7, 0, 3, 0, 'l', 'o', 0, 0, 8, 0, 4, 0, 0, 0, 1, 0,
		12, 0, 18, 0, 8, 0, 1, 0, 'v', 'e', 't', 'h'})
	f.Add([]byte{})
	f.Add(make([]byte, 16))
	f.Add(vxlanMessage())
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := rtnl.ParseLinkForTest(b)
		if err == nil && l.Name == "" {
			t.Fatal("accepted a link without a name")
		}
	})
}

// vxlanMessage is an RTM_NEWLINK payload of a VXLAN device vx0: VNI 7,
// local 198.19.1.2, port 4789.
func vxlanMessage() []byte {
	b := nl.NewIfInfomsg(unix.AF_UNSPEC).Serialize()
	b = append(b, nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated("vx0")).Serialize()...)
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("vxlan"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	data.AddRtAttr(nl.IFLA_VXLAN_ID, nl.Uint32Attr(7))
	data.AddRtAttr(nl.IFLA_VXLAN_LOCAL, []byte{198, 19, 1, 2})
	data.AddRtAttr(nl.IFLA_VXLAN_PORT, []byte{0x12, 0xb5})
	return append(b, info.Serialize()...)
}

func TestParseVxlan(t *testing.T) {
	l, err := rtnl.ParseLinkForTest(vxlanMessage())
	if err != nil || l.Type != "vxlan" || l.Vxlan == nil {
		t.Fatalf("%+v %v", l, err)
	}
	if v := l.Vxlan; v.VNI != 7 || v.Local != netip.MustParseAddr("198.19.1.2") || v.Port != 4789 {
		t.Fatalf("vxlan %+v", *v)
	}
}

func TestMissingLinkIsENODEV(t *testing.T) {
	nstest.RequireRoot(t)
	c, err := rtnl.OpenLite()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.LinkByName("nsf-no-such")
	if !errors.Is(err, unix.ENODEV) {
		t.Fatalf("err = %v, want ENODEV", err)
	}
}

// Devices answers by sysfs and by ioctl alike, about the namespace of the
// thread that opened it (not /sys's).
func TestDevices(t *testing.T) {
	nstest.RequireRoot(t)
	p := nstest.Prefix(t)
	h, err := netns.Create(func(in *netns.NS) error {
		c, err := rtnl.OpenLite()
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.AddVeth(rtnl.VethPair{Host: p + "a", Peer: p + "b", MTU: 1400, PeerNsFd: in.Fd()}); err != nil {
			return err
		}
		a, err := c.LinkByName(p + "a")
		if err != nil {
			return err
		}
		if err := c.SetUp(a.Index, true); err != nil {
			return err
		}
		b, err := c.LinkByName(p + "b")
		if err != nil {
			return err
		}
		for _, sysfs := range []bool{true, false} {
			d, err := rtnl.OpenDevices()
			if err != nil {
				return err
			}
			defer d.Close()
			if !sysfs {
				d.IoctlOnly()
			} else if !d.Sysfs() {
				t.Error("no private sysfs as root")
			}
			for _, want := range []rtnl.Link{{Name: p + "a", Index: a.Index, Up: true, MTU: 1400}, {Name: p + "b", Index: b.Index, MTU: 1400}, {Name: "lo", Index: 1}} {
				got, ok, err := d.ByName(want.Name)
				if err != nil || !ok || got.Index != want.Index || got.Up != want.Up || (want.MTU != 0 && got.MTU != want.MTU) {
					t.Errorf("sysfs %v: ByName(%s) = %+v, %v, %v; want %+v", sysfs, want.Name, got, ok, err, want)
				}
				if i, ok, err := d.Index(want.Name); err != nil || !ok || i != want.Index {
					t.Errorf("sysfs %v: Index(%s) = %d, %v, %v", sysfs, want.Name, i, ok, err)
				}
			}
			for _, name := range []string{p + "none", "../net", "a/b", "", strings.Repeat("x", 20)} {
				if _, ok, err := d.Index(name); ok {
					t.Errorf("sysfs %v: Index(%q) found something (err %v)", sysfs, name, err)
				}
			}
			if name, ok, err := d.NameOf(a.Index); err != nil || !ok || name != p+"a" {
				t.Errorf("NameOf(%d) = %q, %v, %v", a.Index, name, ok, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
}

// The link table names every link of the namespace it was read in, by
// name and by index, as rtnetlink does.
func TestLinkTable(t *testing.T) {
	nstest.RequireRoot(t)
	h, err := netns.Create(func(in *netns.NS) error {
		c, err := rtnl.OpenLite()
		if err != nil {
			return err
		}
		defer c.Close()
		for _, n := range []string{"x", "y"} {
			if err := c.AddVeth(rtnl.VethPair{Host: n + "0", Peer: n + "1", PeerNsFd: in.Fd()}); err != nil {
				return err
			}
		}
		links, err := c.Links()
		if err != nil {
			return err
		}
		tab, err := rtnl.ReadLinkTable()
		if err != nil {
			return err
		}
		if tab.Len() != len(links) || len(links) != 5 {
			t.Errorf("table of %d links; rtnetlink shows %d: %+v", tab.Len(), len(links), links)
		}
		for _, l := range links {
			if i, ok := tab.Index(l.Name); !ok || i != l.Index {
				t.Errorf("Index(%s) = %d, %v; want %d", l.Name, i, ok, l.Index)
			}
			if name, ok := tab.NameOf(l.Index); !ok || name != l.Name {
				t.Errorf("NameOf(%d) = %q, %v; want %s", l.Index, name, ok, l.Name)
			}
		}
		if _, ok := tab.Index("z0"); ok {
			t.Error("Index found a link that does not exist")
		}
		if _, ok := tab.NameOf(1 << 30); ok {
			t.Error("NameOf found a link that does not exist")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
}

// genlmsghdr, then the header nest: index 7, name "eth0".
var ethtoolReply = []byte{1, 1, 0, 0, 24, 0, 1, 0x80, 8, 0, 1, 0, 7, 0, 0, 0, 9, 0, 2, 0, 'e', 't', 'h', '0', 0, 0, 0, 0}

func TestParseEthtoolHeader(t *testing.T) {
	name, index, err := rtnl.ParseEthtoolHeaderForTest(ethtoolReply)
	if string(name) != "eth0" || index != 7 || err != nil {
		t.Errorf("got %q, %d, %v; want eth0, 7", name, index, err)
	}
}

func FuzzParseEthtoolHeader(f *testing.F) {
	f.Add(ethtoolReply)
	f.Add([]byte{})
	f.Add([]byte{1, 1, 0, 0, 4, 0, 1, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		rtnl.ParseEthtoolHeaderForTest(b)
	})
}

// Netconf reads the values procfs shows, in the namespace of the Conn.
func TestNetconfMatchesProcfs(t *testing.T) {
	nstest.RequireRoot(t)
	home, err := netns.Current()
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	h, err := netns.Create(func(*netns.NS) error {
		// /proc/sys follows the calling thread's namespace.
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0); err != nil {
			return err
		}
		if err := os.WriteFile("/proc/sys/net/ipv4/conf/default/rp_filter", []byte("2"), 0); err != nil {
			return err
		}
		c, err := rtnl.OpenLite()
		if err != nil {
			return err
		}
		defer c.Close()
		all, err := c.Netconf(unix.AF_INET, -1)
		if err != nil {
			return err
		}
		def, err := c.Netconf(unix.AF_INET, -2)
		if err != nil {
			return err
		}
		if all[2] != 1 || def[3] != 2 { // forwarding, rp_filter
			t.Errorf("netconf all %v default %v; want forwarding 1 and rp_filter 2", all, def)
		}
		// The same by Survey, IPv4 from its dump and IPv6 asked; a
		// configuration the kernel refuses (no device 9999) is left out
		// and the rest still answered.
		all4, def4, none := rtnl.NetconfKey{Family: unix.AF_INET, Index: -1}, rtnl.NetconfKey{Family: unix.AF_INET, Index: -2}, rtnl.NetconfKey{Family: unix.AF_INET, Index: 9999}
		all6, none6 := rtnl.NetconfKey{Family: unix.AF_INET6, Index: -1}, rtnl.NetconfKey{Family: unix.AF_INET6, Index: 9999}
		want := 2
		if _, err := c.Netconf(unix.AF_INET6, -1); err == nil {
			want++ // IPv6 is on
		}
		r, err := c.Survey([]rtnl.NetconfKey{all4, none, all6, none6, def4})
		if err != nil {
			return err
		}
		if len(r.Links) != 1 || r.Links[0].Name != "lo" {
			t.Errorf("survey links %+v; want lo alone", r.Links)
		}
		if r.Netconf[all4][2] != 1 || r.Netconf[def4][3] != 2 {
			t.Errorf("survey netconf %v; want all's forwarding 1 and default's rp_filter 2", r.Netconf)
		}
		if _, ok := r.Netconf[none]; ok || len(r.Netconf) != want {
			t.Errorf("survey netconf %v; want %d configurations", r.Netconf, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
}

func FuzzParseNetconf(f *testing.F) {
	f.Add([]byte{2, 0, 0, 0, 8, 0, 1, 0, 255, 255, 255, 255, 8, 0, 2, 0, 1, 0, 0, 0})
	f.Add([]byte{})
	f.Add([]byte{2, 0, 0, 0, 3, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		all, err := rtnl.ParseNetconfForTest(b)
		index, found, ierr := rtnl.NetconfIndexForTest(b)
		if (err == nil) != (ierr == nil) {
			t.Fatalf("parsers disagree: %v, %v", err, ierr)
		}
		// Both keep the last of a repeated attribute.
		if v, ok := all[1]; err == nil && (ok != found || ok && v != index) {
			t.Fatalf("index %d, %v; the whole parse says %d, %v", index, found, v, ok)
		}
	})
}

// The kernel's own message comes with its errno.
func TestKernelErrorMessage(t *testing.T) {
	nstest.RequireRoot(t)
	h, err := netns.Create(func(*netns.NS) error {
		c, err := rtnl.OpenLite()
		if err != nil {
			return err
		}
		defer c.Close()
		err = c.AddVeth(rtnl.VethPair{Host: "a", Peer: strings.Repeat("b", 20), PeerNsFd: -1})
		var errno unix.Errno
		if !errors.As(err, &errno) || !strings.Contains(err.Error(), errno.Error()+": ") {
			t.Errorf("a veth with a 20-character name: %v; want the errno and the kernel's message", err)
		}
		// The Conn goes on answering after an error.
		if ls, err := c.Links(); err != nil || len(ls) != 1 {
			t.Errorf("links after an error: %v, %v", ls, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
}

// nlmsg is one netlink message as the kernel sends it.
func nlmsg(typ, flags uint16, seq uint32, payload ...byte) []byte {
	b := make([]byte, 16, 16+len(payload)+3)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(16+len(payload)))
	ne.PutUint16(b[4:], typ)
	ne.PutUint16(b[6:], flags)
	ne.PutUint32(b[8:], seq)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// A batch's replies go to their requests by sequence number: a late
// acknowledgement of an earlier request is skipped, a failed request does
// not end the batch, and an interrupted dump is reported as such.
func TestBatchReplies(t *testing.T) {
	errno := func(e int32) []byte {
		b := make([]byte, 4)
		binary.NativeEndian.PutUint32(b, uint32(e))
		return b
	}
	// A dump first: the replies to the requests behind it come before
	// its end.
	var b []byte
	b = append(b, nlmsg(unix.NLMSG_ERROR, 0, 9, errno(0)...)...)                            // late ack
	b = append(b, nlmsg(unix.RTM_NEWLINK, unix.NLM_F_MULTI, 10, 1)...)                      // the dump...
	b = append(b, nlmsg(unix.RTM_NEWNSID, 0, 11, 1, 2, 3, 4)...)                            // a single reply
	b = append(b, nlmsg(unix.NLMSG_ERROR, 0, 12, errno(-int32(unix.ENODEV))...)...)         // refused
	b = append(b, nlmsg(unix.RTM_NEWLINK, unix.NLM_F_MULTI|unix.NLM_F_DUMP_INTR, 10, 2)...) // ...interrupted
	half := len(b)
	b = append(b, nlmsg(unix.NLMSG_DONE, unix.NLM_F_MULTI, 10, errno(0)...)...)
	b = append(b, nlmsg(unix.NLMSG_ERROR, 0, 11, errno(0)...)...) // an ack after its reply
	if done, _, _, err := rtnl.WalkMessagesForTest(b[:half], 10, 3); done || err != nil {
		t.Fatalf("answered before the dump's end: %v, %v", done, err)
	}
	done, errs, replies, err := rtnl.WalkMessagesForTest(b, 10, 3)
	if !done || err != nil {
		t.Fatalf("done %v, err %v", done, err)
	}
	if !errors.Is(errs[0], nl.ErrDumpInterrupted) || errs[1] != nil || !errors.Is(errs[2], unix.ENODEV) {
		t.Errorf("answers %v", errs)
	}
	if want := []int{2, 1, 0}; !slices.Equal(replies, want) {
		t.Errorf("replies %v, want %v", replies, want)
	}
}

// withHostVeth makes a namespace with a veth to the host, whose host end
// is called name and whose other end is "p". The caller closes it.
func withHostVeth(t *testing.T, name string) *netns.NS {
	t.Helper()
	host, err := rtnl.OpenLite()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	h, err := netns.Create(func(in *netns.NS) error {
		return host.AddVeth(rtnl.VethPair{Host: name, Peer: "p", PeerNsFd: in.Fd()})
	})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func FuzzMessages(f *testing.F) {
	// An acknowledgement (error 0) of request 1, and an error with an
	// extended acknowledgement message.
	f.Add([]byte{36, 0, 0, 0, 2, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 16, 0, 5, 0, 1, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{48, 0, 0, 0, 2, 0, 0, 3, 1, 0, 0, 0, 0, 0, 0, 0, 234, 255, 255, 255, 16, 0, 0, 0, 16, 0, 5, 0, 1, 0, 0, 0, 0, 0, 0, 0, 8, 0, 1, 0, 'b', 'a', 'd', 0, 4, 0, 0, 0})
	f.Add([]byte{})
	// An error whose echoed request length (17) is not aligned and ends
	// the message.
	f.Add([]byte{37, 0, 0, 0, 2, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 234, 255, 255, 255, 17, 0, 0, 0, 16, 0, 5, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		rtnl.WalkMessagesForTest(b, 1, 1)
		rtnl.WalkMessagesForTest(b, 0, 3)
		rtnl.WalkMessagesForTest(b, 0xffffffff, 3) // sequence numbers wrap
	})
}

// Freeing a namespace that has an id in this one is announced.
func TestWatchNsIDs(t *testing.T) {
	nstest.RequireRoot(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	host, err := rtnl.OpenLite()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	h := withHostVeth(t, p+"w")
	if id, err := host.NsID(h.Fd()); err != nil || id < 0 {
		h.Close()
		t.Fatalf("the namespace has no id here: %d, %v", id, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seen := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- rtnl.WatchNsIDs(ctx, func() {
			select {
			case seen <- struct{}{}:
			default:
			}
		})
	}()
	time.Sleep(100 * time.Millisecond) // subscribed before the release
	h.Close()
	select {
	case <-seen:
	case <-ctx.Done():
		t.Fatal("no announcement within 30 s of freeing a namespace with an id here")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Survey reads what Read reads (but the peer's namespace) and gives the
// namespace no id for the host; the host end's IfLink names the veth
// inside, as the veth names the host end.
func TestSurvey(t *testing.T) {
	nstest.RequireRoot(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	home, err := netns.Current()
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	h := withHostVeth(t, p+"s")
	defer h.Close()
	var survey, read rtnl.Reading
	err = rtnl.Inside(h, rtnl.OpenLite, func(c *rtnl.Conn) error {
		// Something of every kind: a bridge, a pair with both ends here,
		// the veth to the host with its own MTU and up.
		if err := c.AddDevice("bridge", "d0"); err != nil {
			return err
		}
		if err := c.AddVeth(rtnl.VethPair{Host: "a", Peer: "b", PeerNsFd: -1}); err != nil {
			return err
		}
		// And a pair of several queues, as `ip link add` makes on a
		// machine of several CPUs (its count of counters can grow).
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "m", NumTxQueues: 4, NumRxQueues: 4}, PeerName: "n"}); err != nil {
			return err
		}
		if _, err = c.Survey(nil); err != nil {
			return err
		}
		if id, err := c.NsID(home.Fd()); err != nil || id != -1 {
			t.Errorf("after Survey the namespace has id %d for the host (%v), want none", id, err)
		}
		// A change to p is announced with its peer's namespace id, which
		// gives this namespace one (so do links that go up: a fleet whose
		// veths are up has the ids anyway). Not LinkByName: that too.
		dev, err := rtnl.OpenDevices()
		if err != nil {
			return err
		}
		pi, _, err := dev.Index("p")
		dev.Close()
		if err != nil {
			return err
		}
		if err := c.SetMTU(pi, 1400); err != nil {
			return err
		}
		if err := c.SetUp(pi, true); err != nil {
			return err
		}
		if survey, err = c.Survey([]rtnl.NetconfKey{{Family: unix.AF_INET, Index: -1}}); err != nil {
			return err
		}
		if read.Links, err = c.Links(); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(survey.Netconf) != 1 {
		t.Errorf("netconf %v", survey.Netconf)
	}
	if len(survey.Links) != len(read.Links) {
		t.Fatalf("Survey found %d links, Read %d:\n%+v\n%+v", len(survey.Links), len(read.Links), survey.Links, read.Links)
	}
	for i, s := range survey.Links {
		r := read.Links[i]
		if s.Index != r.Index || s.Name != r.Name || s.Type != r.Type || s.Up != r.Up || s.MTU != r.MTU || s.Alias != r.Alias {
			t.Errorf("link %d: Survey %+v, Read %+v", i, s, r)
		}
		if s.Type == "veth" && s.PeerIndex != r.PeerIndex {
			t.Errorf("veth %s: peer %d by Survey, %d by Read", s.Name, s.PeerIndex, r.PeerIndex)
		}
	}
	dev, err := rtnl.OpenDevices()
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	host, _, err := dev.ByName(p + "s")
	if err != nil {
		t.Fatal(err)
	}
	var inner rtnl.Link
	for _, l := range survey.Links {
		if l.Name == "p" {
			inner = l
		}
	}
	if inner.PeerIndex != host.Index {
		t.Errorf("p names peer %d, the host end is %d", inner.PeerIndex, host.Index)
	}
	for _, how := range []string{"sysfs", "ioctl"} {
		if how == "ioctl" {
			dev.IoctlOnly()
		}
		if got, ok, err := dev.IfLink(p + "s"); err != nil || !ok || got != inner.Index {
			t.Errorf("%s: IfLink of the host end %d, %v, %v; want %d", how, got, ok, err, inner.Index)
		}
		if _, ok, err := dev.IfLink(p + "none"); err != nil || ok {
			t.Errorf("%s: IfLink of no link: %v, %v", how, ok, err)
		}
	}
}

// TestListenerFilter: in the kernel, the listener's filter keeps what can
// be drift (a link change, a sysctl written, an address or a route taken
// away) and drops what a namespace being made announces (IPv4 addresses
// and their routes added); a paused listener hears nothing.
func TestListenerFilter(t *testing.T) {
	nstest.RequireRoot(t)
	ns, err := netns.Create(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	err = rtnl.Inside(ns, rtnl.Open, func(c *rtnl.Conn) error {
		l, err := rtnl.Listen()
		if err != nil {
			return err
		}
		defer l.Close()
		heard := func() map[uint16]int {
			got := map[uint16]int{}
			l.Read(func(ev rtnl.Event) { got[ev.Type]++ })
			return got
		}
		if err := c.SetUp(rtnl.LoopbackIndex, true); err != nil {
			return err
		}
		if got := heard(); got[unix.RTM_NEWLINK] == 0 {
			t.Errorf("lo set up: heard %v, want RTM_NEWLINK", got)
		}
		p := netip.MustParsePrefix("10.9.0.1/24")
		if err := c.AddAddr(rtnl.LoopbackIndex, p); err != nil {
			return err
		}
		if got := heard(); len(got) != 0 {
			t.Errorf("an IPv4 address added (with its routes): heard %v, want nothing", got)
		}
		if err := flipForwarding(); err != nil {
			return err
		}
		if got := heard(); got[unix.RTM_NEWNETCONF] == 0 {
			t.Errorf("ip_forward written: heard %v, want RTM_NEWNETCONF", got)
		}
		if err := c.DeleteAddr(rtnl.LoopbackIndex, p); err != nil {
			return err
		}
		if got := heard(); got[unix.RTM_DELADDR] == 0 || got[unix.RTM_DELROUTE] == 0 {
			t.Errorf("the address deleted: heard %v, want RTM_DELADDR and RTM_DELROUTE", got)
		}
		// Paused, it hears nothing; resumed, it hears again.
		if err := l.Pause(); err != nil {
			return err
		}
		if err := c.SetUp(rtnl.LoopbackIndex, false); err != nil {
			return err
		}
		if got := heard(); len(got) != 0 {
			t.Errorf("paused, lo set down: heard %v, want nothing", got)
		}
		if err := l.Resume(); err != nil {
			return err
		}
		if err := c.SetUp(rtnl.LoopbackIndex, true); err != nil {
			return err
		}
		if got := heard(); got[unix.RTM_NEWLINK] == 0 {
			t.Errorf("resumed, lo set up: heard %v, want RTM_NEWLINK", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// flipForwarding writes the calling thread's namespace's ip_forward to
// what it is not: a namespace may start with 1
// (net.core.devconf_inherit_init_net), and an unchanged value sends no
// notification.
func flipForwarding() error {
	const fwd = "/proc/sys/net/ipv4/ip_forward"
	cur, err := os.ReadFile(fwd)
	if err != nil {
		return err
	}
	flip := "1"
	if strings.TrimSpace(string(cur)) == "1" {
		flip = "0"
	}
	return os.WriteFile(fwd, []byte(flip), 0)
}
