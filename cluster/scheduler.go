package cluster

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/nsfleet/nsfleet/spec"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// scheduler runs on every agent; the one elected writes assignments.
type scheduler struct {
	cli     *clientv3.Client
	node    string
	log     *slog.Logger
	metrics *Metrics
	timeout time.Duration // of each etcd request

	// The parsed spec, kept while its revision does not change (a 40,000
	// namespace spec takes a while to expand).
	specRev   int64
	specNames []string
	specProcs bool
	specErr   error
	held      []string      // nodes whose failover is held, as last logged
	settle    time.Duration // a returning node settles this long; 0: DefaultSettle
	maxMoves  int           // balance moves per plan; 0: DefaultMaxMoves
}

// lead campaigns with the node's lease and, once elected, schedules on
// every change until ctx ends or the lease is lost. It returns when the
// session ends; the caller campaigns again with its next lease.
func (sc *scheduler) lead(ctx context.Context, lease clientv3.LeaseID) error {
	sess, err := concurrency.NewSession(sc.cli, concurrency.WithLease(lease), concurrency.WithContext(ctx))
	if err != nil {
		return err
	}
	// The agent keeps the lease alive itself (it fences on its own
	// clock); the session must not revoke it when it ends.
	defer sess.Orphan()
	el := concurrency.NewElection(sess, ElectionPrefix)
	if err := el.Campaign(ctx, sc.node); err != nil {
		return err
	}
	sc.log.Info("elected scheduler")
	sc.metrics.leader(true)
	defer sc.metrics.leader(false)
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		el.Resign(rctx)
		cancel()
	}()
	leaderKey, leaderRev := el.Key(), el.Rev()

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var from int64
	kick := make(chan struct{}, 1)
	for {
		rctx, rcancel := context.WithTimeout(wctx, sc.timeout)
		snap, err := Read(rctx, sc.cli)
		rcancel()
		if err == nil {
			// An assignment it cannot read would look empty: placing its
			// namespaces elsewhere would serve them twice.
			err = snap.Unreadable()
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			sc.metrics.etcdError()
			sc.log.Warn("scheduler: read", "err", err)
			select {
			case <-time.After(200 * time.Millisecond):
				continue
			case <-sess.Done():
				return nil
			case <-ctx.Done():
				return nil
			}
		}
		if from == 0 {
			from = snap.Rev + 1
			go sc.follow(wctx, from, kick)
		}
		rctx, rcancel = context.WithTimeout(wctx, sc.timeout)
		err = sc.round(rctx, snap, leaderKey, leaderRev)
		rcancel()
		if err != nil && ctx.Err() == nil {
			sc.metrics.etcdError()
			sc.log.Warn("scheduler: round", "err", err)
		}
		select {
		case <-kick:
			// Let a burst of changes (a node's keys expiring together,
			// a batch of status updates) arrive before reading again.
			time.Sleep(20 * time.Millisecond)
		case <-time.After(2 * time.Second): // failover records, even if quiet
		case <-sess.Done():
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// follow kicks the scheduler on every change under Prefix from revision
// from on. When the watch ends (etcd compacted past it, or lost its
// leader) it watches again from the current revision and kicks once, so
// that the scheduler reads everything afresh.
func (sc *scheduler) follow(ctx context.Context, from int64, kick chan<- struct{}) {
	signal := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(from)}
	for ctx.Err() == nil {
		for resp := range sc.cli.Watch(clientv3.WithRequireLeader(ctx), Prefix, opts...) {
			if resp.Err() == nil {
				signal()
			}
		}
		if ctx.Err() != nil {
			return
		}
		sc.log.Debug("scheduler: watch ended; watching again")
		opts = []clientv3.OpOption{clientv3.WithPrefix()}
		signal()
		sleep(ctx, 200*time.Millisecond)
	}
}

func (sc *scheduler) names(snap *Snapshot) ([]string, bool) {
	if snap.Spec == nil {
		return nil, false
	}
	if snap.SpecRev != sc.specRev {
		sc.specRev = snap.SpecRev
		var f *spec.Fleet
		f, sc.specErr = snap.Spec.ParseSpec()
		if sc.specErr != nil {
			sc.log.Error("scheduler: stored spec does not parse; keeping assignments", "err", sc.specErr)
			sc.specNames = nil
		} else {
			sc.specNames, sc.specProcs = f.Names(), f.HasProcesses()
		}
	}
	return sc.specNames, sc.specErr == nil
}

// State turns a snapshot into the scheduler's input. A spec with
// processes treats nodes that do not allow them as cordoned.
func StateOf(snap *Snapshot, names []string, procs bool) State {
	st := State{Names: names, Nodes: map[string]NodeView{}, Assign: snap.Assign, Forced: snap.Forced, Held: snap.Held}
	for n, info := range snap.Nodes {
		_, cord := snap.Cordons[n]
		v := NodeView{Alive: true, Cordoned: cord || (procs && !info.AllowProcesses), Capacity: info.Capacity, Converged: true}
		if rev, ok := snap.AssignRev[n]; ok {
			v.Converged = snap.Status[n].Converged(rev)
		}
		st.Nodes[n] = v
	}
	return st
}

// DefaultSettle is how long a node that came back waits before balance
// moves namespaces onto it; DefaultMaxMoves bounds balance moves per plan.
const (
	DefaultSettle   = 2 * time.Minute
	DefaultMaxMoves = 100
)

// markSettling marks the nodes that came back within settle: a new lease
// after a lost one, or a failover of their namespaces.
func markSettling(st *State, snap *Snapshot, now time.Time, settle time.Duration) {
	recent := func(t time.Time) bool { return !t.IsZero() && now.Sub(t) < settle }
	for n, v := range st.Nodes {
		info := snap.Nodes[n]
		v.Settling = recent(info.Returned)
		v.Returned = !info.Returned.IsZero() && now.Sub(info.Returned) < time.Duration(info.LeaseTTL*float64(time.Second))
		for _, f := range snap.Failovers {
			v.Settling = v.Settling || f.Node == n && recent(f.Detected)
		}
		st.Nodes[n] = v
	}
}

func (sc *scheduler) round(ctx context.Context, snap *Snapshot, leaderKey string, leaderRev int64) error {
	names, ok := sc.names(snap)
	if !ok && snap.Spec != nil {
		return nil // a bad stored spec: change nothing
	}
	now := time.Now().UTC()
	st := StateOf(snap, names, sc.specProcs)
	st.MaxMoves = cmp.Or(sc.maxMoves, DefaultMaxMoves)
	markSettling(&st, snap, now, cmp.Or(sc.settle, DefaultSettle))
	p := Schedule(st)
	sc.metrics.held(len(p.Held))
	if len(p.Held) > 0 && !slices.Equal(p.Held, sc.held) {
		sc.log.Warn("more than half of the nodes lost at once: their namespaces stay put (likelier the network or etcd); 'nsfleet cluster failover NODE' moves a node's", "held", p.Held)
	}
	sc.held = p.Held
	guard := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(leaderKey), "=", leaderRev),
		clientv3.Compare(clientv3.ModRevision(KeyAssignGen), "=", snap.AssignGenRev),
	}
	// The holds are remembered, so that they outlast the moment that
	// looked like a mass loss (see State.Held).
	var ops []clientv3.Op
	for _, node := range p.Remember {
		if !snap.Held[node] {
			ops = append(ops, clientv3.OpPut(HeldKey(node), now.Format(time.RFC3339)))
		}
	}
	for node := range snap.Held {
		if !slices.Contains(p.Remember, node) {
			ops = append(ops, clientv3.OpDelete(HeldKey(node)))
		}
	}
	if p.Changed() || len(ops) > 0 {
		for node, a := range p.Assign {
			if len(a.Names) == 0 && len(a.Releasing) == 0 {
				ops = append(ops, clientv3.OpDelete(AssignKey(node)))
			} else {
				ops = append(ops, clientv3.OpPut(AssignKey(node), encode(a)))
			}
		}
		ops = append(ops, clientv3.OpPut(KeyAssignGen, now.Format(time.RFC3339Nano)))
		for node := range p.Orphaned {
			if snap.Forced[node] {
				ops = append(ops, clientv3.OpDelete(ForceKey(node)))
			}
		}
		var lost []string
		for node, n := range p.Orphaned {
			lost = append(lost, node)
			sc.log.Info("node lost: moving its namespaces", "lost", node, "namespaces", n, "placed", p.Placed, "unassigned", p.Unassigned)
		}
		resp, err := sc.cli.Txn(ctx).If(guard...).Then(ops...).Commit()
		if err != nil {
			return err
		}
		if !resp.Succeeded {
			return nil // someone else wrote first: read again
		}
		for _, node := range lost {
			fo := Failover{Node: node, Detected: now, Moved: p.Orphaned[node], To: p.Placed, AssignRev: resp.Header.Revision, Unassigned: p.Unassigned}
			if _, err := sc.cli.Put(ctx, FailoverKey(resp.Header.Revision), encode(fo)); err != nil {
				return err
			}
			sc.metrics.failover()
		}
		return nil
	}
	// Orders for nodes that came back, or hold nothing any more, are done.
	for node := range snap.Forced {
		_, alive := snap.Nodes[node]
		if _, has := snap.Assign[node]; alive || !has {
			if _, err := sc.cli.Delete(ctx, ForceKey(node)); err != nil {
				return err
			}
		}
	}
	return sc.closeFailovers(ctx, snap)
}

