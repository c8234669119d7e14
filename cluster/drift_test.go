package cluster

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { nstest.Main(m) }

// TestDriftWatchHearsInsideNamespaces sets lo down inside a namespace that
// has a veth to the host and expects that namespace reported, by its id,
// from the host's one listening socket.
func TestDriftWatchHearsInsideNamespaces(t *testing.T) {
	nstest.RequireRoot(t)
	rd := nstest.RunDir(t)
	prefix := nstest.Prefix(t)
	d := runningDriftWatch(t, rd.Path)

	host := prefix + "h"
	ns, err := netns.Create(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	c, err := rtnl.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.AddVeth(rtnl.VethPair{Host: host, Peer: "p", PeerNsFd: ns.Fd()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nstest.DeleteHostLinks(t, prefix) })
	l, err := c.LinkByName(host)
	if err != nil {
		t.Fatal(err)
	}
	d.learn("ns-a", []string{host}, int32(l.PeerNsID))
	d.take()

	err = rtnl.Inside(ns, rtnl.OpenLite, func(in *rtnl.Conn) error { return in.SetUp(rtnl.LoopbackIndex, true) })
	if err != nil {
		t.Fatal(err)
	}
	if !waitMarked(d, "ns-a") {
		t.Fatal("lo set up inside the namespace: no event for it")
	}
	// A host-side change names the namespace through the veth's name.
	if err := c.SetUp(l.Index, true); err != nil {
		t.Fatal(err)
	}
	if !waitMarked(d, "ns-a") {
		t.Fatal("host veth set up: no event for its namespace")
	}
	// A pin removed from the run dir is reported by name.
	if err := rd.Pin("gone", ns); err != nil {
		t.Fatal(err)
	}
	d.take()
	if err := rd.Unpin("gone"); err != nil {
		t.Fatal(err)
	}
	if !waitMarked(d, "gone") {
		t.Fatal("pin removed: not reported")
	}
}

// TestQuietChecksAllOnceSettled: after two quiet spells in a row,
// everything is asked to be checked once, quietSettle after the last
// (the listener's own pause is tested in rtnl).
func TestQuietChecksAllOnceSettled(t *testing.T) {
	nstest.RequireRoot(t)
	rd := nstest.RunDir(t)
	d := runningDriftWatch(t, rd.Path)
	d.quiet()()
	resume := d.quiet()
	start := time.Now()
	resume()
	for {
		select {
		case <-d.notify:
		case <-time.After(2 * quietSettle):
			t.Fatal("no check asked after the quiet spells")
		}
		if _, all := d.take(); all {
			break
		}
	}
	if took := time.Since(start); took < quietSettle-100*time.Millisecond {
		t.Errorf("check asked %s after the last spell, want about %s", took, quietSettle)
	}
	select {
	case <-d.notify:
		if _, all := d.take(); all {
			t.Error("a second check asked: the first spell's was not cancelled")
		}
	case <-time.After(quietSettle + 500*time.Millisecond):
	}
}

// runningDriftWatch starts a watch of runDir, closed with the test.
func runningDriftWatch(t *testing.T, runDir string) *driftWatch {
	d, err := newDriftWatch(runDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); d.close() })
	go d.run(ctx)
	return d
}

func waitMarked(d *driftWatch, name string) bool {
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-d.notify:
		case <-time.After(100 * time.Millisecond):
		}
		p, _ := d.take()
		if p[name] {
			return true
		}
	}
	return false
}

func FuzzInotifyEvents(f *testing.F) {
	ev := make([]byte, unix.SizeofInotifyEvent+8)
	binary.NativeEndian.PutUint32(ev[12:16], 8)
	copy(ev[unix.SizeofInotifyEvent:], "bar-1\x00\x00\x00")
	f.Add(ev)
	f.Add([]byte{0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		d := &driftWatch{pending: map[string]bool{}, notify: make(chan struct{}, 1)}
		d.inotifyEvents(b)
		for n := range d.pending {
			if n == "" || len(n) > len(b) {
				t.Fatalf("bad name %q", n)
			}
		}
	})
}

// Names of a spec that runs processes go only to nodes that allow them;
// the names of other specs still go to every node, and balance moves no
// process-running name onto a node that refuses them.
func TestViewOfProcessesNeedPermission(t *testing.T) {
	snap := &Snapshot{
		Specs:     map[string]SpecMeta{"dhcp": {Processes: true}, "routers": {}},
		SpecOf:    map[string]string{"d-1": "dhcp", "d-2": "dhcp", "d-3": "dhcp", "d-4": "dhcp", "r-1": "routers", "r-2": "routers"},
		Nodes:     map[string]NodeInfo{"a": {AllowProcesses: true}, "b": {}},
		Status:    map[string]NodeStatus{},
		Cordons:   map[string]Cordon{},
		Assign:    map[string]Assignment{},
		AssignRev: map[string]int64{},
	}
	names := []string{"d-1", "d-2", "d-3", "d-4", "r-1", "r-2"}
	st := ViewOf(snap, names)
	if st.Nodes["a"].Cordoned || st.Nodes["b"].Cordoned {
		t.Fatal("a spec with processes cordons a node")
	}
	p := Schedule(st)
	got := applyPlan(st, p)
	if len(got["b"].Names) != 2 || got["b"].Names[0] != "r-1" || got["b"].Names[1] != "r-2" {
		t.Fatalf("b (refuses processes) holds %v, want the two routers", got["b"].Names)
	}
	// 4 to 2 is balanced as far as it can be: no d- name moves to b.
	st.Assign = got
	if p := Schedule(st); p.Changed() {
		t.Fatalf("balance moved a name that runs processes: %+v", p.Assign)
	}
	// A process-running name found on b (placed before b's agent
	// changed its mind) is released, then placed on a.
	st.Assign = map[string]Assignment{"a": {Names: []string{"d-1", "d-2", "d-3"}}, "b": {Names: []string{"d-4", "r-1", "r-2"}}}
	p = Schedule(st)
	if b := p.Assign["b"]; b == nil || len(b.Releasing) != 1 || b.Releasing[0] != "d-4" {
		t.Fatalf("b holding d-4: plan %+v, want d-4 released", p.Assign)
	}
	st.Assign = applyPlan(st, p)
	if p := Schedule(st); p.Placed["a"] != 1 {
		t.Fatalf("d-4 released by b: placed %v, want on a", p.Placed)
	}
}
