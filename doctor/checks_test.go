package doctor

import (
	"strings"
	"testing"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
)

// These tests build an Environment by hand: the checks are pure functions
// of it, so they need neither root nor a particular machine.

func fakeEnv() *Environment {
	return &Environment{
		RunDir:          &netns.RunDir{Path: "/run/netns"},
		RunDirExists:    true,
		RunDirState:     netns.MountState{IsMountPoint: true, Propagation: "shared", Parent: "/run", ParentProp: "shared"},
		NetNS:           map[uint64]*Holder{},
		MountNamespaces: map[uint64]int{1: 1},
	}
}

func severities(fs []Finding) []Severity {
	var out []Severity
	for _, f := range fs {
		out = append(out, f.Severity)
	}
	return out
}

func TestCheckRunDirGrades(t *testing.T) {
	e := fakeEnv()
	if f := checkRunDir(e); f[0].Severity != OK {
		t.Errorf("shared mount point: %+v", f)
	}
	e.RunDirState = netns.MountState{Parent: "/run", ParentProp: "shared"}
	if f := checkRunDir(e); f[0].Severity != Warn || f[0].Source == "" {
		t.Errorf("not a mount point: %+v", f)
	}
	e.RunDirState = netns.MountState{IsMountPoint: true, Propagation: "private"}
	if f := checkRunDir(e); f[0].Severity != Info {
		t.Errorf("private: %+v", f)
	}
	e.RunDirExists = false
	if f := checkRunDir(e); f[0].Severity != Info || !strings.Contains(f[0].Summary, "does not exist") {
		t.Errorf("missing: %+v", f)
	}
}

func TestCheckPinsFindsStaleStackedAndDouble(t *testing.T) {
	e := fakeEnv()
	e.Pins = []netns.PinInfo{
		{Name: "ok", Mounted: true, Inode: 10, Mounts: 1},
		{Name: "stale"},
		{Name: "stacked", Mounted: true, Inode: 11, Mounts: 3},
		{Name: "twin-a", Mounted: true, Inode: 12, Mounts: 1},
		{Name: "twin-b", Mounted: true, Inode: 12, Mounts: 1},
		{Name: "link", Symlink: true},
	}
	fs := checkPins(e)
	var all string
	for _, f := range fs {
		all += f.Summary + " " + strings.Join(f.Evidence, " ") + "\n"
	}
	for _, want := range []string{"symbolic link", "1 stale pin file", "stacked (3 mounts)", "pinned as twin-a and twin-b"} {
		if !strings.Contains(all, want) {
			t.Errorf("findings lack %q:\n%s", want, all)
		}
	}
	e.Pins = e.Pins[:1]
	if fs := checkPins(e); len(fs) != 1 || fs[0].Severity != OK {
		t.Errorf("clean run dir: %+v", fs)
	}
}

func TestCheckHeadroomAgainstTheLimit(t *testing.T) {
	e := fakeEnv()
	e.MaxNetNamespaces = 100
	for i := uint64(0); i < 85; i++ {
		e.NetNS[i] = &Holder{Pins: []string{"/run/netns/x"}}
	}
	if f := checkHeadroom(e); f[0].Severity != Warn {
		t.Errorf("85 of 100: %v", severities(f))
	}
	for i := uint64(85); i < 96; i++ {
		e.NetNS[i] = &Holder{Procs: []int{1}}
	}
	if f := checkHeadroom(e); f[0].Severity != Fail {
		t.Errorf("96 of 100: %v", severities(f))
	}
	e.NetNS[1000] = &Holder{FDs: []int{42}, FDsComms: []string{"holder"}}
	fs := checkHeadroom(e)
	if len(fs) != 2 || !strings.Contains(strings.Join(fs[1].Evidence, ""), "pid 42 (holder)") {
		t.Errorf("a namespace held by a descriptor only: %+v", fs)
	}
}

func TestCheckMountsReceivers(t *testing.T) {
	e := fakeEnv()
	e.MountMax = 100
	e.Mounts = make([]netns.Mount, 10)
	if f := checkMounts(e); f[0].Severity != OK || f[1].Severity != OK {
		t.Errorf("quiet machine: %v", severities(f))
	}
	for i := 0; i < 60; i++ {
		e.Receivers = append(e.Receivers, 1)
	}
	if f := checkMounts(e); f[1].Severity != Warn {
		t.Errorf("60 receiving mount namespaces: %v", severities(f))
	}
	e.Mounts = make([]netns.Mount, 99)
	if f := checkMounts(e); f[0].Severity != Fail {
		t.Errorf("99 of 100 mounts: %v", severities(f))
	}
}

func TestCheckKernelOffloadedRCU(t *testing.T) {
	e := fakeEnv()
	if f := checkKernel(e); f[0].Severity != Info || !strings.Contains(f[0].Summary, "not available") {
		t.Errorf("no config: %+v", f[0])
	}
	e.KernelConfig = map[string]string{"CONFIG_RCU_NOCB_CPU": "y"}
	e.Cmdline = "ro rcu_nocbs=all"
	if f := checkKernel(e); f[0].Severity != Warn || f[0].Source != report000 {
		t.Errorf("all CPUs offloaded: %+v", f[0])
	}
	e.RCUNormal = "1"
	e.DevconfInherit = "1"
	fs := checkKernel(e)
	if fs[1].Severity != Info || fs[2].Severity != Info {
		t.Errorf("rcu_normal=1 and devconf_inherit_init_net=1: %v", severities(fs))
	}
}

func TestCheckNeighAndBridges(t *testing.T) {
	e := fakeEnv()
	e.GcThresh3 = 10
	for i := 0; i < 12; i++ {
		e.Links = append(e.Links, rtnl.Link{Type: "veth", PeerNsID: i, PeerElsewhere: true, Index: 100 + i})
	}
	if f := checkNeigh(e); f[0].Severity != Warn {
		t.Errorf("12 host veths over gc_thresh3 10: %v", severities(f))
	}
	e.Links = append(e.Links, rtnl.Link{Type: "bridge", Index: 1, Name: "br0"})
	for i := 0; i < 1023; i++ {
		e.Links = append(e.Links, rtnl.Link{Type: "veth", Index: 1000 + i, Master: 1, PeerNsID: -1})
	}
	if f := checkBridges(e); f[0].Severity != Fail || !strings.Contains(f[0].Summary, "br0 has 1023 ports") {
		t.Errorf("a full bridge: %+v", f)
	}
}
