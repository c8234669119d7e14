package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/process"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// nodeKernel is the kernel work an agent's decisions call for.
type nodeKernel interface {
	// pins lists nsfleet's run dir.
	pins() ([]string, error)
	// teardown removes the named namespaces and waits for the kernel.
	teardown(ctx context.Context, names []string, each func(fleet.Result)) error
	// up brings f's namespaces to their spec; prev says what each was made
	// to match before, for what the spec no longer asks.
	// tun carries the links whose other end another node serves.
	up(ctx context.Context, f *spec.Fleet, prev map[string]*spec.Namespace, tun *fleet.Tunnel, each func(fleet.Result)) (fleet.Summary, error)
}

// engine is the nodeKernel of `nsfleet up` and `nsfleet down`.
type engine struct {
	rd      *netns.RunDir
	workers int
	log     *slog.Logger
}

// pins reads the run dir's names only: their mount state is the engine's
// to read, for the few it is handed (mountinfo holds every pin of the
// machine).
func (e *engine) pins() ([]string, error) { return e.rd.Names() }

func (e *engine) teardown(ctx context.Context, names []string, each func(fleet.Result)) error {
	opts := fleet.Options{RunDir: e.rd, Workers: e.workers, Log: e.log, OnResult: each}
	_, err := fleet.Down(ctx, fleet.Selector{Names: names}, fleet.DownOptions{Options: opts, Wait: true, Timeout: 10 * time.Second})
	return err
}

func (e *engine) up(ctx context.Context, f *spec.Fleet, prev map[string]*spec.Namespace, tun *fleet.Tunnel, each func(fleet.Result)) (fleet.Summary, error) {
	opts := fleet.UpOptions{Options: fleet.Options{RunDir: e.rd, Workers: e.workers, Log: e.log, OnResult: each}, Tunnel: tun}
	if len(prev) > 0 {
		opts.Previous = func(name string) *spec.Namespace { return prev[name] }
	}
	return fleet.Up(ctx, f, opts)
}

// observe gathers what Decide needs.
func (a *Agent) observe(t Trigger) Observation {
	d := &a.desired
	o := Observation{
		Assigned: d.assign.Names, AssignErr: d.assignErr(),
		AllowProcesses: a.cfg.AllowProcesses, Fenced: a.fenced.Load() || a.failsafe.Load() || a.pastFencePoint(),
		Foreign: a.held.foreign, Served: a.held.served, Applied: a.held.applied,
		Placed: a.held.placed, Tunnels: a.desired.tunnelList(),
	}
	if d.catalog != nil {
		o.Fleet = d.catalog
		o.SpecErr = d.catalog.errs(d.assign.Names)
	}
	o.Pins, o.PinsErr = a.kernel.pins()
	if t == OnDrift {
		o.Drifted, o.AllDrifted = a.drift.take()
	}
	return o
}

// failures keeps the count and the first few errors of one reconcile.
type failures struct {
	n    int
	errs []string
}

func (f *failures) note(err error) {
	f.n++
	if len(f.errs) < 5 {
		f.errs = append(f.errs, err.Error())
	}
}

// reconcile decides for trigger t and carries the decision out.
func (a *Agent) reconcile(ctx context.Context, t Trigger) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.stopWork.Store(&cancel)
	defer a.stopWork.Store(nil)
	o := a.observe(t)
	dec := Decide(t, o)
	if dec.Idle {
		return
	}
	start := time.Now()
	var fail failures
	if o.PinsErr != nil {
		fail.note(o.PinsErr)
	}
	teardownOK := a.teardown(ctx, dec.Teardown, &fail)
	if t == OnWithdraw {
		return
	}
	a.bringUp(ctx, dec, &fail)
	a.sup.keep(a, dec.Supervise)
	served, links := servedEnds(a.desired.catalog, dec.Want)
	a.servedVeths.Store(&served)
	a.dog.setVeths(served)
	a.dog.setTunnels(links)
	for n := range a.held.applied {
		if !isIn(dec.Want, n) {
			delete(a.held.applied, n)
		}
	}
	p := Measure(o, dec, teardownOK)
	a.cfg.Metrics.counts(p.Want, p.Ready)
	a.cfg.Metrics.reconciled(time.Since(start).Seconds())
	for _, err := range []error{o.SpecErr, o.AssignErr} {
		if err != nil {
			fail.note(err)
		}
	}
	rev := a.desired.rev
	a.putStatus(ctx, func(s *NodeStatus) {
		if p.Converged {
			s.AssignRev, s.SpecRev = rev, rev
		}
		s.Assigned, s.Ready, s.Failed, s.Errors = p.Want, p.Ready, fail.n, fail.errs
		s.Fenced, s.Refused = false, dec.Refused
	})
}

