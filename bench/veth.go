package bench

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
)

// veth reproduces report 002 (docs/BACKGROUND.md): creating thousands of veth pairs,
// timed every mark, with explicit vs kernel-chosen names, the peer created
// in its namespace vs created beside and moved, the kernel's default queue
// count vs one queue, and deleting them one by one vs by namespace exit.
// The report's own method is the iproute2 engine (one `ip link add type
// veth` process per pair, then one `ip link del` per pair, cumulative
// times as the report's table has them), and the dummy device is the
// control the report's reply asked for.
//
// It works between two throwaway namespaces ("host" A and "peer" B), so
// none of its links ever appears in nsfleet's own namespace; the iproute2
// engine's processes run inside A.
type veth struct{}

func init() {
	register(&Scenario{
		Name:     "veth",
		Describe: "report 002: N veth pairs, pairs/s and cumulative s per mark; names, peer placement, queues, dummy control; ip's loop as an engine",
		N:        2000,
		Mark:     100,
		Engines:  []string{"native", "iproute2", "netlink"},
		Variants: []string{"explicit", "kernel-names", "peer-moved", "default-queues", "dummy"},
		Keys:     []string{"engine", "variant"},
		Run:      veth{}.Run,
	})
}

// vethIproute2 are the variants the report's shell loop has a form for.
var vethIproute2 = map[string]bool{"kernel-names": true, "dummy": true}

// vethNetlink are the variants vishvananda/netlink can express (LinkAdd
// always sends a name, so the kernel cannot choose one).
var vethNetlink = map[string]bool{"explicit": true, "peer-moved": true, "default-queues": true, "dummy": true}

func (v veth) Run(ctx context.Context, o Options, run *Run) error {
	run.Notes = append(run.Notes,
		"explicit: names given, peer created inside B, one queue per end (what nsfleet does)",
		"default-queues: as explicit but with the kernel's queue count, like ip link add (veth then cuts it to 1, waiting for grace periods)",
		"delete metrics of explicit: one RTM_DELLINK per pair for half, then dropping B for the rest; kernel-names and dummy delete all one by one, as the report did",
		"engine=iproute2 is the report's loop: one `ip link add type veth` (or `type dummy`) process per device inside A, then one `ip link del` each",
		"engine=netlink: vishvananda/netlink's LinkAdd (Veth with PeerNamespace; LinkSetNsFd for peer-moved; NumTxQueues/NumRxQueues 1 except default-queues) and LinkDel, on a handle in A")
	dummyOK := ""
	for _, eng := range o.Engines {
		if why := engineMissing(eng); why != "" {
			run.Skipped = append(run.Skipped, "engine="+eng+": "+why)
			continue
		}
		for _, variant := range o.Variants {
			cfg := map[string]string{"engine": eng, "variant": variant}
			if eng == "iproute2" && !vethIproute2[variant] {
				run.Skipped = append(run.Skipped, ConfigKey(cfg, run.Keys)+": the report's loop has no such form (only kernel-names and dummy)")
				continue
			}
			if eng == "netlink" && !vethNetlink[variant] {
				run.Skipped = append(run.Skipped, ConfigKey(cfg, run.Keys)+": vishvananda/netlink always names the devices")
				continue
			}
			if variant == "dummy" {
				if dummyOK == "" {
					dummyOK = dummySupported()
				}
				if dummyOK != "yes" {
					run.Skipped = append(run.Skipped, ConfigKey(cfg, run.Keys)+": "+dummyOK)
					continue
				}
			}
			for rep := 0; rep < o.Runs; rep++ {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				o.Log.Info("run", "engine", eng, "variant", variant, "rep", rep+1)
				if err := v.once(ctx, o, cfg, rep, run); err != nil {
					return fmt.Errorf("%s: %w", ConfigKey(cfg, run.Keys), err)
				}
			}
		}
	}
	return nil
}

// dummySupported tries one dummy device in a throwaway namespace.
func dummySupported() string {
	ns, err := netns.Create(func(*netns.NS) error {
		c, err := rtnl.OpenLite()
		if err != nil {
			return err
		}
		defer c.Close()
		return c.AddDevice("dummy", "d0")
	})
	if err != nil {
		return "this kernel has no dummy device (CONFIG_DUMMY; try modprobe dummy): " + err.Error()
	}
	ns.Close()
	return "yes"
}

