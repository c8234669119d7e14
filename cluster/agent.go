package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/process"
	"github.com/nsfleet/nsfleet/spec"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The agent is cut by concern, one file each:
//
//	agent.go      the life of an agent: join with a lease, serve, rejoin
//	lease.go      keeping the lease alive, and fencing before it can expire
//	watch.go      what the cluster asks of this node (spec, assignment)
//	decide.go     the decisions: a pure function of what was observed
//	reconcile.go  carrying a decision out on the kernel, and the status
//	drift.go      kernel events that say a namespace may have drifted

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
	// PeerAddr (host:port) is where the agent answers its peers, announced
	// in its node key; "" turns the failsafe off (see failsafe.go).
	PeerAddr string
	// PeerServerTLS and PeerClientTLS (PeerTLS) make the peers' questions
	// mutual TLS with the cluster's certificates; nil: plain HTTP.
	PeerServerTLS, PeerClientTLS *tls.Config
	// RebalanceAfter: a node that came back gets namespaces moved onto it
	// by balance only after this long (0: DefaultSettle); MaxMoves bounds
	// the balance moves of one scheduling step (0: DefaultMaxMoves).
	RebalanceAfter time.Duration
	MaxMoves       int
	// NoWatchdog: no watchdog process (watchdog.go); a stopped agent's
	// node then keeps serving after its lease expired.
	NoWatchdog bool
	// Renewers, if set, are clients of one etcd endpoint each: the lease is
	// renewed through all of them at once and the first answer counts, so
	// that one member that stopped answering (its connection hung until
	// keepalives time it out) does not delay a renewal past the fence
	// point while the others answer.
	Renewers []*clientv3.Client
	// TunnelAddr is this node's underlay address for links whose other
	// end another node serves (see fleet.Tunnel); invalid: such links
	// fail. TunnelPort (0: 4789) and TunnelMTU (0: 1500, the underlay's)
	// complete it.
	TunnelAddr            netip.Addr
	TunnelPort, TunnelMTU int
}

// Agent makes one node serve what the cluster assigns to it. Its threading
// contract is fleet's: namespace work happens in fleet's workers; the
// agent's own goroutines never change namespace. The serve loop is the only
// goroutine that reads or writes the desired and held state; the keepalive
// goroutine touches only the atomics.
type Agent struct {
	cfg    AgentConfig
	cli    *clientv3.Client
	log    *slog.Logger
	drift  *driftWatch
	kernel nodeKernel

	lease clientv3.LeaseID
	// stopWork cancels the reconcile in flight: the keepalive goroutine
	// calls it when it fences, so that creation stops at once, not when
	// the batch is done.
	stopWork atomic.Pointer[context.CancelFunc]
	// preempt is the bring-up in flight that may give way to a change
	// (preempt.go); assigned is the assignment's names for the watch's
	// pump to read (the serve loop replaces, never changes, the slice).
	preempt  atomic.Pointer[preemption]
	assigned atomic.Pointer[[]string]
	joined   atomic.Bool
	fenced   atomic.Bool
	failsafe atomic.Bool // serving without the lease renewed (failsafe.go)
	// lastQuorum: when etcd last answered a renewal and a linearizable
	// read (UnixNano): it had a quorum then. What peers are told.
	lastQuorum atomic.Int64
	peers      peerBook
	peerHTTP   *http.Client
	lostLease  bool // this agent held a lease before and lost it
	// fencePoint (UnixNano) is when the agent must stop acting unless
	// its lease was renewed: the earliest expiry minus the fence margin.
	// Checked before every reconcile, so that an agent that resumes
	// after a stop does nothing before its keepalive has caught up.
	fencePoint atomic.Int64
	dog        *watchdogLink
	// servedVeths: the host veths of what the node serves, as last
	// reconciled, for the rejoin guard (read from its goroutine).
	servedVeths atomic.Pointer[[]string]
	statusMu    sync.Mutex
	status      NodeStatus
	statusStale atomic.Bool // the last status put failed: put it again

	desired desired // what the cluster asks of this node (watch.go)
	held    held    // what this node holds (reconcile.go)
	sup     supervision
}

// held is what the agent knows of its node beyond the run dir's listing.
type held struct {
	served  map[string]bool            // assigned here at some time in this agent's life
	applied map[string]*spec.Namespace // what each namespace was last made to match
	foreign map[string]bool            // in the run dir, not nsfleet's: left alone
	placed  map[string]string          // where each one's link peers were when applied (LinkPlaces)
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
	return &Agent{cfg: cfg, cli: cfg.Client, log: cfg.Log, peerHTTP: peerClient(cfg.PeerClientTLS),
		kernel: &engine{rd: cfg.RunDir, workers: cfg.Workers, log: cfg.Log},
		held:   held{served: map[string]bool{}, applied: map[string]*spec.Namespace{}, foreign: map[string]bool{}, placed: map[string]string{}}}, nil
}