// teardown removes names; it reports whether all of them are gone.
func (a *Agent) teardown(ctx context.Context, names []string, fail *failures) bool {
	if len(names) == 0 {
		return true
	}
	if len(names) >= bulkThreshold {
		defer a.drift.quiet()()
	}
	start := time.Now()
	ok, deleted := true, 0
	err := a.kernel.teardown(ctx, names, func(r fleet.Result) {
		delete(a.held.applied, r.Name)
		delete(a.held.placed, r.Name)
		switch {
		case r.Action == fleet.Skipped:
			a.held.foreign[r.Name] = true
		case r.Err != nil:
			fail.note(r.Err)
			ok = false
		case r.Action == fleet.Deleted:
			deleted++
		}
	})
	if err != nil {
		fail.note(err)
		ok = false
	}
	a.log.Info("tore down", "namespaces", deleted, "took", time.Since(start).Round(time.Millisecond))
	return ok
}

// bringUp hands the decision's Up namespaces to the engine and records
// what each now matches.
func (a *Agent) bringUp(ctx context.Context, dec Decision, fail *failures) {
	if len(dec.Up) == 0 {
		return
	}
	cat := a.desired.catalog
	news := 0
	for _, n := range dec.Up {
		if _, ok := a.held.applied[n]; !ok {
			news++
		}
	}
	if news >= bulkThreshold {
		defer a.drift.quiet()()
	}
	// A large bring-up without links gives way to a change (preempt.go).
	// Links are left out: their namespaces are tallied only after the
	// links' phase, which a bring-up that gave way would not reach.
	var pre *preemption
	var reached map[string]bool // with pre: what the engine reported on
	if len(dec.Up) >= preemptMin && len(dec.Places) == 0 && a.drift != nil {
		pre, reached = newPreemption(ctx), map[string]bool{}
		defer pre.cancel()
		ctx = pre.ctx
		a.preempt.Store(pre)
		defer a.preempt.Store(nil)
	}
	start := time.Now()
	sum, err := a.kernel.up(ctx, cat.subset(dec.Up), dec.Previous, a.tunnel(dec.Want), func(r fleet.Result) {
		if pre != nil {
			reached[r.Name] = true
		}
		switch {
		case r.Err != nil || r.Action == fleet.Failed:
			delete(a.held.applied, r.Name)
			delete(a.held.placed, r.Name)
			if r.Err != nil {
				fail.note(r.Err)
			}
		case r.Action == fleet.Skipped:
			delete(a.held.applied, r.Name)
			a.held.foreign[r.Name] = true
		default:
			// The catalog's own value: while it is not replaced, Decide
			// compares it with itself in O(1).
			a.held.applied[r.Name], _ = cat.Lookup(r.Name)
			if p, ok := dec.Places[r.Name]; ok {
				a.held.placed[r.Name] = p
			}
		}
	})
	if pre != nil && pre.fired.Load() {
		var rest []string
		for _, n := range dec.Up {
			if !reached[n] {
				rest = append(rest, n)
			}
		}
		a.drift.requeue(rest)
		a.log.Info("gave way to a change", "done", len(reached), "left", len(rest), "after", time.Since(start).Round(time.Millisecond))
		err = nil // not a failure: the rest comes next
	}
	if err != nil {
		fail.note(err)
	}
	if n := sum.Counts[fleet.Created] + sum.Counts[fleet.Repaired]; n > 0 || fail.n > 0 {
		a.log.Info("reconciled", "created", sum.Counts[fleet.Created], "repaired", sum.Counts[fleet.Repaired],
			"changed", len(dec.Previous), "failed", sum.Counts[fleet.Failed]+sum.Counts[fleet.Skipped],
			"took", time.Since(start).Round(time.Millisecond))
	}
}

