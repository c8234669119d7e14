package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
	"github.com/nsfleet/nsfleet/sysctl"
	"github.com/vishvananda/netlink"
)

func TestMain(m *testing.M) { nstest.Main(m) }

// routers returns a fake-router spec (see nstest.FakeRouters) with extra
// YAML appended to its template.
func routers(t *testing.T, p string, count int, extra string) *spec.Fleet {
	t.Helper()
	y := nstest.FakeRouters(p, count) + extra
	f, err := spec.Parse("test.yaml", []byte(y), spec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func up(t *testing.T, f *spec.Fleet, opts fleet.Options) fleet.Summary {
	t.Helper()
	s, err := fleet.Up(context.Background(), f, fleet.UpOptions{Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func down(t *testing.T, sel fleet.Selector, opts fleet.Options) fleet.DownReport {
	t.Helper()
	r, err := fleet.Down(context.Background(), sel, fleet.DownOptions{Options: opts, Wait: true, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Pending) > 0 {
		t.Fatalf("down: still pending: %v", r.Pending)
	}
	return r
}

func inside(t *testing.T, rd *netns.RunDir, name string, fn func(c *rtnl.Conn) error) {
	t.Helper()
	h, err := rd.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	err = netns.Do(h, func() error {
		c, err := rtnl.Open()
		if err != nil {
			return err
		}
		defer c.Close()
		return fn(c)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func states(t *testing.T, f *spec.Fleet, opts fleet.Options) map[fleet.State]int {
	t.Helper()
	st, err := fleet.List(context.Background(), f, fleet.Selector{}, fleet.ListOptions{Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	m := map[fleet.State]int{}
	for _, s := range st {
		m[s.State]++
	}
	return m
}

func TestUpIdempotentRepairDown(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	f := routers(t, p, 20, "")
	opts := fleet.Options{RunDir: rd}

	s := up(t, f, opts)
	if s.Counts[fleet.Created] != 20 || s.Err() != nil {
		t.Fatalf("first up: %+v", s)
	}
	if got := nstest.HostLinks(t, p); len(got) != 40 {
		t.Fatalf("%d host veths, want 40", len(got))
	}
	if m := states(t, f, opts); m[fleet.StateOK] != 20 {
		t.Fatalf("ls after up: %v", m)
	}

	// A second up changes nothing.
	if s := up(t, f, opts); s.Counts[fleet.Unchanged] != 20 {
		t.Fatalf("second up: %+v", s.Counts)
	}

	// Drift: lo down in one, ip_forward=0 in another, a veth gone in a third.
	inside(t, rd, p+"bar-3", func(c *rtnl.Conn) error { return c.SetUp(rtnl.LoopbackIndex, false) })
	h, err := rd.Open(p + "bar-4")
	if err != nil {
		t.Fatal(err)
	}
	err = netns.Do(h, func() error {
		proc, err := sysctl.Open()
		if err != nil {
			return err
		}
		defer proc.Close()
		return proc.Write("net.ipv4.ip_forward", "0")
	})
	h.Close()
	if err != nil {
		t.Fatal(err)
	}
	inside(t, rd, p+"bar-5", func(c *rtnl.Conn) error {
		l, err := c.LinkByName("qri-5")
		if err != nil {
			return err
		}
		return c.DeleteLink(l.Index)
	})
	if m := states(t, f, opts); m[fleet.StateDrift] != 3 {
		t.Fatalf("ls after drift: %v", m)
	}
	s = up(t, f, opts)
	if s.Counts[fleet.Repaired] != 3 || s.Counts[fleet.Unchanged] != 17 {
		t.Fatalf("repair up: %+v", s.Counts)
	}
	if m := states(t, f, opts); m[fleet.StateOK] != 20 {
		t.Fatalf("ls after repair: %v", m)
	}

	r := down(t, fleet.Selector{Names: f.Names()}, opts)
	if r.Counts[fleet.Deleted] != 20 || len(r.Pending) > 0 || r.Freed == 0 {
		t.Fatalf("down: %+v", r)
	}
	if r.HostVeths != 40 {
		t.Fatalf("down saw %d host veths, want 40", r.HostVeths)
	}
	// Down waited: the host veths are already gone.
	if got := nstest.HostLinks(t, p); len(got) != 0 {
		t.Fatalf("host veths left after down --wait: %v", got)
	}
	if pins, _ := rd.List(); len(pins) != 0 {
		t.Fatalf("pins left: %v", pins)
	}
}

func TestAddressesRoutesMTU(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	y := fmt.Sprintf(`namespaces:
  - name: "%[1]sr{i}"
    count: 3
    veths:
      - host: "%[1]sh{i}"
        peer: eth0
        mtu: 1400
        up: true
        host_addresses: ["198.18.{i}.1/30"]
        peer_addresses: ["198.18.{i}.2/30", "fd00:{i}::2/64"]
    routes:
      - to: default
        via: 198.18.{i}.1
      - to: 198.19.0.0/16
        dev: eth0
`, p)
	f, err := spec.Parse("t.yaml", []byte(y), spec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts := fleet.Options{RunDir: rd}
	if s := up(t, f, opts); s.Counts[fleet.Created] != 3 {
		t.Fatalf("up: %+v %v", s.Counts, s.Errors)
	}
	if m := states(t, f, opts); m[fleet.StateOK] != 3 {
		st, _ := fleet.List(context.Background(), f, fleet.Selector{}, fleet.ListOptions{Options: opts})
		t.Fatalf("ls: %v %+v", m, st)
	}
	inside(t, rd, p+"r2", func(c *rtnl.Conn) error {
		l, err := c.LinkByName("eth0")
		if err != nil {
			return err
		}
		if l.MTU != 1400 || !l.Up {
			return fmt.Errorf("eth0 = %+v", l)
		}
		return nil
	})
	if s := up(t, f, opts); s.Counts[fleet.Unchanged] != 3 {
		t.Fatalf("second up: %+v %v", s.Counts, s.Errors)
	}
	// A host address removed is put back, whether Up asks about each
	// namespace's links (a few namespaces) or dumps the host's addresses
	// (many).
	old := fleet.SetFewNamespacesForTest(64)
	t.Cleanup(func() { fleet.SetFewNamespacesForTest(old) })
	for _, few := range []int{64, 0} {
		fleet.SetFewNamespacesForTest(few)
		host, err := rtnl.Open()
		if err != nil {
			t.Fatal(err)
		}
		l, err := host.LinkByName(p + "h1")
		if err == nil {
			err = host.DeleteAddr(l.Index, netip.MustParsePrefix("198.18.1.1/30"))
		}
		host.Close()
		if err != nil {
			t.Fatal(err)
		}
		s := up(t, f, opts)
		if s.Counts[fleet.Repaired] != 1 || s.Counts[fleet.Unchanged] != 2 {
			t.Fatalf("up after a host address was removed (few=%d): %+v %v", few, s.Counts, s.Errors)
		}
	}
	down(t, fleet.Selector{Prefix: p}, opts)
}

// TestConflictNothingHalfMade: a host interface that nsfleet did not make
// blocks one router; the error names both ends, and nothing of that router
// is left behind while the others are made.
func TestConflictNothingHalfMade(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	// Occupy the host name of router 2's first veth with a veth of our own.
	c, err := rtnl.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	self, err := netns.Current()
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	if err := c.AddVeth(rtnl.VethPair{Host: p + "o2", Peer: p + "x2", PeerNsFd: self.Fd()}); err != nil {
		t.Fatal(err)
	}
	f := routers(t, p, 3, "")
	opts := fleet.Options{RunDir: rd}
	s := up(t, f, opts)
	if s.Counts[fleet.Created] != 2 || s.Counts[fleet.Failed] != 1 {
		t.Fatalf("up: %+v", s.Counts)
	}
	msg := s.Errors[0].Error()
	for _, want := range []string{"up: " + p + "bar-2:", p + "o2/qri-2", "already exists"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not contain %q", msg, want)
		}
	}
	if h, err := rd.Open(p + "bar-2"); err == nil {
		h.Close()
		t.Fatal("bar-2 was pinned despite the conflict")
	}
	// The peer-name collision inside the namespace, provoked at the
	// kernel level: the pair is refused whole.
	dupNS, err := netns.Create(func(in *netns.NS) error {
		if err := c.AddVeth(rtnl.VethPair{Host: p + "c1", Peer: "dup", PeerNsFd: in.Fd()}); err != nil {
			return err
		}
		err := c.AddVeth(rtnl.VethPair{Host: p + "c2", Peer: "dup", PeerNsFd: in.Fd()})
		if err == nil {
			return errors.New("second veth with the same peer name was accepted")
		}
		if !strings.Contains(err.Error(), p+"c2/dup") {
			return fmt.Errorf("error %q does not name both ends", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	dupNS.Close()
	if _, err := c.LinkByName(p + "c2"); err == nil {
		t.Fatal("half-made pair: host end c2 exists")
	}
	down(t, fleet.Selector{Prefix: p}, opts)
}

// TestForeignLeftAlone: a namespace made by iproute2 is seen, reported and
// left alone by up, ls and down, unless adopted.
func TestForeignLeftAlone(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	// What `ip netns add` does, by hand in our run dir.
	h, err := netns.Create(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rd.Setup(); err != nil {
		t.Fatal(err)
	}
	if err := rd.Pin(p+"bar-1", h); err != nil {
		t.Fatal(err)
	}
	h.Close()
	f := routers(t, p, 2, "")
	opts := fleet.Options{RunDir: rd}
	s := up(t, f, opts)
	if s.Counts[fleet.Skipped] != 1 || s.Counts[fleet.Created] != 1 {
		t.Fatalf("up: %+v", s.Counts)
	}
	if !errors.Is(s.Errors[0], fleet.ErrForeign) {
		t.Fatalf("error %v is not ErrForeign", s.Errors[0])
	}
	if m := states(t, f, opts); m[fleet.StateForeign] != 1 {
		t.Fatalf("ls: %v", m)
	}
	r := down(t, fleet.Selector{Prefix: p}, opts)
	if r.Counts[fleet.Skipped] != 1 || r.Counts[fleet.Deleted] != 1 {
		t.Fatalf("down: %+v", r.Counts)
	}
	if h, err := rd.Open(p + "bar-1"); err != nil {
		t.Fatalf("foreign namespace was deleted: %v", err)
	} else {
		h.Close()
	}
	// Adopted, it is repaired to the spec and becomes nsfleet's.
	opts.Adopt = true
	if s := up(t, f, opts); s.Counts[fleet.Repaired] != 1 {
		t.Fatalf("adopt: %+v %v", s.Counts, s.Errors)
	}
	opts.Adopt = false
	if m := states(t, f, opts); m[fleet.StateOK] != 2 {
		t.Fatalf("ls after adopt: %v", m)
	}
	if r := down(t, fleet.Selector{Prefix: p}, opts); len(r.Pending) > 0 || r.Counts[fleet.Deleted] != 2 {
		t.Fatalf("final down: %+v", r)
	}
}

// TestStalePinReused: a pin file without its mount (a crash between create
// and mount) is reused by up and removed by down.
func TestStalePinReused(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	if _, err := rd.Setup(); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("touch", rd.PinPath(p+"bar-1")).Run(); err != nil {
		t.Fatal(err)
	}
	f := routers(t, p, 1, "")
	opts := fleet.Options{RunDir: rd}
	if m := states(t, f, opts); m[fleet.StateStale] != 1 {
		t.Fatalf("ls: %v", m)
	}
	if s := up(t, f, opts); s.Counts[fleet.Created] != 1 {
		t.Fatalf("up: %+v %v", s.Counts, s.Errors)
	}
	down(t, fleet.Selector{Prefix: p}, opts)
}

// TestDownTimeoutReportsPending: a namespace held by an open descriptor is
// not freed; down reports it instead of hanging.
func TestDownTimeoutReportsPending(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	f := routers(t, p, 2, "")
	opts := fleet.Options{RunDir: rd}
	up(t, f, opts)
	held, err := rd.Open(p + "bar-2")
	if err != nil {
		t.Fatal(err)
	}
	r, err := fleet.Down(context.Background(), fleet.Selector{Prefix: p}, fleet.DownOptions{Options: opts, Wait: true, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Pending) != 1 || !strings.Contains(r.Pending[0], p+"bar-2") {
		t.Fatalf("pending = %v", r.Pending)
	}
	// It names what holds it: this test, by an open file.
	if want := fmt.Sprintf("pid %d (", os.Getpid()); !strings.Contains(r.Pending[0], want) || !strings.Contains(r.Pending[0], "has it open") {
		t.Errorf("pending %q does not say that pid %d has it open", r.Pending[0], os.Getpid())
	}
	held.Close()
	nstest.WaitHostLinksGone(t, p, 10*time.Second)
}

func TestRunDirLock(t *testing.T) {
	rd := nstest.RunDir(t)
	l, err := rd.Lock(false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rd.Lock(false); !errors.Is(err, netns.ErrLocked) {
		t.Fatalf("second lock: %v, want ErrLocked", err)
	}
	l.Unlock()
	l2, err := rd.Lock(false)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	l2.Unlock()
}

// Reading a fleet (ls with and without a spec, a second up, down's check)
// gives its namespaces no id for the host: each such id makes the kernel's
// teardown of any namespace dearer (rtnl.Survey). ls still pairs every
// veth with its host end.
func TestReadsGiveNoNamespaceIDs(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	f := routers(t, p, 5, "")
	opts := fleet.Options{RunDir: rd}
	up(t, f, opts)
	t.Cleanup(func() { down(t, fleet.Selector{Prefix: p}, opts) })
	if m := states(t, f, opts); m[fleet.StateOK] != 5 {
		t.Fatalf("ls: %v", m)
	}
	st, err := fleet.List(context.Background(), nil, fleet.Selector{Prefix: p}, fleet.ListOptions{Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		var ends []string
		for _, l := range s.Links {
			if l.Type == "veth" {
				ends = append(ends, l.Host)
			}
		}
		i := strings.TrimPrefix(s.Name, p+"bar-")
		if want := []string{p + "o" + i, p + "g" + i}; strings.Join(ends, " ") != strings.Join(want, " ") {
			t.Errorf("%s: host ends %q, want %q", s.Name, ends, want)
		}
	}
	if s := up(t, f, opts); s.Counts[fleet.Unchanged] != 5 {
		t.Fatalf("second up: %+v", s.Counts)
	}
	if r, err := fleet.Down(context.Background(), fleet.Selector{Prefix: p}, fleet.DownOptions{Options: opts, DryRun: true}); err != nil || r.Counts[fleet.WouldDelete] != 5 {
		t.Fatalf("down --dry-run: %+v, %v", r, err)
	}
	home, err := netns.Current()
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	for _, name := range f.Names() {
		inside(t, rd, name, func(c *rtnl.Conn) error {
			if id, err := c.NsID(home.Fd()); err != nil || id != -1 {
				t.Errorf("%s has id %d for the host (%v), want none", name, id, err)
			}
			return nil
		})
	}
	// The check above can fail: an rtnetlink dump of the links gives one.
	inside(t, rd, f.Names()[0], func(c *rtnl.Conn) error {
		if _, err := c.Links(); err != nil {
			return err
		}
		if id, err := c.NsID(home.Fd()); err != nil || id < 0 {
			t.Errorf("after a dump: id %d (%v), want one", id, err)
		}
		return nil
	})
}

// A spec's veth is taken as paired on the namespace's word, but before up
// changes the host end it asks the host side: here the host end's name
// and number belong to a bridge, and the veth inside is paired into a
// third namespace with an end of that number. up must not touch the
// bridge.
func TestUpAsksTheHostBeforeChangingIt(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	y := fmt.Sprintf(`namespaces:
  - name: "%[1]sr1"
    veths:
      - host: "%[1]sh1"
        peer: eth0
        mtu: 1400
`, p)
	f, err := spec.Parse("t.yaml", []byte(y), spec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts := fleet.Options{RunDir: rd}
	up(t, f, opts)
	t.Cleanup(func() { down(t, fleet.Selector{Prefix: p}, opts) })
	host, err := netlink.LinkByName(p + "h1")
	if err != nil {
		t.Fatal(err)
	}
	index := host.Attrs().Index
	// Deleting eth0 takes the host end with it; a bridge takes its name
	// and number, and eth0 comes back paired into another namespace, its
	// end there numbered as the host end was.
	inside(t, rd, p+"r1", func(c *rtnl.Conn) error {
		l, err := c.LinkByName("eth0")
		if err != nil {
			return err
		}
		return c.DeleteLink(l.Index)
	})
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: p + "h1", Index: index}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	r1, err := rd.Open(p + "r1")
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	z, err := netns.Create(func(*netns.NS) error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "z", Index: index}, PeerName: "eth0", PeerNamespace: netlink.NsFd(r1.Fd())})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	s, err := fleet.Up(context.Background(), f, fleet.UpOptions{Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	if s.Counts[fleet.Failed] != 1 || len(s.Errors) != 1 || !strings.Contains(s.Errors[0].Error(), "is not a veth paired with this namespace") {
		t.Fatalf("up: %+v, %v", s.Counts, s.Errors)
	}
	if l, err := netlink.LinkByName(p + "h1"); err != nil || l.Attrs().MTU == 1400 || l.Type() != "bridge" {
		t.Fatalf("the bridge was changed: %+v, %v", l, err)
	}
}

// host_ipv6: false turns IPv6 off on the host end before it goes up; ls
// sees it turned back on, and up turns it off again.
func TestHostIPv6Off(t *testing.T) {
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		t.Skip("no IPv6 in this kernel")
	}
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	y := fmt.Sprintf(`namespaces:
  - name: "%[1]sr{i}"
    count: 2
    veths:
      - host: "%[1]sh{i}"
        peer: eth0
        up: true
        host_ipv6: false
      - host: "%[1]sk{i}"
        peer: eth1
        up: true
`, p)
	f, err := spec.Parse("t.yaml", []byte(y), spec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts := fleet.Options{RunDir: rd}
	up(t, f, opts)
	t.Cleanup(func() { down(t, fleet.Selector{Prefix: p}, opts) })
	disabled := func(dev string) string {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + dev + "/disable_ipv6")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	for _, i := range []string{"1", "2"} {
		if disabled(p+"h"+i) != "1" || disabled(p+"k"+i) != "0" {
			t.Fatalf("router %s: disable_ipv6 %s on h, %s on k; want 1 and 0", i, disabled(p+"h"+i), disabled(p+"k"+i))
		}
		if l, err := netlink.LinkByName(p + "h" + i); err != nil || l.Attrs().Flags&net.FlagUp == 0 {
			t.Fatalf("h%s not up: %v", i, err)
		}
	}
	if m := states(t, f, opts); m[fleet.StateOK] != 2 {
		t.Fatalf("ls: %v", m)
	}
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+p+"h2/disable_ipv6", []byte("0"), 0); err != nil {
		t.Fatal(err)
	}
	if m := states(t, f, opts); m[fleet.StateDrift] != 1 {
		t.Fatalf("ls after IPv6 was turned on: %v", m)
	}
	if s := up(t, f, opts); s.Counts[fleet.Repaired] != 1 {
		t.Fatalf("repair: %+v %v", s.Counts, s.Errors)
	}
	if disabled(p+"h2") != "1" {
		t.Fatal("up did not turn IPv6 off again")
	}
}
