package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/proc"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// AgentConfig configures one node's agent.
type AgentConfig struct {
	Node           string
	Client         *clientv3.Client
	RunDir         *netns.RunDir // locked by the caller for the agent's lifetime
	LeaseTTL       time.Duration // 0: 5 s
	Capacity       int           // most namespaces this node takes; 0: no limit
	AllowProcesses bool          // serve specs that run processes
	Resync         time.Duration // full reconcile period; 0: 5 min
	Workers        int
	Log            *slog.Logger
	Metrics        *Metrics
	Version        string
}

// Agent makes one node serve what the cluster assigns to it. Its threading
// contract is fleet's: namespace work happens in fleet's workers; the
// agent's own goroutines never change namespace.
type Agent struct {
	cfg   AgentConfig
	cli   *clientv3.Client
	log   *slog.Logger
	drift *driftWatch

	lease clientv3.LeaseID
	// stopWork cancels the reconcile in flight: the keepalive goroutine
	// calls it when it fences, so that creation stops at once, not when
	// the batch is done.
	stopWork atomic.Pointer[context.CancelFunc]
	joined   atomic.Bool
	fenced   atomic.Bool
	statusMu sync.Mutex
	status   NodeStatus

	// What the cluster asks of this node, from the watch.
	specRev   int64
	specDoc   *SpecDoc
	fl        *spec.Fleet // nil: no spec (or none parsed yet)
	specErr   error
	assign    Assignment
	assignRev int64
	served    map[string]bool // names this agent served or was assigned in its lifetime

	ready   map[string]bool
	foreign map[string]bool // in the run dir, not nsfleet's: left alone

	supKey    string
	supCancel context.CancelFunc
	supDone   chan struct{}
}

