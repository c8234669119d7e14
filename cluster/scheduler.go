package cluster

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"strings"
	"time"

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

	held []string // nodes whose failover is held, as last logged
	// soon: the last plan held a failover only for the moment (nodes
	// back within the TTL, or suspect): look again before the quiet
	// period's 2 s, since a renewal changes no key and kicks nothing.
	soon     bool
	settle   time.Duration // a returning node settles this long; 0: DefaultSettle
	maxMoves int           // balance moves per plan; 0: DefaultMaxMoves
	// afterBatch, if set, is called after each transaction of a chained
	// commit (tests cut a plan off there).
	afterBatch func(i int)
	// graph: the links of the stored specs, as read for graphKey.
	graph    Graph
	graphKey string
}

// links returns the stored specs' links, read again only when one of the
// specs with links was applied, deleted or added since the last read.
func (sc *scheduler) links(ctx context.Context, snap *Snapshot) (Graph, error) {
	key := graphKey(snap)
	if key == sc.graphKey {
		return sc.graph, nil
	}
	if key == "" {
		sc.graph, sc.graphKey = nil, ""
		return nil, nil
	}
	rctx, cancel := context.WithTimeout(ctx, sc.timeout)
	defer cancel()
	g, err := ReadGraph(rctx, sc.cli, snap)
	if err != nil {
		return nil, err
	}
	sc.graph, sc.graphKey = g, key
	return g, nil
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
		// A plan for a large fleet is several transactions (failover of
		// 13,000 names at 40,000): time for each of them.
		rctx, rcancel = context.WithTimeout(wctx, 4*sc.timeout)
		err = sc.round(rctx, snap, leaderKey, leaderRev)
		rcancel()
		if err != nil && ctx.Err() == nil {
			sc.metrics.etcdError()
			sc.log.Warn("scheduler: round", "err", err)
		}
		quiet := 2 * time.Second // failover records, even if quiet
		if sc.soon {
			quiet = 250 * time.Millisecond
		}
		select {
		case <-kick:
			// Let a burst of changes (a node's keys expiring together,
			// a batch of status updates) arrive before reading again.
			time.Sleep(20 * time.Millisecond)
		case <-time.After(quiet):
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

// ViewOf turns a snapshot into the scheduler's input: names whose spec
// runs processes go only to nodes that allow them; nodes whose agent still
// runs key layout 1 are Frozen.
func ViewOf(snap *Snapshot, names []string) ClusterView {
	st := ClusterView{Names: names, Nodes: map[string]NodeView{}, Assign: snap.Assign, Forced: snap.Forced, Held: snap.Held}
	for n, info := range snap.Nodes {
		_, cord := snap.Cordons[n]
		v := NodeView{Alive: true, Cordoned: cord, AllowProcesses: info.AllowProcesses, Capacity: info.Capacity, Converged: true, Frozen: snap.Legacy[n]}
		if rev, ok := snap.AssignRev[n]; ok {
			v.Converged = snap.Status[n].Converged(rev)
		}
		st.Nodes[n] = v
	}
	if snap.HasProcesses() {
		st.NeedsProcesses = map[string]bool{}
		for _, name := range names {
			if snap.Specs[snap.SpecOf[name]].Processes {
				st.NeedsProcesses[name] = true
			}
		}
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
func markSettling(st *ClusterView, snap *Snapshot, now time.Time, settle time.Duration) {
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

// markSuspects asks etcd how long each live node's lease has left, but
// only while some node is dead (holds an assignment and no lease): that is
// when a node that missed its renewal may be the next to go (see
// NodeView.Suspect). A node whose lease cannot be asked about is not
// suspect: the question is a refinement, its failure must not hold a
// failover.
func (sc *scheduler) markSuspects(ctx context.Context, st *ClusterView, snap *Snapshot) {
	dead := false
	for node, a := range snap.Assign {
		if _, alive := snap.Nodes[node]; !alive && len(a.Names)+len(a.Releasing) > 0 {
			dead = true
		}
	}
	if !dead {
		return
	}
	type answer struct {
		node    string
		suspect bool
	}
	answers := make(chan answer, len(snap.Nodes))
	for node, info := range snap.Nodes {
		go func() {
			suspect := false
			if info.LeaseID != 0 {
				lctx, cancel := context.WithTimeout(ctx, sc.timeout)
				resp, err := sc.cli.TimeToLive(lctx, clientv3.LeaseID(info.LeaseID))
				cancel()
				suspect = err == nil && leaseSuspect(resp.TTL, resp.GrantedTTL)
			}
			answers <- answer{node, suspect}
		}()
	}
	var suspects []string
	for range snap.Nodes {
		ans := <-answers
		if v, ok := st.Nodes[ans.node]; ok && ans.suspect {
			v.Suspect = true
			st.Nodes[ans.node] = v
			suspects = append(suspects, ans.node)
		}
	}
	if len(suspects) > 0 {
		slices.Sort(suspects)
		sc.log.Info("a node is dead and others missed a lease renewal: they count as lost until they renew", "suspect", suspects)
	}
}

// leaseSuspect reports whether a lease with left seconds of granted (as
// etcd's TimeToLive says them: whole seconds, rounded down; -1 when the
// lease is gone) has missed a renewal: the true time left, below left+1,
// is under half the TTL, where an agent renewing every TTL/3 keeps two
// thirds of it.
func leaseSuspect(left, granted int64) bool {
	return left >= 0 && 2*(left+1) <= granted
}

func (sc *scheduler) round(ctx context.Context, snap *Snapshot, leaderKey string, leaderRev int64) error {
	now := time.Now().UTC()
	st := ViewOf(snap, snap.Names)
	st.MaxMoves = cmp.Or(sc.maxMoves, DefaultMaxMoves)
	g, err := sc.links(ctx, snap)
	if err != nil {
		return err
	}
	st.Linked = g
	markSettling(&st, snap, now, cmp.Or(sc.settle, DefaultSettle))
	sc.markSuspects(ctx, &st, snap)
	p := Schedule(st)
	sc.metrics.held(len(p.Held))
	if len(p.Held) > 0 && !slices.Equal(p.Held, sc.held) {
		sc.log.Warn("more than half of the nodes lost at once: their namespaces stay put (likelier the network or etcd); 'nsfleet cluster failover NODE' moves a node's", "held", p.Held)
	}
	sc.held = p.Held
	sc.soon = len(p.Held) > len(p.Remember)
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
		for node := range p.Orphaned {
			if snap.Forced[node] {
				ops = append(ops, clientv3.OpDelete(ForceKey(node)))
			}
		}
		ops = append(ops, assignOps(snap, p.Assign)...)
		// The records go first, pending (AssignRev 0): a plan too large
		// for one transaction can be cut off between two (etcd timing out
		// under load), and the next round may then see no lost node (its
		// assignment already deleted) and place the rest as new names;
		// the pending record still says a failover is under way, and
		// closeFailovers completes it against the assignment as it ends up.
		records := map[string]Failover{}
		keys := map[string]string{}
		for node, n := range p.Orphaned {
			sc.log.Info("node lost: moving its namespaces", "lost", node, "namespaces", n, "placed", p.Placed, "unassigned", p.Unassigned)
			fo, key := Failover{Node: node, Detected: now, Moved: n, To: p.Placed, Unassigned: p.Unassigned}, FailoverKey(snap.Rev, node)
			if i := pendingFailover(snap, node); i >= 0 { // a round cut off before: the same failover
				fo.Detected, fo.Moved, key = snap.Failovers[i].Detected, snap.Failovers[i].Moved, snap.FailoverKeys[i]
			}
			if err := sc.putRecord(ctx, key, fo); err != nil {
				return err
			}
			records[node], keys[node] = fo, key
		}
		rev, ok, err := sc.commit(ctx, guard, ops, now)
		if err != nil || !ok {
			return err // !ok: someone else wrote first: read again
		}
		for node, fo := range records {
			fo.AssignRev = rev
			if err := sc.putRecord(ctx, keys[node], fo); err != nil {
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

// commit writes a plan's operations in as few transactions as etcd's
// limits allow, each one bumping assign-gen and guarded by the election and
// by assign-gen as the previous one left it: a second scheduler's write
// breaks the chain, and what was written before the break keeps the rule
// that no name is in two nodes' assignments (Schedule moves a name between
// live nodes only after the old node released it, and each bucket holds a
// name's Names and Releasing together). It returns the last revision.
func (sc *scheduler) commit(ctx context.Context, guard []clientv3.Cmp, ops []clientv3.Op, now time.Time) (int64, bool, error) {
	var rev int64
	gen := clientv3.OpPut(KeyAssignGen, now.Format(time.RFC3339Nano))
	for i, b := range batches(ops) {
		if i > 0 {
			guard = []clientv3.Cmp{guard[0], clientv3.Compare(clientv3.ModRevision(KeyAssignGen), "=", rev)}
		}
		// b is a window on ops: appending to it in place would overwrite
		// the next batch's first operation.
		resp, err := sc.cli.Txn(ctx).If(guard...).Then(append(b[:len(b):len(b)], gen)...).Commit()
		if err != nil {
			return 0, false, err
		}
		if !resp.Succeeded {
			return 0, false, nil
		}
		rev = resp.Header.Revision
		if sc.afterBatch != nil {
			sc.afterBatch(i)
		}
	}
	return rev, true, nil
}

// assignOps writes the plan's assignments bucket by bucket: only the
// buckets whose content changed are put, and emptied ones deleted.
func assignOps(snap *Snapshot, plan map[string]*Assignment) []clientv3.Op {
	var ops []clientv3.Op
	for _, node := range sortedKeys(plan) {
		parts := map[string]*Assignment{}
		part := func(name string) *Assignment {
			k := AssignKey(node, Bucket(name))
			if parts[k] == nil {
				parts[k] = &Assignment{}
			}
			return parts[k]
		}
		for _, n := range plan[node].Names {
			part(n).Names = append(part(n).Names, n)
		}
		for _, n := range plan[node].Releasing {
			part(n).Releasing = append(part(n).Releasing, n)
		}
		for _, k := range sortedKeys(parts) {
			a := parts[k]
			slices.Sort(a.Names)
			slices.Sort(a.Releasing)
			if old, ok := snap.Parts[k]; ok && slices.Equal(old.Names, a.Names) && slices.Equal(old.Releasing, a.Releasing) {
				continue
			}
			ops = append(ops, clientv3.OpPut(k, encode(a)))
		}
		for _, k := range sortedKeys(snap.Parts) {
			if _, keep := parts[k]; !keep && strings.HasPrefix(k, AssignNodePrefix(node)) {
				ops = append(ops, clientv3.OpDelete(k))
			}
		}
	}
	return ops
}

// putRecord writes a failover record with a deadline of its own: a
// record missed would not be written again.
func (sc *scheduler) putRecord(ctx context.Context, key string, fo Failover) error {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sc.timeout)
	defer cancel()
	_, err := sc.cli.Put(pctx, key, encode(fo))
	return err
}

// pendingFailover returns the index of node's failover record whose plan
// was cut off (pending, not ready), or -1.
func pendingFailover(snap *Snapshot, node string) int {
	for i, fo := range snap.Failovers {
		if fo.Node == node && fo.AssignRev == 0 && fo.Ready.IsZero() {
			return i
		}
	}
	return -1
}

// closeFailovers marks failovers whose namespaces are all ready and
// trims old records.
func (sc *scheduler) closeFailovers(ctx context.Context, snap *Snapshot) error {
	for i, fo := range snap.Failovers {
		if !fo.Ready.IsZero() {
			continue
		}
		// A pending record's plan was cut off: the rounds since have
		// written the rest, and the assignment as it is now is the one to
		// be served.
		want, nodes := fo.AssignRev, fo.To
		if want == 0 {
			want, nodes = snap.AssignGenRev, map[string]int{}
			for node := range snap.Nodes { // the rest may have gone anywhere
				nodes[node] = 0
			}
		}
		done := true
		for node := range nodes {
			st, ok := snap.Status[node]
			if _, alive := snap.Nodes[node]; !alive {
				continue // lost too: its own failover covers the rest
			}
			if !ok || st.AssignRev < want || st.Ready < st.Assigned || st.Fenced {
				done = false
			}
		}
		if !done {
			continue
		}
		fo.Ready = time.Now().UTC()
		fo.Seconds = fo.Ready.Sub(fo.Detected).Seconds()
		if _, err := sc.cli.Put(ctx, snap.FailoverKeys[i], encode(fo)); err != nil {
			return err
		}
		sc.metrics.failoverDone(fo.Seconds)
		sc.log.Info("failover done", "lost", fo.Node, "moved", fo.Moved, "seconds", fo.Seconds)
	}
	if extra := len(snap.Failovers) - MaxFailovers; extra > 0 {
		// Records are keyed by revision, so the first are the oldest.
		for _, k := range snap.FailoverKeys[:extra] {
			if _, err := sc.cli.Delete(ctx, k); err != nil {
				return err
			}
		}
	}
	return nil
}
