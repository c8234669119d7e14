package fleet

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
)

// These tests need no root: Diff works on plain data.

func wantNS() *spec.Namespace {
	return &spec.Namespace{
		Name:     "bar-1",
		Loopback: true,
		Sysctls:  []spec.Sysctl{{Key: "net.ipv4.ip_forward", Value: "1"}},
		Veths:    []spec.Veth{{Host: "qro-1", Peer: "qri-1", MTU: 1400, Up: true, HostIPv6Off: true, PeerAddrs: []netip.Prefix{netip.MustParsePrefix("10.0.0.2/30")}}},
		Routes:   []spec.Route{{To: netip.MustParsePrefix("0.0.0.0/0"), Via: netip.MustParseAddr("10.0.0.1")}},
	}
}

func matching() *Observed {
	return &Observed{
		Links: []rtnl.Link{
			{Index: 1, Name: "lo", Type: "device", Up: true, Alias: Marker, PeerNsID: -1},
			{Index: 2, Name: "qri-1", Type: "veth", Up: true, MTU: 1400, PeerIndex: 50, PeerNsID: -1},
		},
		Addrs:     map[int][]netip.Prefix{2: {netip.MustParsePrefix("10.0.0.2/30")}},
		Routes:    []rtnl.Route{{To: netip.MustParsePrefix("0.0.0.0/0"), Via: netip.MustParseAddr("10.0.0.1"), Index: 2}},
		Sysctls:   map[string]string{"net.ipv4.ip_forward": "1"},
		HostLinks: map[string]rtnl.Link{"qro-1": {Index: 50, Name: "qro-1", Up: true, MTU: 1400, PeerIndex: 2, PeerNsID: -1}},
	}
}

func kinds(fs []Fix) []FixKind {
	var out []FixKind
	for _, f := range fs {
		out = append(out, f.Kind)
	}
	return out
}

func TestDiffMatching(t *testing.T) {
	fs, err := Diff(wantNS(), matching(), false)
	if err != nil || len(fs) != 0 {
		t.Fatalf("Diff = %v, %v; want nothing", fs, err)
	}
	// The host end's own peer index not read: this side's word is taken.
	o := matching()
	h := o.HostLinks["qro-1"]
	h.PeerIndex = -1
	o.HostLinks["qro-1"] = h
	if fs, err := Diff(wantNS(), o, false); err != nil || len(fs) != 0 {
		t.Fatalf("one side read: Diff = %v, %v; want nothing", fs, err)
	}
}

func TestDiffDrift(t *testing.T) {
	cases := []struct {
		name   string
		break_ func(o *Observed)
		want   FixKind
	}{
		{"lo down", func(o *Observed) { o.Links[0].Up = false }, FixLoopback},
		{"sysctl", func(o *Observed) { o.Sysctls["net.ipv4.ip_forward"] = "0" }, FixSysctl},
		{"sysctl missing", func(o *Observed) { delete(o.Sysctls, "net.ipv4.ip_forward") }, FixSysctl},
		{"veth missing", func(o *Observed) { o.Links = o.Links[:1]; delete(o.HostLinks, "qro-1") }, FixVeth},
		{"peer renamed, host end left", func(o *Observed) { o.Links[1].Name = "foo" }, FixReplaceVeth},
		{"mtu", func(o *Observed) { o.Links[1].MTU = 1500 }, FixVethMTU},
		{"down", func(o *Observed) { h := o.HostLinks["qro-1"]; h.Up = false; o.HostLinks["qro-1"] = h }, FixVethUp},
		{"address", func(o *Observed) { o.Addrs = nil }, FixPeerAddr},
		{"route", func(o *Observed) { o.Routes = nil }, FixRoute},
		{"host ipv6", func(o *Observed) { o.HostIPv6On = map[string]bool{"qro-1": true} }, FixHostIPv6},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := matching()
			c.break_(o)
			fs, err := Diff(wantNS(), o, false)
			if err != nil {
				t.Fatal(err)
			}
			if len(fs) != 1 || fs[0].Kind != c.want {
				t.Fatalf("Diff = %v (%v), want one fix of kind %v", kinds(fs), fs, c.want)
			}
			if fs[0].Reason == "" {
				t.Error("fix without a reason")
			}
		})
	}
}

