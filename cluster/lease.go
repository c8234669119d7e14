package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/spec"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

type leaseEvent int

const (
	leaseFence leaseEvent = iota
	leaseRenewed
	leaseLost
	leaseFailsafe
)

// fenceMargin is how long before its lease can expire a node stops
// serving: enough to set every host veth down.
func (a *Agent) fenceMargin() time.Duration { return max(a.cfg.LeaseTTL/5, 500*time.Millisecond) }

// keepalive renews the lease every TTL/3 on its own clock. When the lease
// may expire within the fence margin (the last renewal acknowledged was
// sent more than TTL minus margin ago), it asks the peers (failsafe.go):
// if none of them reaches etcd either, it says failsafe and keeps asking
// them every retry, saying fence as soon as one reaches etcd or stops
// answering; otherwise it says fence at once. It says renewed when a
// renewal succeeds again, and lost when etcd says the lease is gone.
func (a *Agent) keepalive(ctx context.Context, lease clientv3.LeaseID, out chan<- leaseEvent) {
	ttl := a.cfg.LeaseTTL
	deadline := time.Now().Add(ttl)
	fenced, failsafe := false, false
	stopWork := func() {
		if stop := a.stopWork.Load(); stop != nil {
			(*stop)()
		}
	}
	fence := func() {
		fenced, failsafe = true, false
		a.fenced.Store(true)
		a.failsafe.Store(false)
		stopWork()
		out <- leaseFence
	}
	for ctx.Err() == nil {
		wait := ttl / 3
		if !fenced && !failsafe {
			wait = min(wait, time.Until(deadline.Add(-a.fenceMargin())))
		}
		if !fenced && !failsafe && wait <= 0 {
			// The watchdog fires half a margin later: the question must
			// be answered before then.
			if ok, why := a.failsafeHolds(ctx, a.fenceMargin()/4); ok {
				failsafe = true
				a.failsafe.Store(true)
				a.dog.extend(3 * failsafeRetry)
				stopWork()
				a.log.Warn("lease not renewed, but no peer reaches etcd either: failsafe, serving what is here, changing nothing", "why", why)
				out <- leaseFailsafe
			} else {
				a.log.Warn("lease not renewed; fencing", "why", why)
				fence()
			}
			continue
		}
		if failsafe {
			wait = failsafeRetry
			if ok, why := a.failsafeHolds(ctx, failsafeRetry); !ok {
				a.log.Warn("failsafe ends; fencing", "why", why)
				fence()
				continue
			}
			// Still nobody reaches etcd: the watchdog waits for the
			// next ask, not for the lease.
			a.dog.extend(3 * failsafeRetry)
		}
		sent := time.Now()
		kctx, cancel := context.WithTimeout(ctx, max(wait, 100*time.Millisecond))
		resp, err := a.renew(kctx, lease)
		cancel()
		switch {
		case err == nil:
			deadline = sent.Add(time.Duration(resp.TTL) * time.Second)
			a.renewed(sent, time.Duration(resp.TTL)*time.Second)
			// A renewal is answered by the leader alone, which may have
			// lost its quorum and not know it yet; a linearizable read
			// needs the quorum. Only that counts as reaching etcd for the
			// peers' failsafe question: nobody can take over without it.
			rctx, rcancel := context.WithTimeout(ctx, min(ttl/3, time.Second))
			if _, err := a.cli.Get(rctx, KeySchema); err == nil {
				a.lastQuorum.Store(sent.UnixNano())
			}
			rcancel()
			if fenced || failsafe {
				fenced, failsafe = false, false
				a.failsafe.Store(false)
				out <- leaseRenewed
			}
			sleep(ctx, time.Until(sent.Add(ttl/3)))
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			a.failsafe.Store(false)
			out <- leaseLost
			return
		default:
			if ctx.Err() == nil {
				a.cfg.Metrics.etcdError()
			}
			if !failsafe {
				sleep(ctx, min(200*time.Millisecond, time.Until(deadline.Add(-a.fenceMargin()))))
			}
		}
	}
}

// renew renews the lease once, through every renewer at once when there
// are several (AgentConfig.Renewers): the first success counts, and so
// does the first "lease not found" (the leader's word).
func (a *Agent) renew(ctx context.Context, lease clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	if len(a.cfg.Renewers) == 0 {
		return a.cli.KeepAliveOnce(ctx, lease)
	}
	type answer struct {
		resp *clientv3.LeaseKeepAliveResponse
		err  error
	}
	answers := make(chan answer, len(a.cfg.Renewers))
	for _, c := range a.cfg.Renewers {
		go func() {
			resp, err := c.KeepAliveOnce(ctx, lease)
			answers <- answer{resp, err}
		}()
	}
	var last error
	for range a.cfg.Renewers {
		ans := <-answers
		if ans.err == nil || errors.Is(ans.err, rpctypes.ErrLeaseNotFound) {
			return ans.resp, ans.err
		}
		last = ans.err
	}
	return nil, last
}

// renewed records a renewal sent at sent that etcd acknowledged with ttl
// left: the new fence point (the earliest expiry minus the fence margin),
// and the watchdog's deadline, half a margin later: time enough for the
// agent to ask its peers at the fence point and, in failsafe, extend it
// (see keepalive), while a stopped agent is still fenced half a margin
// before its lease can expire.
func (a *Agent) renewed(sent time.Time, ttl time.Duration) {
	point := sent.Add(ttl - a.fenceMargin())
	a.fencePoint.Store(point.UnixNano())
	a.dog.extend(time.Until(point.Add(a.fenceMargin() / 2)))
}

// pastFencePoint reports whether the lease may expire within the fence
// margin by this agent's clock.
func (a *Agent) pastFencePoint() bool {
	return time.Now().UnixNano() > a.fencePoint.Load()
}

// failsafeRetry is how often a node in failsafe asks its peers and etcd
// again: the bound on how long it may serve after a peer reaches etcd.
const failsafeRetry = 300 * time.Millisecond

// failsafeHolds asks the peers whether this node may keep serving without
// its lease renewed. Only an agent with a peer address takes part.
func (a *Agent) failsafeHolds(ctx context.Context, timeout time.Duration) (bool, string) {
	if a.cfg.PeerAddr == "" {
		return false, "failsafe off (no --peer-addr)"
	}
	return a.askPeers(ctx, max(timeout, 100*time.Millisecond))
}

// fence stops serving before the lease can expire: no creation, and every
// host veth of the namespaces here set down, so that a namespace that the
// survivors re-create is never served twice; and every tunnel end, so
// that its links carry nothing either.
func (a *Agent) fence(ctx context.Context) {
	a.fenced.Store(true)
	a.cfg.Metrics.setFenced(true)
	start := time.Now()
	n, tunnels := 0, 0
	if c := a.desired.catalog; c != nil {
		pins, _ := a.kernel.pins()
		veths, links := servedEnds(c, pins)
		n = setHostVethsDown(veths)
		tunnels = fleet.TunnelsDown(a.cfg.RunDir, links)
	}
	// What was made to match is no longer served as the spec says (its
	// veths are down): every namespace is checked again once unfenced.
	a.held.applied = map[string]*spec.Namespace{}
	a.held.placed = map[string]string{}
	a.cfg.Metrics.setFailsafe(false)
	a.log.Warn("fenced: lease not renewed in time; host veths and tunnels set down, creating nothing", "veths_down", n, "tunnels_down", tunnels, "took", time.Since(start))
	a.putStatus(ctx, func(s *NodeStatus) { s.Fenced = true })
}