// tunnel says how this node makes the ends of links whose other
// namespace is not among want (served elsewhere).
func (a *Agent) tunnel(want []string) *fleet.Tunnel {
	if !a.cfg.TunnelAddr.IsValid() {
		return nil
	}
	return &fleet.Tunnel{Remote: func(n string) bool { return !isIn(want, n) },
		Local: a.cfg.TunnelAddr, Peers: a.desired.tunnelPeers(), Port: a.cfg.TunnelPort, MTU: a.cfg.TunnelMTU}
}

// servedEnds lists what a fence sets down for the named namespaces, in
// one walk: their host veths, and their link ends' interfaces by
// namespace (those that are tunnel ends go down).
func servedEnds(c Catalog, names []string) (veths []string, links map[string][]string) {
	links = map[string][]string{}
	for _, n := range names {
		ns, ok := c.Lookup(n)
		if !ok {
			continue
		}
		for _, v := range ns.Veths {
			veths = append(veths, v.Host)
		}
		for i := range ns.Links {
			mine, _ := ns.Links[i].Ends(n)
			links[n] = append(links[n], mine.Interface)
		}
	}
	return veths, links
}

// putStatus updates this node's status key (bound to its lease). A put
// that fails (etcd unreachable for a moment) is tried again by the serve
// loop (statusStale) until one succeeds: otherwise the stored status would
// stay what it was before the outage until the next reconcile, minutes
// away, and cluster status and wait would not see the node converge.
func (a *Agent) putStatus(ctx context.Context, edit func(*NodeStatus)) {
	a.statusMu.Lock()
	edit(&a.status)
	a.status.Updated = time.Now().UTC()
	val := encode(a.status)
	a.statusMu.Unlock()
	rctx, cancel := a.rpc(ctx)
	defer cancel()
	_, err := a.cli.Put(rctx, StatusKey(a.cfg.Node), val, clientv3.WithLease(a.lease))
	a.statusStale.Store(err != nil)
	if err != nil && ctx.Err() == nil {
		a.cfg.Metrics.etcdError()
		a.log.Debug("status", "err", err)
	}
}

// learnAll maps, besides the host names, each existing namespace's id
// through one dump of the host's links: once, when the agent starts and
// finds namespaces made before it (a dump costs a lookup over every
// namespace id per host veth, so it is not repeated).
func (a *Agent) learnAll() {
	hostOf := a.learnHosts(a.desired.assign.Names)
	if len(hostOf) == 0 {
		return
	}
	c, err := rtnl.OpenLite()
	if err != nil {
		return
	}
	defer c.Close()
	links, err := c.Links()
	if err != nil {
		return
	}
	for _, l := range links {
		if ns, ok := hostOf[l.Name]; ok && l.PeerNsID >= 0 {
			a.drift.learn(ns, nil, int32(l.PeerNsID))
		}
	}
}

// supervision keeps the processes of the namespaces assigned here running,
// with the supervisor of `nsfleet supervise`. It lives as long as the
// agent's Run (ctx), not as long as one reconcile, and is restarted only
// when what it must watch changes: the names, or their processes.
type supervision struct {
	ctx    context.Context
	key    string
	cancel context.CancelFunc
	done   chan struct{}
}

// keep makes the supervisor watch exactly names (none: no supervisor).
func (s *supervision) keep(a *Agent, names []string) {
	if len(names) == 0 || s.ctx == nil {
		s.stop()
		return
	}
	sub := a.desired.catalog.subset(names)
	key := supervisionKey(sub)
	if key == s.key && s.done != nil {
		select {
		case <-s.done: // ended on its own (an error): start it again
		default:
			return
		}
	}
	s.stop()
	sctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	s.key, s.cancel, s.done = key, cancel, done
	rd, log := a.cfg.RunDir, a.log
	go func() {
		defer close(done)
		err := process.StoreFor(rd).Supervise(sctx, sub, rd, process.SuperviseOptions{Log: log})
		if err != nil && sctx.Err() == nil {
			log.Error("supervise", "err", err)
		}
	}()
}

// supervisionKey names what a supervisor watches: every namespace's name
// and processes, in order.
func supervisionKey(f *spec.Fleet) string {
	var b strings.Builder
	for i := range f.Namespaces {
		ns := &f.Namespaces[i]
		fmt.Fprintf(&b, "%s%v\n", ns.Name, ns.Processes)
	}
	return b.String()
}

func (s *supervision) stop() {
	if s.cancel != nil {
		s.cancel()
		<-s.done
		s.cancel, s.done, s.key = nil, nil, ""
	}
}