func TestDiffConflict(t *testing.T) {
	o := matching()
	// qro-1 belongs to some other namespace (where its peer has index 2
	// too): not ours to delete. Our qri-1 is paired with another host link.
	o.Links[1].PeerIndex = 60
	_, err := Diff(wantNS(), o, false)
	var c *Conflict
	if !errors.As(err, &c) {
		t.Fatalf("err = %v, want *Conflict", err)
	}
	// Its other end was moved out of this namespace: no longer ours either.
	o = matching()
	o.Links = o.Links[:1]
	if _, err := Diff(wantNS(), o, false); !errors.As(err, &c) {
		t.Fatalf("peer moved away: err = %v, want *Conflict", err)
	}
	// The host name is held by another device (its index is not the one
	// our veth's peer has): not ours.
	o = matching()
	o.HostLinks["qro-1"] = rtnl.Link{Index: 51, Name: "qro-1", PeerIndex: 51, PeerNsID: -1}
	if _, err := Diff(wantNS(), o, false); !errors.As(err, &c) {
		t.Fatalf("dummy in the way: err = %v, want *Conflict", err)
	}
	// Our qri-1 names index 50 as its peer, but the host's link 50 names
	// another: qri-1's peer is a link numbered 50 in some other namespace,
	// and qro-1 is not ours.
	o = matching()
	h := o.HostLinks["qro-1"]
	h.PeerIndex = 9
	o.HostLinks["qro-1"] = h
	if _, err := Diff(wantNS(), o, false); !errors.As(err, &c) {
		t.Fatalf("host end paired elsewhere: err = %v, want *Conflict", err)
	}
}

func TestPairedInside(t *testing.T) {
	o := &Observed{Links: []rtnl.Link{
		{Index: 1, Name: "lo", Type: "device"},
		{Index: 2, Name: "eth0", Type: "veth", PeerIndex: 2}, // its peer elsewhere is 2 too
		{Index: 3, Name: "a", Type: "veth", PeerIndex: 4},
		{Index: 4, Name: "b", Type: "veth", PeerIndex: 3},
		{Index: 5, Name: "c", Type: "veth", PeerIndex: 3}, // 3 names another
	}}
	for i, want := range []bool{false, false, true, true, false} {
		if got := o.pairedInside(o.Links[i]); got != want {
			t.Errorf("%s: paired inside %v, want %v", o.Links[i].Name, got, want)
		}
	}
}

func TestDiffAdopt(t *testing.T) {
	o := matching()
	o.Links[0].Alias = ""
	if o.Owned() {
		t.Fatal("owned without marker")
	}
	fs, _ := Diff(wantNS(), o, false)
	if len(fs) != 0 {
		t.Fatalf("without adopt: %v", fs)
	}
	fs, _ = Diff(wantNS(), o, true)
	if len(fs) != 1 || fs[0].Kind != FixMarker {
		t.Fatalf("with adopt: %v", kinds(fs))
	}
}

func TestSummaryRates(t *testing.T) {
	s := Summary{Mark: 250, Counts: map[Action]int{Created: 500}, Marks: []time.Duration{time.Second, 3 * time.Second}, Elapsed: 4 * time.Second}
	r := s.MarkRates()
	if r[0] != 250 || r[1] != 125 || s.Rate() != 125 {
		t.Fatalf("rates %v, rate %v", r, s.Rate())
	}
}

// TestEmitterInOrder: statuses finished out of order are handed over in
// order, each once, and dropped after.
func TestEmitterInOrder(t *testing.T) {
	out := make([]Status, 5)
	for i := range out {
		out[i].Name = string(rune('a' + i))
	}
	var got []string
	e := newEmitter(out, func(s Status) { got = append(got, s.Name) })
	for _, i := range []int{2, 0, 4, 1, 3} {
		e.done(i)
	}
	if strings.Join(got, "") != "abcde" {
		t.Fatalf("order %v", got)
	}
	if e.result() != nil || out[0].Name != "" {
		t.Fatal("statuses kept after they were handed over")
	}
}