// NewAgent checks the configuration.
func NewAgent(cfg AgentConfig) (*Agent, error) {
	if err := ValidNodeName(cfg.Node); err != nil {
		return nil, err
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 5 * time.Second
	}
	if cfg.LeaseTTL < 2*time.Second {
		return nil, fmt.Errorf("lease TTL %s: etcd grants whole seconds, and fencing needs at least 2 s", cfg.LeaseTTL)
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 5 * time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Agent{cfg: cfg, cli: cfg.Client, log: cfg.Log, served: map[string]bool{}, ready: map[string]bool{}, foreign: map[string]bool{}}, nil
}

// Healthy says whether the node serves: joined and not fenced.
func (a *Agent) Healthy() (bool, string) {
	switch {
	case !a.joined.Load():
		return false, "not joined to the cluster"
	case a.fenced.Load():
		return false, "fenced: lease not renewed"
	}
	return true, "ok"
}

// fenceMargin is how long before its lease can expire a node stops
// serving: enough to set every host veth down.
func (a *Agent) fenceMargin() time.Duration { return max(a.cfg.LeaseTTL/5, 500*time.Millisecond) }

// Run serves until ctx ends. Each lease is one epoch: join, serve until
// the lease is lost, tear down what moved away, join again.
func (a *Agent) Run(ctx context.Context) error {
	d, err := newDriftWatch(a.cfg.RunDir.Path)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	a.drift = d
	defer d.close()
	go d.run(ctx)
	defer a.stopSupervisor()
	learned := false
	for ctx.Err() == nil {
		err := a.join(ctx)
		if err == nil && !learned {
			a.learnAll()
			learned = true
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			a.cfg.Metrics.etcdError()
			a.log.Warn("join failed; retrying", "err", err)
			sleep(ctx, time.Second)
			continue
		}
		a.serve(ctx)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

func (a *Agent) rpc(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.cfg.LeaseTTL)
}

// join takes a lease: the one a previous agent of this node still holds
// (a restart adopts its namespaces without a failover), or a new one after
// tearing down whatever is no longer assigned here.
func (a *Agent) join(ctx context.Context) error {
	rctx, cancel := a.rpc(ctx)
	defer cancel()
	snap, err := Read(rctx, a.cli)
	if err != nil {
		return err
	}
	a.load(snap)
	ttl := int64((a.cfg.LeaseTTL + time.Second - 1) / time.Second)
	var lease clientv3.LeaseID
	if old, ok := snap.Nodes[a.cfg.Node]; ok && old.LeaseID != 0 {
		if _, err := a.cli.KeepAliveOnce(rctx, clientv3.LeaseID(old.LeaseID)); err == nil {
			lease = clientv3.LeaseID(old.LeaseID)
			a.log.Info("adopted the lease of this node's previous agent", "lease", fmt.Sprintf("%x", old.LeaseID))
		}
	}
	if lease == 0 {
		// Not (or no longer) a member: what moved away goes first.
		a.fenced.Store(true)
		a.reconcile(ctx, nil, true, true)
		g, err := a.cli.Grant(rctx, ttl)
		if err != nil {
			return err
		}
		lease = g.ID
	}
	info := NodeInfo{Name: a.cfg.Node, Capacity: a.cfg.Capacity, AllowProcesses: a.cfg.AllowProcesses,
		LeaseID: int64(lease), LeaseTTL: float64(ttl), Started: time.Now().UTC(), Version: a.cfg.Version}
	if _, err := a.cli.Put(rctx, NodeKey(a.cfg.Node), encode(info), clientv3.WithLease(lease)); err != nil {
		return err
	}
	a.lease = lease
	a.fenced.Store(false)
	a.cfg.Metrics.setFenced(false)
	a.joined.Store(true)
	a.log.Info("joined", "lease", fmt.Sprintf("%x", int64(lease)), "ttl", a.cfg.LeaseTTL)
	return nil
}

// load takes the spec and this node's assignment from a snapshot.
func (a *Agent) load(snap *Snapshot) {
	a.setSpec(snap.Spec, snap.SpecRev)
	a.setAssign(snap.Assign[a.cfg.Node], snap.AssignRev[a.cfg.Node])
}

func (a *Agent) setSpec(doc *SpecDoc, rev int64) {
	if rev == a.specRev && (doc == nil) == (a.specDoc == nil) {
		return
	}
	a.specRev, a.specDoc = rev, doc
	if doc == nil {
		a.fl, a.specErr = nil, nil
		return
	}
	f, err := doc.ParseSpec()
	if err != nil {
		a.specErr = fmt.Errorf("stored spec: %w", err)
		a.log.Error("stored spec does not parse; keeping the previous one", "err", err)
		return
	}
	a.fl, a.specErr = f, nil
	a.learnHosts()
}

func (a *Agent) setAssign(as Assignment, rev int64) {
	a.assign, a.assignRev = as, rev
	for _, n := range as.Names {
		a.served[n] = true
	}
}

type leaseEvent int

const (
	leaseFence leaseEvent = iota
	leaseRenewed
	leaseLost
)

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

// serve runs one lease's epoch.
func (a *Agent) serve(ctx context.Context) {
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan leaseEvent, 4)
	go a.keepalive(ectx, a.lease, events)
	sc := &scheduler{cli: a.cli, node: a.cfg.Node, log: a.log, metrics: a.cfg.Metrics, timeout: a.cfg.LeaseTTL}
	go func() {
		for ectx.Err() == nil {
			if err := sc.lead(ectx, a.lease); err != nil && ectx.Err() == nil {
				a.log.Debug("scheduler election", "err", err)
			}
			sleep(ectx, 500*time.Millisecond)
		}
	}()
	var watch clientv3.WatchChan
	stopWatch := func() {}
	defer func() { stopWatch() }()
	rewatch := func() bool {
		rctx, rcancel := a.rpc(ectx)
		snap, err := Read(rctx, a.cli)
		rcancel()
		if err != nil {
			return false
		}
		a.load(snap)
		stopWatch()
		wctx, wcancel := context.WithCancel(ectx)
		stopWatch = wcancel
		watch = a.cli.Watch(clientv3.WithRequireLeader(wctx), Prefix, clientv3.WithPrefix(), clientv3.WithRev(snap.Rev+1))
		return true
	}
	// The assignment may have changed since join read it (the scheduler
	// moved this node's namespaces while it was away): read it again with
	// the watch, then converge to it.
	if !rewatch() {
		watch = nil
	}
	a.reconcile(ctx, nil, true, false)
	resync := time.NewTicker(a.cfg.Resync)
	defer resync.Stop()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	if watch == nil {
		retry.Reset(500 * time.Millisecond)
	}
	for {
		changed := false
		// Lease events first: a fence must not wait behind other work.
		var ev leaseEvent
		select {
		case ev = <-events:
		default:
			ev = -1
		}
		if ev < 0 {
			select {
			case ev = <-events:
			case <-ctx.Done():
				return
			case resp, ok := <-watch:
				changed = a.watched(resp, ok, &watch, rewatch, retry)
			case <-retry.C:
				if watch == nil && rewatch() {
					changed = true
				} else if watch == nil {
					retry.Reset(500 * time.Millisecond)
				}
			case <-a.drift.notify:
				// Let the rest of a burst arrive.
				sleep(ctx, 50*time.Millisecond)
				dirty, all := a.drift.take()
				a.reconcile(ctx, dirty, all, false)
			case <-resync.C:
				a.foreign = map[string]bool{}
				a.reconcile(ctx, nil, true, false)
			}
		}
		if ev >= 0 {
			switch ev {
			case leaseFence:
				a.fence(ctx)
			case leaseRenewed:
				a.log.Info("lease renewed again: serving")
				a.fenced.Store(false)
				a.cfg.Metrics.setFenced(false)
				if rewatch() {
					a.reconcile(ctx, nil, true, false)
				}
			case leaseLost:
				a.log.Warn("lease expired: this node's namespaces may have moved; tearing down what did, then joining again")
				a.fenced.Store(true)
				a.joined.Store(false)
				a.cfg.Metrics.setFenced(true)
				return
			}
			continue
		}
		if changed {
			a.reconcile(ctx, nil, false, false)
		}
	}
}

// watched applies one watch response; it reports whether the spec or this
// node's assignment changed.
func (a *Agent) watched(resp clientv3.WatchResponse, ok bool, watch *clientv3.WatchChan, rewatch func() bool, retry *time.Timer) bool {
	if !ok || resp.Err() != nil || resp.Canceled {
		// Compacted, or etcd unreachable: read everything again.
		*watch = nil
		if !rewatch() {
			retry.Reset(500 * time.Millisecond)
			return false
		}
		return true
	}
	changed := false
	for _, ev := range resp.Events {
		switch k := string(ev.Kv.Key); k {
		case KeySpec:
			changed = true
			if ev.Type == clientv3.EventTypeDelete {
				a.setSpec(nil, ev.Kv.ModRevision)
				continue
			}
			var doc SpecDoc
			if err := json.Unmarshal(ev.Kv.Value, &doc); err == nil {
				a.setSpec(&doc, ev.Kv.ModRevision)
			}
		case AssignKey(a.cfg.Node):
			changed = true
			var as Assignment
			if ev.Type != clientv3.EventTypeDelete {
				json.Unmarshal(ev.Kv.Value, &as)
			}
			a.setAssign(as, ev.Kv.ModRevision)
		}
	}
	return changed
}

// fence stops serving before the lease can expire: no creation, and every
// host veth of the namespaces here set down, so that a namespace that the
// survivors re-create is never served twice.
func (a *Agent) fence(ctx context.Context) {
	a.fenced.Store(true)
	a.cfg.Metrics.setFenced(true)
	start := time.Now()
	n := 0
	if a.fl != nil {
		pins, _ := a.cfg.RunDir.List()
		if host, err := rtnl.OpenLite(); err == nil {
			for _, p := range pins {
				ns, ok := a.fl.Lookup(p.Name)
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
	a.log.Warn("fenced: lease not renewed in time; host veths set down, creating nothing", "veths_down", n, "took", time.Since(start))
	a.putStatus(ctx, func(s *NodeStatus) { s.Fenced = true })
}

// want is the namespaces this node must serve now.
func (a *Agent) want() map[string]bool {
	out := map[string]bool{}
	if a.fl == nil {
		return out
	}
	for _, n := range a.assign.Names {
		if _, ok := a.fl.Lookup(n); ok {
			out[n] = true
		}
	}
	return out
}

func (a *Agent) refused() string {
	if a.specErr != nil {
		return a.specErr.Error()
	}
	if a.fl != nil && a.fl.HasProcesses() && !a.cfg.AllowProcesses {
		return "the spec runs processes; this agent was started without --allow-processes"
	}
	return ""
}

// reconcile makes the node match its assignment. full checks every
// assigned namespace; otherwise only dirty ones and those not ready yet.
// teardownOnly (fenced, rejoining) removes what is not assigned here and
// creates nothing.
func (a *Agent) reconcile(ctx context.Context, dirty map[string]bool, full, teardownOnly bool) {
	if a.fenced.Load() && !teardownOnly {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.stopWork.Store(&cancel)
	defer a.stopWork.Store(nil)
	if a.fenced.Load() && !teardownOnly {
		return // fenced between the check and the store
	}
	start := time.Now()
	rd := a.cfg.RunDir
	want := a.want()
	refused := a.refused()
	var errs []string
	failed := 0
	note := func(err error) {
		failed++
		if len(errs) < 5 {
			errs = append(errs, err.Error())
		}
	}
	if !teardownOnly && refused == "" {
		a.superviseFor(ctx, want)
	}

	// Tear down: namespaces here that this cluster knows (in the spec,
	// or served by this agent before) and that are not assigned here.
	removeOK := true
	if pins, err := rd.List(); err != nil {
		note(err)
		removeOK = false
	} else {
		var remove []string
		for _, p := range pins {
			if want[p.Name] || a.foreign[p.Name] {
				continue
			}
			inSpec := false
			if a.fl != nil {
				_, inSpec = a.fl.Lookup(p.Name)
			}
			if inSpec || a.served[p.Name] {
				remove = append(remove, p.Name)
			}
		}
		if len(remove) > 0 {
			opts := fleet.Options{RunDir: rd, Workers: a.cfg.Workers, Log: a.log}
			opts.OnResult = func(r fleet.Result) {
				delete(a.ready, r.Name)
				switch {
				case r.Action == fleet.Skipped:
					a.foreign[r.Name] = true
				case r.Err != nil:
					note(r.Err)
					removeOK = false
				}
			}
			rep, err := fleet.Down(ctx, fleet.Selector{Names: remove}, opts, fleet.DownOptions{Wait: true, Timeout: 10 * time.Second})
			if err != nil {
				note(err)
				removeOK = false
			}
			a.log.Info("tore down", "namespaces", rep.Counts[fleet.Deleted], "took", time.Since(start).Round(time.Millisecond))
		}
	}

	if !teardownOnly && refused == "" && len(want) > 0 {
		var todo []string
		for n := range want {
			if full || dirty[n] || !a.ready[n] {
				todo = append(todo, n)
			}
		}
		if len(todo) > 0 {
			upStart := time.Now()
			opts := fleet.Options{RunDir: rd, Workers: a.cfg.Workers, Log: a.log}
			opts.OnResult = func(r fleet.Result) {
				a.ready[r.Name] = r.Err == nil && r.Action != fleet.Skipped && r.Action != fleet.Failed
				if r.Err != nil {
					note(r.Err)
				}
			}
			sum, err := fleet.Up(ctx, a.fl.Subset(todo), opts)
			if err != nil {
				note(err)
			}
			if n := sum.Counts[fleet.Created] + sum.Counts[fleet.Repaired]; n > 0 || failed > 0 {
				a.log.Info("reconciled", "created", sum.Counts[fleet.Created], "repaired", sum.Counts[fleet.Repaired],
					"failed", sum.Counts[fleet.Failed]+sum.Counts[fleet.Skipped], "took", time.Since(upStart).Round(time.Millisecond))
			}
		}
	}
	ready := 0
	for n := range want {
		if a.ready[n] {
			ready++
		}
	}
	for n := range a.ready {
		if !want[n] {
			delete(a.ready, n)
		}
	}
	a.cfg.Metrics.counts(len(want), ready)
	a.cfg.Metrics.reconciled(time.Since(start).Seconds())
	if teardownOnly {
		return
	}
	converged := removeOK && ready == len(want) && refused == ""
	rev := a.assignRev
	a.putStatus(ctx, func(s *NodeStatus) {
		if converged {
			s.AssignRev = rev
		}
		s.SpecRev = a.specRev
		s.Assigned, s.Ready, s.Failed, s.Errors = len(want), ready, failed, errs
		s.Fenced, s.Refused = false, refused
	})
}

// putStatus updates this node's status key (bound to its lease).
func (a *Agent) putStatus(ctx context.Context, edit func(*NodeStatus)) {
	a.statusMu.Lock()
	edit(&a.status)
	a.status.Updated = time.Now().UTC()
	val := encode(a.status)
	a.statusMu.Unlock()
	rctx, cancel := a.rpc(ctx)
	defer cancel()
	if _, err := a.cli.Put(rctx, StatusKey(a.cfg.Node), val, clientv3.WithLease(a.lease)); err != nil && ctx.Err() == nil {
		a.cfg.Metrics.etcdError()
		a.log.Debug("status", "err", err)
	}
}

// learnHosts maps every host veth of the spec to its namespace, so that
// host events name it; the host event of a veth's creation also carries
// the id of its namespace, which maps the events from inside it.
func (a *Agent) learnHosts() map[string]string {
	hostOf := map[string]string{}
	if a.fl == nil || a.drift == nil {
		return hostOf
	}
	for i := range a.fl.Namespaces {
		ns := &a.fl.Namespaces[i]
		var hs []string
		for _, v := range ns.Veths {
			hs = append(hs, v.Host)
			hostOf[v.Host] = ns.Name
		}
		a.drift.learn(ns.Name, hs, -1)
	}
	return hostOf
}

// learnAll maps, besides the host names, each existing namespace's id
// through one dump of the host's links: once, when the agent starts and
// finds namespaces made before it (a dump costs a lookup over every
// namespace id per host veth, so it is not repeated).
func (a *Agent) learnAll() {
	hostOf := a.learnHosts()
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

// superviseFor keeps the processes of want running, with the same
// supervisor as `nsfleet supervise`, restarted when want changes.
func (a *Agent) superviseFor(ctx context.Context, want map[string]bool) {
	if a.fl == nil || !a.fl.HasProcesses() || len(want) == 0 {
		a.stopSupervisor()
		return
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	key := fmt.Sprint(a.specRev, ":", strings.Join(names, ","))
	if key == a.supKey {
		return
	}
	a.stopSupervisor()
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	a.supKey, a.supCancel, a.supDone = key, cancel, done
	sub := a.fl.Subset(names)
	go func() {
		defer close(done)
		err := proc.StoreFor(a.cfg.RunDir).Supervise(sctx, sub, a.cfg.RunDir, proc.SuperviseOptions{Log: a.log})
		if err != nil && sctx.Err() == nil {
			a.log.Error("supervise", "err", err)
		}
	}()
}

func (a *Agent) stopSupervisor() {
	if a.supCancel != nil {
		a.supCancel()
		<-a.supDone
		a.supCancel, a.supDone, a.supKey = nil, nil, ""
	}
}
