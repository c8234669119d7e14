package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
)

// driftListener measures what a node's agent costs the fleet being made on
// it. The agent hears drift on one netlink socket that listens to every
// namespace with an id on the node (NETLINK_LISTEN_ALL_NSID); the kernel
// looks up, for each such socket, the namespace id of every notification
// of another namespace, in the creating thread's context, and a Neutron
// router announces about 47 (docs/PERFORMANCE.md). The scenario makes
// Neutron-shaped routers with nsfleet's engine
// beside a listener that reads everything, the agent's filtered one, and
// none, and the filtered one paused while the routers are made and
// removed, interleaved in each repetition.
type driftListener struct{}

func init() {
	register(&Scenario{
		Name:     "drift-listener",
		Describe: "fake routers made beside an agent's drift listener: none, unfiltered (all notifications), filtered (only what can be drift), paused (left its groups while making, as the agent does for many)",
		N:        1000,
		Mark:     250,
		Engines:  []string{"native"},
		Variants: []string{"none", "unfiltered", "filtered", "paused"},
		Keys:     []string{"engine", "variant"},
		Run:      driftListener{}.Run,
	})
}

func (d driftListener) Run(ctx context.Context, o Options, run *Run) error {
	fl, err := d.spec(o)
	if err != nil {
		return err
	}
	run.Notes = append(run.Notes,
		"every router: a Neutron router (netns, lo up, ip_forward, qr- and qg- pairs up with an address inside each, a default route), made by nsfleet's engine",
		"the listener is a goroutine of this process reading as the agent does (poll, then every queued message); 'notifications/router' counts what it was handed")
	for rep := 0; rep < o.Runs; rep++ {
		// Each repetition starts at the next variant: none always follows
		// the same one (the kernel may still be freeing its namespaces).
		for i := range o.Variants {
			v := o.Variants[(i+rep)%len(o.Variants)]
			if ctx.Err() != nil {
				return ctx.Err()
			}
			cfg := map[string]string{"engine": "native", "variant": v}
			o.Log.Info("run", "variant", v, "rep", rep+1, "of", o.Runs)
			if err := d.once(ctx, o, fl, cfg, rep, run); err != nil {
				return fmt.Errorf("%s: %w", ConfigKey(cfg, run.Keys), err)
			}
		}
	}
	return nil
}

// spec is scripts/neutron-spec.sh -t's router without the host end's
// address: a bench must not put addresses or routes in the host.
func (d driftListener) spec(o Options) (*spec.Fleet, error) {
	y := fmt.Sprintf(`namespaces:
  - name: "%[1]sr{i}"
    count: %[2]d
    sysctls: {net.ipv4.ip_forward: "1"}
    veths:
      - {host: "%[1]so{i}", peer: "qr-in", up: true, host_ipv6: false, peer_addresses: ["10.{i/256}.{i%%256}.2/30"]}
      - {host: "%[1]sg{i}", peer: "qg-in", up: true, host_ipv6: false, peer_addresses: ["100.{i/65536+64}.{i/256%%256}.{i%%256}/10"]}
    routes:
      - {to: default, via: 100.64.0.1}
`, o.Prefix, o.N)
	return spec.Parse("drift-listener", []byte(y), spec.Options{})
}

func (d driftListener) once(ctx context.Context, o Options, fl *spec.Fleet, cfg map[string]string, rep int, run *Run) error {
	var open func() (*rtnl.Listener, error)
	switch cfg["variant"] {
	case "unfiltered":
		open = rtnl.ListenUnfiltered
	case "filtered", "paused":
		open = rtnl.Listen
	}
	if open == nil {
		return upNative(ctx, o, fl, cfg, rep, run)
	}
	l, err := open()
	if err != nil {
		return err
	}
	defer l.Close()
	var heard, overruns atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		fds := []unix.PollFd{{Fd: int32(l.Fd()), Events: unix.POLLIN}}
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := unix.Poll(fds, 100)
			if err != nil && !errors.Is(err, unix.EINTR) {
				return
			}
			if n > 0 && l.Read(func(rtnl.Event) { heard.Add(1) }) {
				overruns.Add(1)
			}
		}
	}()
	if cfg["variant"] == "paused" {
		if err := l.Pause(); err != nil {
			return err
		}
	}
	err = upNative(ctx, o, fl, cfg, rep, run)
	close(stop)
	wg.Wait()
	if err != nil {
		return err
	}
	// Up and down both: what the listener was handed over the whole run.
	run.Samples = append(run.Samples, Sample{Config: cfg, Metric: "notifications/router", Unit: "msgs", Better: "lower", Rep: rep, Value: float64(heard.Load()) / float64(o.N)})
	if n := overruns.Load(); n > 0 {
		run.Notes = append(run.Notes, fmt.Sprintf("%s rep %d: the listener's queue overran %d times (notifications lost)", ConfigKey(cfg, run.Keys), rep+1, n))
	}
	return nil
}