// closeFailovers marks failovers whose namespaces are all ready and
// trims old records.
func (sc *scheduler) closeFailovers(ctx context.Context, snap *Snapshot) error {
	for i, fo := range snap.Failovers {
		if !fo.Ready.IsZero() {
			continue
		}
		done := true
		for node := range fo.To {
			st, ok := snap.Status[node]
			if _, alive := snap.Nodes[node]; !alive {
				continue // lost too: its own failover covers the rest
			}
			if !ok || st.AssignRev < fo.AssignRev || st.Ready < st.Assigned || st.Fenced {
				done = false
			}
		}
		if !done {
			continue
		}
		fo.Ready = time.Now().UTC()
		fo.Seconds = fo.Ready.Sub(fo.Detected).Seconds()
		if _, err := sc.cli.Put(ctx, FailoverKey(snap.FailoverRevs[i]), encode(fo)); err != nil {
			return err
		}
		sc.metrics.failoverDone(fo.Seconds)
		sc.log.Info("failover done", "lost", fo.Node, "moved", fo.Moved, "seconds", fo.Seconds)
	}
	if extra := len(snap.Failovers) - MaxFailovers; extra > 0 {
		// Records are keyed by revision, so the first are the oldest.
		for _, rev := range snap.FailoverRevs[:extra] {
			if _, err := sc.cli.Delete(ctx, FailoverKey(rev)); err != nil {
				return err
			}
		}
	}
	return nil
}
