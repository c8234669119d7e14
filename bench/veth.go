package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
)

// veth reproduces thread 002 (docs/BACKGROUND.md): creating thousands of veth pairs,
// timed every mark, with explicit vs kernel-chosen names, the peer created
// in its namespace vs created beside and moved, the kernel's default queue
// count vs one queue, and deleting them one by one vs by namespace exit.
//
// It works between two throwaway namespaces ("host" A and "peer" B), so
// none of its links ever appears in nsfleet's own namespace.
type veth struct{}

func init() {
	register(&Scenario{
		Name:     "veth",
		Describe: "thread 002: N veth pairs, pairs/s per mark; names, peer placement, queues; delete one by one vs namespace exit",
		N:        2000,
		Mark:     100,
		Engines:  []string{"native"},
		Variants: []string{"explicit", "kernel-names", "peer-moved", "default-queues"},
		Keys:     []string{"variant"},
		Run:      veth{}.Run,
	})
}

func (v veth) Run(ctx context.Context, o Options, run *Run) error {
	variants := o.Variants
	run.Notes = append(run.Notes,
		"explicit: names given, peer created inside B, one queue per end (what nsfleet does)",
		"default-queues: as explicit but with the kernel's queue count, like ip link add (veth then cuts it to 1, waiting for grace periods)",
		"delete metrics are measured after the explicit variant: one RTM_DELLINK per pair, vs dropping B and waiting until A's ends are gone")
	for _, variant := range variants {
		for rep := 0; rep < o.Runs; rep++ {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			cfg := map[string]string{"variant": variant}
			o.Log.Info("run", "variant", variant, "rep", rep+1)
			if err := v.once(ctx, o, cfg, rep, run); err != nil {
				return fmt.Errorf("variant=%s: %w", variant, err)
			}
		}
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
	variant := cfg["variant"]
	last := time.Now()
	for i := 1; i <= o.N; i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
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
			if err := c.MoveLink(l.Index, b.Fd()); err != nil {
				return err
			}
		}
		if i%o.Mark == 0 {
			now := time.Now()
			run.Samples = append(run.Samples, Sample{Config: cfg, Mark: i, Metric: "create rate", Unit: "pairs/s", Better: "higher", Rep: rep, Value: float64(o.Mark) / now.Sub(last).Seconds()})
			last = now
			if o.Progress != nil {
				o.Progress(ConfigKey(cfg, run.Keys), rep, i, o.N)
			}
		}
	}
	if variant != "explicit" {
		return nil // the namespaces go when a and b are closed
	}
	// Deleting: the first half one by one, the second half by dropping B.
	links, err := c.Links()
	if err != nil {
		return err
	}
	var idx []int
	for _, l := range links {
		if l.Type == "veth" {
			idx = append(idx, l.Index)
		}
	}
	half := len(idx) / 2
	start := time.Now()
	for k := 0; k < half; k++ {
		if err := c.DeleteLink(idx[k]); err != nil {
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