// Healthy says whether the node serves: joined and not fenced.
func (a *Agent) Healthy() (bool, string) {
	switch {
	case !a.joined.Load():
		return false, "not joined to the cluster"
	case a.fenced.Load():
		return false, "fenced: lease not renewed"
	case a.failsafe.Load():
		return true, "failsafe: no node reaches etcd; serving what is here, changing nothing"
	}
	return true, "ok"
}

// Run serves until ctx ends. Each lease is one epoch: join, serve until
// the lease is lost, tear down what moved away, join again. Supervised
// processes are kept running across epochs, for as long as they are
// assigned here, and left running when the agent stops (as `nsfleet
// supervise` leaves them): the next agent adopts them.
func (a *Agent) Run(ctx context.Context) error {
	d, err := newDriftWatch(a.cfg.RunDir.Path)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	a.drift = d
	defer d.close()
	go d.run(ctx)
	if err := a.servePeers(ctx); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if !a.cfg.NoWatchdog {
		rd := a.cfg.RunDir
		store := process.StoreFor(rd).Dir
		a.dog = &watchdogLink{addr: WatchdogAddr(rd.Path), log: a.log, start: func() error {
			if err := os.MkdirAll(store, 0o700); err != nil {
				return err
			}
			return startWatchdogProcess(rd.Path, filepath.Join(store, "watchdog.log"))
		}}
		defer a.dog.close()
	}
	a.sup.ctx = ctx
	defer a.sup.stop()
	learned := false
	stopGuard := func() {}
	defer func() { stopGuard() }()
	for ctx.Err() == nil {
		if a.lostLease {
			stopGuard = a.guardRejoin(ctx)
		}
		err := a.join(ctx)
		if err == nil {
			stopGuard()
			stopGuard = func() {}
		}
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
	if err := checkSchema(rctx, a.cli); err != nil {
		return err
	}
	snap, kvs, err := readAll(rctx, a.cli)
	if err != nil {
		return err
	}
	a.load(snap, kvs)
	ttl := int64((a.cfg.LeaseTTL + time.Second - 1) / time.Second)
	var lease clientv3.LeaseID
	if old, ok := snap.Nodes[a.cfg.Node]; ok && old.LeaseID != 0 {
		if resp, err := a.cli.KeepAliveOnce(rctx, clientv3.LeaseID(old.LeaseID)); err == nil {
			lease = clientv3.LeaseID(old.LeaseID)
			// Before the previous agent's watchdog deadline passes.
			a.renewed(time.Now(), time.Duration(resp.TTL)*time.Second)
			a.log.Info("adopted the lease of this node's previous agent", "lease", fmt.Sprintf("%x", old.LeaseID))
		}
	}
	if lease == 0 {
		// Not (or no longer) a member: what moved away goes first.
		a.fenced.Store(true)
		a.reconcile(ctx, OnWithdraw)
		g, err := a.cli.Grant(rctx, ttl)
		if err != nil {
			return err
		}
		lease = g.ID
	}
	info := NodeInfo{Name: a.cfg.Node, Capacity: a.cfg.Capacity, AllowProcesses: a.cfg.AllowProcesses,
		LeaseID: int64(lease), LeaseTTL: float64(ttl), Started: time.Now().UTC(), Version: a.cfg.Version, PeerURL: a.peerURL()}
	if a.cfg.TunnelAddr.IsValid() {
		info.TunnelAddr = a.cfg.TunnelAddr.String()
	}
	if a.lostLease {
		info.Returned = info.Started
	}
	ops := []clientv3.Op{clientv3.OpPut(NodeKey(a.cfg.Node), encode(info), clientv3.WithLease(lease))}
	if snap.Legacy[a.cfg.Node] {
		// This node's layout 1 agent is replaced: its keys go with it.
		ops = append(ops, clientv3.OpDelete(V1NodesPrefix+a.cfg.Node), clientv3.OpDelete(V1StatusPrefix+a.cfg.Node))
	}
	if _, err := a.cli.Txn(rctx).Then(ops...).Commit(); err != nil {
		return err
	}
	a.lease = lease
	a.renewed(time.Now(), a.cfg.LeaseTTL)
	a.lastQuorum.Store(time.Now().UnixNano()) // the join's reads and writes
	a.fenced.Store(false)
	a.failsafe.Store(false)
	a.cfg.Metrics.setFailsafe(false)
	a.cfg.Metrics.setFenced(false)
	a.joined.Store(true)
	a.log.Info("joined", "lease", fmt.Sprintf("%x", int64(lease)), "ttl", a.cfg.LeaseTTL)
	return nil
}

// serve runs one lease's epoch: it gathers events (lease, watch, drift,
// resync) and reconciles for each.
func (a *Agent) serve(ctx context.Context) {
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan leaseEvent, 4)
	go a.keepalive(ectx, a.lease, events)
	go a.campaign(ectx)
	w := &specWatch{a: a, ctx: ectx}
	defer w.stop()
	// The assignment may have changed since join read it (the scheduler
	// moved this node's namespaces while it was away): read it again with
	// the watch, then converge to it.
	w.restart()
	a.reconcile(ctx, OnResync)
	resync := time.NewTicker(a.cfg.Resync)
	defer resync.Stop()
	retryStatus := time.NewTicker(time.Second)
	defer retryStatus.Stop()
	watched := func(it watchItem, ok bool) {
		if w.take(it.resp, ok && it.ok) {
			a.reconcile(ctx, OnChange)
		}
	}
	for {
		// Lease events first: a fence must not wait behind other work;
		// then the watch: a change must not wait behind drift that a
		// bring-up which gave way to it handed back.
		select {
		case ev := <-events:
			if !a.leaseEvent(ctx, ev, w) {
				return
			}
			continue
		default:
		}
		select {
		case it, ok := <-w.ch:
			watched(it, ok)
			continue
		default:
		}
		select {
		case ev := <-events:
			if !a.leaseEvent(ctx, ev, w) {
				return
			}
		case <-ctx.Done():
			return
		case it, ok := <-w.ch:
			watched(it, ok)
		case <-w.retry.C:
			if w.ch == nil && w.restart() {
				a.reconcile(ctx, OnChange)
			}
		case <-a.drift.notify:
			// Let the rest of a burst arrive.
			sleep(ctx, 50*time.Millisecond)
			a.reconcile(ctx, OnDrift)
		case <-resync.C:
			a.held.foreign = map[string]bool{}
			a.reconcile(ctx, OnResync)
		case <-retryStatus.C:
			if a.statusStale.Load() && !a.fenced.Load() {
				a.putStatus(ctx, func(*NodeStatus) {})
			}
		}
	}
}

