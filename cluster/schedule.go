package cluster

import (
	"slices"
	"sort"
)

// NodeView is what the scheduler knows of one node.
type NodeView struct {
	Alive    bool // its lease is held (nodes/NODE exists)
	Cordoned bool
	Capacity int // 0: no limit
	// AllowProcesses: the agent serves namespaces that run processes
	// (State.NeedsProcesses); others never hold them.
	AllowProcesses bool
	// Converged: the node has done what its current assignment asks, so
	// the names it was releasing are gone from it.
	Converged bool
	// Settling: the node came back recently (a new lease after it lost
	// one, or a failover of its namespaces): it is placed new and
	// orphaned names like any node, but balance moves nothing onto it
	// until its membership has been stable, so that one blip moves
	// routers once, not twice.
	Settling bool
	// Returned: the node came back with a new lease within the last
	// lease TTL: for the mass-loss rule it was lost in that window.
	Returned bool
	// Suspect: the node's lease is held but has missed a renewal (less
	// than half its TTL left, where a renewing agent keeps two thirds):
	// it may be dying with the dead ones. Nodes killed together expire up
	// to a renewal interval plus etcd's revoke tick apart, so the first to
	// expire would otherwise look like a lone loss. For the mass-loss rule
	// it counts as lost, as Returned does; it stops counting once it
	// renews, and the next round fails the lone loss over.
	Suspect bool
	// Frozen: the node's agent runs an older key layout (an upgrade in
	// progress): it keeps what it holds and is given and asked nothing.
	Frozen bool
}

// ClusterView is one consistent read of the cluster.
type ClusterView struct {
	Names  []string // the spec's namespaces, in declaration order
	Nodes  map[string]NodeView
	Assign map[string]Assignment // by node; nodes without a key have none
	// Forced: dead nodes whose namespaces an operator had moved even
	// though more than half of the nodes are lost (cluster failover).
	Forced map[string]bool
	// Held: dead nodes whose failover a previous plan held. They stay held
	// (until they return or are forced) even when the loss no longer looks
	// massive: forcing one node's failover must not release the others.
	Held map[string]bool
	// NeedsProcesses: the names whose spec runs processes; only nodes
	// that allow them hold these, other names go anywhere.
	NeedsProcesses map[string]bool
	// MaxMoves bounds the names balance releases in one plan (0: no
	// bound). Failover and drain are not bounded.
	MaxMoves int
	// Linked: the links between namespaces (nil: none). Placement keeps
	// linked namespaces on one node where balance allows, since a link
	// between two nodes is a tunnel.
	Linked Graph
}

// Plan is the scheduler's decision: the assignments to write (only the
// nodes whose assignment changes; a nil Names and Releasing deletes the
// key) and what it did, for the record.
type Plan struct {
	Assign map[string]*Assignment
	// Orphaned maps each dead node to how many of its namespaces were
	// placed elsewhere (or left unplaced for want of capacity).
	Orphaned   map[string]int
	Placed     map[string]int // new namespaces by node (orphans included)
	Released   int            // put in Releasing (drain, balance)
	Unassigned int            // namespaces no node had room for
	// Held: dead nodes whose namespaces stay where they are, because more
	// than half of the nodes are lost at once (see Schedule).
	Held []string
	// Remember: the held nodes whose hold outlasts this plan (State.Held):
	// those lost with most nodes dead at once, not those held only because
	// others came back within the TTL.
	Remember []string
}

// Changed reports whether the plan writes anything.
func (p *Plan) Changed() bool { return len(p.Assign) > 0 }

