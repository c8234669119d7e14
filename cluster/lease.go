package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

type leaseEvent int

const (
	leaseFence leaseEvent = iota
	leaseRenewed
	leaseLost
)

// fenceMargin is how long before its lease can expire a node stops
// serving: enough to set every host veth down.
func (a *Agent) fenceMargin() time.Duration { return max(a.cfg.LeaseTTL/5, 500*time.Millisecond) }

// keepalive renews the lease every TTL/3 on its own clock. It says fence
// when the lease may expire within the fence margin (the last renewal
// acknowledged was sent more than TTL minus margin ago), renewed when a
// renewal succeeds again, and lost when etcd says the lease is gone.
func (a *Agent) keepalive(ctx context.Context, lease clientv3.LeaseID, out chan<- leaseEvent) {
	ttl := a.cfg.LeaseTTL
	deadline := time.Now().Add(ttl)
	fenced := false
	for ctx.Err() == nil {
		wait := ttl / 3
		if !fenced {
			wait = min(wait, time.Until(deadline.Add(-a.fenceMargin())))
		}
		if !fenced && wait <= 0 {
			fenced = true
			a.fenced.Store(true)
			if stop := a.stopWork.Load(); stop != nil {
				(*stop)()
			}
			out <- leaseFence
			continue
		}
		sent := time.Now()
		kctx, cancel := context.WithTimeout(ctx, max(wait, 100*time.Millisecond))
		resp, err := a.cli.KeepAliveOnce(kctx, lease)
		cancel()
		switch {
		case err == nil:
			deadline = sent.Add(time.Duration(resp.TTL) * time.Second)
			if fenced {
				fenced = false
				out <- leaseRenewed
			}
			sleep(ctx, time.Until(sent.Add(ttl/3)))
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			out <- leaseLost
			return
		default:
			if ctx.Err() == nil {
				a.cfg.Metrics.etcdError()
			}
			sleep(ctx, min(200*time.Millisecond, time.Until(deadline.Add(-a.fenceMargin()))))
		}
	}
}

// fence stops serving before the lease can expire: no creation, and every
// host veth of the namespaces here set down, so that a namespace that the
// survivors re-create is never served twice.
func (a *Agent) fence(ctx context.Context) {
	a.fenced.Store(true)
	a.cfg.Metrics.setFenced(true)
	start := time.Now()
	n := 0
	if fl := a.desired.fleet; fl != nil {
		pins, _ := a.cfg.RunDir.List()
		if host, err := rtnl.OpenLite(); err == nil {
			for _, p := range pins {
				ns, ok := fl.Lookup(p.Name)
				if !ok {
					continue
				}
				for _, v := range ns.Veths {
					if l, err := host.LinkByName(v.Host); err == nil && l.Up {
						if host.SetUp(l.Index, false) == nil {
							n++
						}
					}
				}
			}
			host.Close()
		}
	}
	// What was made to match is no longer served as the spec says (its
	// veths are down): every namespace is checked again once unfenced.
	a.held.applied = map[string]*spec.Namespace{}
	a.log.Warn("fenced: lease not renewed in time; host veths set down, creating nothing", "veths_down", n, "took", time.Since(start))
	a.putStatus(ctx, func(s *NodeStatus) { s.Fenced = true })
}