// guardRejoin watches over the node while an agent that lost its lease
// tries to join again: as long as every peer answers and none reaches etcd
// (failsafe), nobody can take its namespaces over and it keeps the
// watchdog from fencing; as soon as that no longer holds, it sets the host
// veths down. The returned func stops it.
func (a *Agent) guardRejoin(ctx context.Context) func() {
	gctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for down := false; gctx.Err() == nil && !down; sleep(gctx, failsafeRetry) {
			if ok, _ := a.failsafeHolds(gctx, failsafeRetry); ok {
				a.dog.extend(3 * failsafeRetry)
				continue
			}
			if vs := a.servedVeths.Load(); vs != nil {
				n := setHostVethsDown(*vs)
				a.log.Warn("rejoining without a lease while a peer reaches etcd (or does not answer): host veths set down", "veths_down", n)
			}
			down = true
		}
	}()
	return func() { cancel(); <-done }
}

// campaign takes part in the scheduler election for this lease's epoch.
func (a *Agent) campaign(ctx context.Context) {
	sc := &scheduler{cli: a.cli, node: a.cfg.Node, log: a.log, metrics: a.cfg.Metrics, timeout: a.cfg.LeaseTTL,
		settle: a.cfg.RebalanceAfter, maxMoves: a.cfg.MaxMoves}
	for ctx.Err() == nil {
		if err := sc.lead(ctx, a.lease); err != nil && ctx.Err() == nil {
			a.log.Debug("scheduler election", "err", err)
		}
		sleep(ctx, 500*time.Millisecond)
	}
}

// leaseEvent acts on one event of the keepalive; false ends the epoch.
func (a *Agent) leaseEvent(ctx context.Context, ev leaseEvent, w *specWatch) bool {
	switch ev {
	case leaseFence:
		a.fence(ctx)
	case leaseFailsafe:
		a.cfg.Metrics.setFailsafe(true)
	case leaseRenewed:
		a.log.Info("lease renewed again: serving")
		a.fenced.Store(false)
		a.cfg.Metrics.setFenced(false)
		a.cfg.Metrics.setFailsafe(false)
		if w.restart() {
			a.reconcile(ctx, OnResync)
		}
	case leaseLost:
		a.log.Warn("lease expired: this node's namespaces may have moved; tearing down what did, then joining again")
		a.fenced.Store(true)
		a.joined.Store(false)
		a.lostLease = true
		a.cfg.Metrics.setFenced(true)
		return false
	}
	return true
}