// Schedule decides where every namespace of the spec goes. It is pure: the
// same state gives the same plan. Rules, in order:
//
//   - names no longer in the spec are dropped (their node tears them down);
//   - a dead node's names are placed on the live nodes at once, unless
//     more than half of the nodes that hold an assignment or a lease are
//     dead at once: that is far likelier a network or etcd failure than
//     half the gateways failing together, and moving everything would
//     turn it into an outage when they come back; their names stay put
//     (Plan.Held) until they return or an operator forces the move;
//   - a Frozen node keeps its names as they are and gets none;
//   - a cordoned node releases all its names, a node that does not allow
//     processes those that need them; names released by a node are
//     placed only once that node has converged (two-step move);
//   - unplaced names go to the least-loaded eligible node with room
//     (eligible: alive, not cordoned, allowing processes if the name
//     needs them), ties by name;
//   - when nothing is in flight, a node above the balanced share releases
//     only its excess, and only while another node has room below it, so
//     adding a node moves what balance needs and no more; at most
//     MaxMoves names per plan, and none towards a Settling node.
func Schedule(s ClusterView) Plan {
	p := Plan{Assign: map[string]*Assignment{}, Orphaned: map[string]int{}, Placed: map[string]int{}}
	order := make(map[string]int, len(s.Names))
	for i, n := range s.Names {
		order[n] = i
	}
	next := map[string]*Assignment{}
	held := map[string]bool{}   // released by a node that has not converged yet
	placed := map[string]bool{} // assigned to a live node
	var pool []string
	nodes := sortedKeys(s.Assign)
	firm, within := massLoss(s)
	for _, node := range nodes {
		a := s.Assign[node]
		v := s.Nodes[node]
		if !v.Alive && (firm || within || s.Held[node]) && !s.Forced[node] {
			for _, name := range append(append([]string(nil), a.Names...), a.Releasing...) {
				placed[name] = true
			}
			p.Held = append(p.Held, node)
			if firm || s.Held[node] {
				p.Remember = append(p.Remember, node)
			}
			continue
		}
		if !v.Alive {
			n := 0
			for _, name := range append(append([]string(nil), a.Names...), a.Releasing...) {
				if _, ok := order[name]; ok && !placed[name] {
					pool = append(pool, name)
					placed[name] = true // queued once, even if listed twice
					n++
				}
			}
			if n > 0 {
				p.Orphaned[node] = n
			}
			next[node] = nil
			continue
		}
		na := &Assignment{}
		if v.Frozen {
			for _, name := range a.Names {
				if _, ok := order[name]; ok && !placed[name] {
					na.Names = append(na.Names, name)
					placed[name] = true
				}
			}
			na.Releasing = a.Releasing
			next[node] = na
			continue
		}
		for _, name := range a.Releasing {
			if _, ok := order[name]; !ok || placed[name] {
				continue
			}
			if v.Converged {
				pool = append(pool, name)
				placed[name] = true
			} else {
				na.Releasing = append(na.Releasing, name)
				held[name] = true
				placed[name] = true
			}
		}
		for _, name := range a.Names {
			if _, ok := order[name]; !ok || placed[name] {
				continue // gone from the spec, or already someone else's
			}
			placed[name] = true
			if v.Cordoned || !s.allowed(node, name) {
				na.Releasing = append(na.Releasing, name)
				p.Released++
			} else {
				na.Names = append(na.Names, name)
			}
		}
		next[node] = na
	}
	for _, name := range s.Names {
		if !placed[name] {
			pool = append(pool, name)
		}
	}
	sort.SliceStable(pool, func(i, j int) bool { return order[pool[i]] < order[pool[j]] })

	elig := place(s, next, pool, &p)

	// Balance, only when nothing is in flight and nothing is held.
	if len(held) == 0 && len(pool) == 0 && len(elig) > 1 && len(p.Held) == 0 {
		p.Released += balance(s, next, elig)
	}

	p.writes(s, next)
	return p
}

// place gives each name of pool to the least-loaded eligible node (alive,
// not cordoned, not frozen) with room that allows it, ties by name, and
// returns the eligible nodes; names no node can take count as unassigned.
// A name with links goes instead where most of its linked names already
// are, weighed against how full that node is (linear deterministic
// greedy, Stanton and Kliot 2012: neighbours × (1 − load/share), the
// share being an even split of everything placed, so that balance has
// nothing to move after): a generated topology,
// placed in its own order, ends up in contiguous blocks with few links
// between nodes, and a lost node's routers go where their neighbours are.
func place(s ClusterView, next map[string]*Assignment, pool []string, p *Plan) []string {
	// Eligible nodes, least loaded first.
	var elig []string
	for _, node := range sortedKeys(s.Nodes) {
		v := s.Nodes[node]
		if v.Alive && !v.Cordoned && !v.Frozen {
			elig = append(elig, node)
			if next[node] == nil {
				next[node] = &Assignment{}
			}
		}
	}
	load := func(node string) int { return len(next[node].Names) + len(next[node].Releasing) }
	room := func(node string) bool {
		c := s.Nodes[node].Capacity
		return c <= 0 || load(node) < c
	}
	var where map[string]string
	share := 0.0
	if len(s.Linked) > 0 && len(elig) > 0 {
		where = map[string]string{}
		total := len(pool)
		for _, node := range elig {
			for _, n := range slices.Concat(next[node].Names, next[node].Releasing) {
				where[n] = node
			}
			total += load(node)
		}
		share = float64((total + len(elig) - 1) / len(elig)) // an even split, rounded up
	}
	for _, name := range pool {
		best, bestScore := "", 0.0
		for _, node := range elig {
			if !room(node) || !s.allowed(node, name) {
				continue
			}
			score := 0.0
			if where != nil {
				near := 0
				for _, o := range s.Linked[name] {
					if where[o] == node {
						near++
					}
				}
				score = float64(near) * (1 - float64(load(node))/share)
			}
			if best == "" || score > bestScore || score == bestScore && load(node) < load(best) {
				best, bestScore = node, score
			}
		}
		if best == "" {
			p.Unassigned++
			continue
		}
		next[best].Names = append(next[best].Names, name)
		if where != nil {
			where[name] = best
		}
		p.Placed[best]++
	}
	return elig
}