func TestPrune(t *testing.T) {
	pfx := netip.MustParsePrefix
	// prev had a second veth, a host address, another peer address and a
	// route that the new spec (wantNS) does not ask for.
	prev := wantNS()
	prev.Veths[0].PeerAddrs = append(prev.Veths[0].PeerAddrs, pfx("10.9.9.9/32"))
	prev.Veths[0].HostAddrs = []netip.Prefix{pfx("10.0.0.1/30")}
	prev.Veths = append(prev.Veths, spec.Veth{Host: "qgo-1", Peer: "qgi-1"})
	old := spec.Route{To: pfx("198.51.100.0/24"), Via: netip.MustParseAddr("10.0.0.1")}
	prev.Routes = append(prev.Routes, old)

	got := matching()
	got.Links = append(got.Links, rtnl.Link{Index: 3, Name: "qgi-1", Type: "veth", PeerIndex: 51, PeerNsID: -1})
	got.Addrs[2] = append(got.Addrs[2], pfx("10.9.9.9/32"), pfx("10.7.7.7/32")) // the last: someone else's
	got.HostAddrs = map[int][]netip.Prefix{50: {pfx("10.0.0.1/30")}}
	got.Routes = append(got.Routes, rtnl.Route{To: old.To, Via: old.Via, Index: 2},
		rtnl.Route{To: pfx("203.0.113.0/24"), Via: old.Via, Index: 2}) // a daemon's

	fs := Prune(prev, wantNS(), got)
	want := []FixKind{FixDropPeerAddr, FixDropHostAddr, FixDropVeth, FixDropRoute}
	if g := kinds(fs); !slices.Equal(g, want) {
		t.Fatalf("Prune = %v (%v), want kinds %v", g, fs, want)
	}
	if fs[2].Index != 3 || fs[0].Addr != pfx("10.9.9.9/32") || fs[0].Index != 2 || fs[1].Index != 50 || fs[3].Old != old {
		t.Errorf("Prune acts on the wrong objects: %+v", fs)
	}
	// Already gone from the kernel: nothing to do.
	if fs := Prune(prev, wantNS(), matching()); len(fs) != 0 {
		t.Errorf("nothing left to remove, Prune = %v", fs)
	}
	// No previous spec (a one-node up): nothing is removed.
	if fs := Prune(nil, wantNS(), got); len(fs) != 0 {
		t.Errorf("without a previous spec, Prune = %v", fs)
	}
	// A link dropped from the spec: its end here goes, unless the new
	// spec uses the name again.
	linked := wantNS()
	linked.Links = []spec.Link{{A: spec.LinkEnd{Namespace: linked.Name, Interface: "eth9"}, B: spec.LinkEnd{Namespace: "other", Interface: "eth0"}}}
	withEnd := matching()
	withEnd.Links = append(withEnd.Links, rtnl.Link{Index: 9, Name: "eth9", Type: "vxlan"})
	if fs := Prune(linked, wantNS(), withEnd); len(fs) != 1 || fs[0].Kind != FixDropLink || fs[0].Index != 9 {
		t.Errorf("link dropped: Prune = %v", fs)
	}
	if fs := Prune(linked, linked, withEnd); len(fs) != 0 {
		t.Errorf("link kept: Prune = %v", fs)
	}
	// A veth renamed inside keeps the new pair's name: the new spec's
	// peer qgi-1 is not deleted as the dropped pair's.
	renamed := wantNS()
	renamed.Veths = append(renamed.Veths, spec.Veth{Host: "qgx-1", Peer: "qgi-1"})
	for _, f := range Prune(prev, renamed, got) {
		if f.Kind == FixDropVeth {
			t.Errorf("dropped a name the new spec uses: %v", f)
		}
	}
}