// ipIn runs ip(8) with args inside ns, as the report's loop ran it.
func ipIn(ns *netns.NS, args ...string) error {
	cmd := exec.Command("ip", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := netns.StartIn(cmd, ns, ""); err != nil {
		return err
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func (v veth) once(ctx context.Context, o Options, cfg map[string]string, rep int, run *Run) error {
	a, err := netns.Create(nil)
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := netns.Create(nil)
	if err != nil {
		return err
	}
	defer b.Close()
	var c *rtnl.Conn
	if err := netns.Do(a, func() error { c, err = rtnl.Open(); return err }); err != nil {
		return err
	}
	defer c.Close()
	variant, ip := cfg["variant"], cfg["engine"] == "iproute2"
	del := func(l rtnl.Link) error { return c.DeleteLink(l.Index) }
	var nl *netlink.Handle
	if cfg["engine"] == "netlink" {
		if nl, err = netlink.NewHandleAt(vnetns.NsHandle(a.Fd())); err != nil {
			return err
		}
		defer nl.Close()
		del = func(l rtnl.Link) error {
			return nl.LinkDel(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: l.Index, Name: l.Name}})
		}
	}
	kind := "veth"
	if variant == "dummy" {
		kind = "dummy"
	}
	sample := func(mark int, metric, unit, better string, value float64) {
		run.Samples = append(run.Samples, Sample{Config: cfg, Mark: mark, Metric: metric, Unit: unit, Better: better, Rep: rep, Value: value})
	}
	start := time.Now()
	last := start
	for i := 1; i <= o.N; i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch {
		case ip:
			if err := ipIn(a, "link", "add", "type", kind); err != nil {
				return err
			}
		case nl != nil:
			if err := netlinkPair(nl, b, variant, i); err != nil {
				return err
			}
		case variant == "dummy":
			if err := c.AddDevice("dummy", fmt.Sprintf("d%d", i)); err != nil {
				return err
			}
		default:
			if err := v.addPair(c, b, variant, i); err != nil {
				return err
			}
		}
		if i%o.Mark == 0 {
			now := time.Now()
			sample(i, "create rate", "pairs/s", "higher", float64(o.Mark)/now.Sub(last).Seconds())
			sample(i, "create (cumulative)", "s", "lower", now.Sub(start).Seconds())
			last = now
			if o.Progress != nil {
				o.Progress(ConfigKey(cfg, run.Keys), rep, i, o.N)
			}
		}
	}
	switch variant {
	case "explicit":
		return v.deleteHalfAndHalf(c, b, del, cfg, rep, run)
	case "kernel-names", "dummy":
		return v.deleteOneByOne(ctx, o, c, a, kind, ip, del, sample)
	}
	return nil // the namespaces go when a and b are closed
}

func (v veth) addPair(c *rtnl.Conn, b *netns.NS, variant string, i int) error {
	p := rtnl.VethPair{Host: fmt.Sprintf("h%d", i), Peer: fmt.Sprintf("p%d", i), PeerNsFd: b.Fd()}
	switch variant {
	case "kernel-names":
		p.Host, p.Peer = "", ""
	case "default-queues":
		p.Queues = -1
	case "peer-moved":
		p.PeerNsFd = -1
	}
	if err := c.AddVeth(p); err != nil {
		return err
	}
	if variant == "peer-moved" {
		l, err := c.LinkByName(p.Peer)
		if err != nil {
			return err
		}
		return c.MoveLink(l.Index, b.Fd())
	}
	return nil
}

// deleteOneByOne deletes every device of kind in A, oldest first, one
// request (or one ip process) each, timing the cumulative seconds at each
// mark as the report's table has them.
func (v veth) deleteOneByOne(ctx context.Context, o Options, c *rtnl.Conn, a *netns.NS, kind string, ip bool, del func(rtnl.Link) error, sample func(int, string, string, string, float64)) error {
	links, err := c.Links()
	if err != nil {
		return err
	}
	var devs []rtnl.Link
	for _, l := range links {
		if l.Type == kind && (kind != "veth" || l.PeerIndex < l.Index || l.PeerNsID >= 0) {
			devs = append(devs, l) // a pair counts once: by its first end
		}
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].Index < devs[j].Index })
	start := time.Now()
	for k, l := range devs {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if ip {
			err = ipIn(a, "link", "del", l.Name)
		} else {
			err = del(l)
		}
		if err != nil {
			return err
		}
		if n := k + 1; n%o.Mark == 0 {
			sample(n, "delete (cumulative)", "s", "lower", time.Since(start).Seconds())
		}
	}
	return nil
}

// deleteHalfAndHalf deletes the first half one by one and the rest by
// dropping B, whose exit takes its peers and so the pairs with it.
func (v veth) deleteHalfAndHalf(c *rtnl.Conn, b *netns.NS, del func(rtnl.Link) error, cfg map[string]string, rep int, run *Run) error {
	links, err := c.Links()
	if err != nil {
		return err
	}
	var idx []rtnl.Link
	for _, l := range links {
		if l.Type == "veth" {
			idx = append(idx, l)
		}
	}
	half := len(idx) / 2
	start := time.Now()
	for k := 0; k < half; k++ {
		if err := del(idx[k]); err != nil {
			return err
		}
	}
	if half > 0 {
		run.Samples = append(run.Samples, Sample{Config: cfg, Metric: "delete one by one", Unit: "pairs/s", Better: "higher", Rep: rep, Value: float64(half) / time.Since(start).Seconds()})
	}
	start = time.Now()
	b.Close()
	for {
		ls, err := c.Links()
		if err != nil {
			return err
		}
		left := 0
		for _, l := range ls {
			if l.Type == "veth" {
				left++
			}
		}
		if left == 0 {
			break
		}
		if time.Since(start) > 2*time.Minute {
			return fmt.Errorf("%d veths still there 2 minutes after their namespace was dropped", left)
		}
		time.Sleep(5 * time.Millisecond)
	}
	run.Samples = append(run.Samples, Sample{Config: cfg, Metric: "delete by namespace exit", Unit: "pairs/s", Better: "higher", Rep: rep, Value: float64(len(idx)-half) / time.Since(start).Seconds()})
	return nil
}