// allowed reports whether node may hold name: any name, unless the name
// runs processes and the node does not allow them.
func (s *ClusterView) allowed(node, name string) bool {
	return !s.NeedsProcesses[name] || s.Nodes[node].AllowProcesses
}

// writes records in p the assignments of next that differ from s's (an
// empty one deletes the key).
func (p *Plan) writes(s ClusterView, next map[string]*Assignment) {
	for node, na := range next {
		old, had := s.Assign[node]
		if na == nil || (len(na.Names) == 0 && len(na.Releasing) == 0) {
			if had {
				p.Assign[node] = &Assignment{}
			}
			continue
		}
		if !had || !equal(old.Names, na.Names) || !equal(old.Releasing, na.Releasing) {
			p.Assign[node] = na
		}
	}
}

// balance moves one name at a time from the fullest eligible node to the
// emptiest with room (not settling), while they differ by more than one,
// at most s.MaxMoves; each move narrows the gap, so the moves are few. The
// name moved is the fullest node's last that the emptiest may hold; when
// it may hold none, balance stops there. It returns how many names it put
// in Releasing.
func balance(s ClusterView, next map[string]*Assignment, elig []string) int {
	count, moves := map[string]int{}, 0
	for _, node := range elig {
		count[node] = len(next[node].Names)
	}
	for {
		hi, lo := "", ""
		for _, node := range elig {
			if hi == "" || count[node] > count[hi] {
				hi = node
			}
			c := s.Nodes[node].Capacity
			if (c <= 0 || count[node] < c) && !s.Nodes[node].Settling && (lo == "" || count[node] < count[lo]) {
				lo = node
			}
		}
		if lo == "" || count[hi]-count[lo] <= 1 || s.MaxMoves > 0 && moves >= s.MaxMoves {
			return moves
		}
		a := next[hi]
		i := len(a.Names) - 1
		for i >= 0 && !s.allowed(lo, a.Names[i]) {
			i--
		}
		if i < 0 {
			return moves
		}
		moves++
		count[hi]--
		count[lo]++
		name := a.Names[i]
		a.Names = slices.Delete(a.Names, i, i+1)
		a.Releasing = append(a.Releasing, name)
	}
}

// massLoss reports whether more than half of the nodes that hold an
// assignment or a lease are lost: dead now (an assignment, no lease), or
// (within) back with a new lease within the last TTL, since leases
// revoked together (by an etcd leader that resumed after a pause) come
// back one node at a time, or Suspect, since leases of nodes killed
// together expire one at a time. Only a loss of dead nodes alone (firm)
// is remembered past that moment (State.Held).
func massLoss(s ClusterView) (firm, within bool) {
	dead, returned, total := 0, 0, 0
	for _, v := range s.Nodes {
		if v.Alive {
			total++
			if v.Returned || v.Suspect {
				returned++
			}
		}
	}
	for node, a := range s.Assign {
		if v, ok := s.Nodes[node]; ok && v.Alive {
			continue
		}
		if len(a.Names)+len(a.Releasing) > 0 {
			dead++
			total++
		}
	}
	return dead > 0 && 2*dead > total, dead > 0 && 2*(dead+returned) > total
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
