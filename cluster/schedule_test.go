package cluster

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("r-%d", i)
	}
	return out
}

// applyPlan returns the assignments after p is written.
func applyPlan(s ClusterView, p Plan) map[string]Assignment {
	out := map[string]Assignment{}
	for n, a := range s.Assign {
		out[n] = a
	}
	for n, a := range p.Assign {
		if len(a.Names) == 0 && len(a.Releasing) == 0 {
			delete(out, n)
		} else {
			out[n] = *a
		}
	}
	return out
}

// checkOnce fails if a name is held by two nodes or a spec name is lost.
func checkOnce(t *testing.T, s ClusterView, as map[string]Assignment, unassigned int) {
	t.Helper()
	seen := map[string]string{}
	for node, a := range as {
		for _, n := range append(append([]string(nil), a.Names...), a.Releasing...) {
			if other, ok := seen[n]; ok {
				t.Fatalf("%s held by %s and %s", n, other, node)
			}
			seen[n] = node
		}
	}
	missing := 0
	for _, n := range s.Names {
		if _, ok := seen[n]; !ok {
			missing++
		}
	}
	if missing != unassigned {
		t.Fatalf("%d names held by no node, plan says %d unassigned", missing, unassigned)
	}
}

func counts(as map[string]Assignment) map[string]int {
	out := map[string]int{}
	for n, a := range as {
		out[n] = len(a.Names)
	}
	return out
}

func alive(ns ...string) map[string]NodeView {
	m := map[string]NodeView{}
	for _, n := range ns {
		m[n] = NodeView{Alive: true, Converged: true}
	}
	return m
}

func TestScheduleFresh(t *testing.T) {
	s := ClusterView{Names: names(10), Nodes: alive("a", "b", "c"), Assign: map[string]Assignment{}}
	p := Schedule(s)
	as := applyPlan(s, p)
	checkOnce(t, s, as, 0)
	c := counts(as)
	if c["a"] != 4 || c["b"] != 3 || c["c"] != 3 {
		t.Fatalf("counts %v, want 4/3/3", c)
	}
	// Stable: scheduling again changes nothing.
	s.Assign = as
	if p2 := Schedule(s); p2.Changed() {
		t.Fatalf("second plan changes %v", p2.Assign)
	}
}

func TestScheduleDeadNodeMovesAtOnce(t *testing.T) {
	s := ClusterView{Names: names(9), Nodes: alive("a", "b", "c"), Assign: map[string]Assignment{}}
	s.Assign = applyPlan(s, Schedule(s))
	s.Nodes["b"] = NodeView{} // lease expired
	p := Schedule(s)
	if p.Orphaned["b"] != 3 {
		t.Fatalf("orphaned %v, want b:3", p.Orphaned)
	}
	as := applyPlan(s, p)
	checkOnce(t, s, as, 0)
	if _, ok := as["b"]; ok {
		t.Fatal("dead node keeps an assignment")
	}
	c := counts(as)
	if c["a"]+c["c"] != 9 || c["a"] < 4 || c["c"] < 4 {
		t.Fatalf("counts %v", c)
	}
	// Survivors kept what they had: only b's three moved.
	if p.Placed["a"]+p.Placed["c"] != 3 {
		t.Fatalf("placed %v, want 3 in all", p.Placed)
	}
}

func TestScheduleDrainIsTwoStep(t *testing.T) {
	s := ClusterView{Names: names(6), Nodes: alive("a", "b"), Assign: map[string]Assignment{}}
	s.Assign = applyPlan(s, Schedule(s))
	s.Nodes["a"] = NodeView{Alive: true, Cordoned: true, Converged: true}
	p := Schedule(s)
	s.Assign = applyPlan(s, p)
	checkOnce(t, s, s.Assign, 0)
	if len(s.Assign["a"].Releasing) != 3 || len(s.Assign["a"].Names) != 0 || len(s.Assign["b"].Names) != 3 {
		t.Fatalf("after cordon %v", s.Assign)
	}
	// a has not torn them down yet: nothing placed.
	s.Nodes["a"] = NodeView{Alive: true, Cordoned: true, Converged: false}
	if p := Schedule(s); p.Changed() {
		t.Fatalf("placed before the old node converged: %v", p.Assign)
	}
	s.Nodes["a"] = NodeView{Alive: true, Cordoned: true, Converged: true}
	s.Assign = applyPlan(s, Schedule(s))
	checkOnce(t, s, s.Assign, 0)
	if _, ok := s.Assign["a"]; ok || len(s.Assign["b"].Names) != 6 {
		t.Fatalf("after drain %v", s.Assign)
	}
}

func TestScheduleAddNodeMovesOnlyWhatBalanceNeeds(t *testing.T) {
	s := ClusterView{Names: names(12), Nodes: alive("a", "b"), Assign: map[string]Assignment{}}
	s.Assign = applyPlan(s, Schedule(s))
	s.Nodes["c"] = NodeView{Alive: true, Converged: true}
	p := Schedule(s)
	if p.Released != 4 {
		t.Fatalf("released %d, want 4 (6+6 -> 4+4+4)", p.Released)
	}
	s.Assign = applyPlan(s, p)
	s.Assign = applyPlan(s, Schedule(s)) // a and b converged: place
	checkOnce(t, s, s.Assign, 0)
	c := counts(s.Assign)
	if c["a"] != 4 || c["b"] != 4 || c["c"] != 4 {
		t.Fatalf("counts %v", c)
	}
}

func TestScheduleCapacityAndSpecChanges(t *testing.T) {
	s := ClusterView{Names: names(10), Nodes: alive("a", "b"), Assign: map[string]Assignment{}}
	s.Nodes["a"] = NodeView{Alive: true, Converged: true, Capacity: 2}
	s.Nodes["b"] = NodeView{Alive: true, Converged: true, Capacity: 3}
	p := Schedule(s)
	if p.Unassigned != 5 {
		t.Fatalf("unassigned %d, want 5", p.Unassigned)
	}
	s.Assign = applyPlan(s, p)
	checkOnce(t, s, s.Assign, 5)
	s.Names = names(3) // the spec shrinks
	s.Assign = applyPlan(s, Schedule(s))
	checkOnce(t, s, s.Assign, 0)
	for _, a := range s.Assign {
		for _, n := range a.Names {
			if n != "r-0" && n != "r-1" && n != "r-2" {
				t.Fatalf("%s kept after it left the spec", n)
			}
		}
	}
}

// TestScheduleRandom drives random node deaths, joins, cordons and
// convergence and checks that no name is ever held twice.
func TestScheduleRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		s := ClusterView{Names: names(rng.IntN(50)), Nodes: map[string]NodeView{}, Assign: map[string]Assignment{}}
		for step := 0; step < 30; step++ {
			node := fmt.Sprintf("n%d", rng.IntN(5))
			v := s.Nodes[node]
			switch rng.IntN(5) {
			case 0:
				v.Alive = !v.Alive
			case 1:
				v.Cordoned = !v.Cordoned
			case 2:
				v.Converged = !v.Converged
			case 3:
				v.Capacity = rng.IntN(20)
			case 4:
				s.Names = names(rng.IntN(50))
			}
			s.Nodes[node] = v
			p := Schedule(s)
			s.Assign = applyPlan(s, p)
			checkOnce(t, s, s.Assign, p.Unassigned)
		}
	}
}

// More than half of the nodes lost at once: nothing moves (it is likelier
// the network or etcd), until an operator forces a node's failover or the
// nodes come back; one node lost of three moves as usual.
func TestScheduleHoldsMassLoss(t *testing.T) {
	s := ClusterView{Names: names(9), Nodes: alive("a", "b", "c"), Assign: map[string]Assignment{}}
	s.Assign = applyPlan(s, Schedule(s))
	before := s.Assign
	delete(s.Nodes, "b")
	delete(s.Nodes, "c")
	p := Schedule(s)
	if p.Changed() || len(p.Held) != 2 || len(p.Orphaned) != 0 {
		t.Fatalf("two of three lost: plan %+v, want nothing moved and b, c held", p)
	}
	// They come back: everything is where it was.
	s.Nodes = alive("a", "b", "c")
	if p := Schedule(s); p.Changed() || len(p.Held) != 0 {
		t.Fatalf("after the return: plan %+v", p)
	}
	// An operator forces c's failover while b and c are still lost.
	delete(s.Nodes, "b")
	delete(s.Nodes, "c")
	s.Forced = map[string]bool{"c": true}
	p = Schedule(s)
	if p.Orphaned["c"] != 3 || len(p.Held) != 1 || p.Held[0] != "b" {
		t.Fatalf("forced c: plan %+v", p)
	}
	as := applyPlan(s, p)
	checkOnce(t, s, as, 0)
	if !equal(as["b"].Names, before["b"].Names) {
		t.Fatalf("held b's names moved: %v", as["b"])
	}
	// Then b alone is lost of a and b: not more than half: it moves.
	s.Assign, s.Forced = as, nil
	if p := Schedule(s); p.Orphaned["b"] != 3 {
		t.Fatalf("one of two lost: plan %+v", p)
	}
}

// A node that comes back (new lease after a pause or partition) gets
// nothing moved onto it by balance while it settles; moves are bounded
// per plan; new names still go to it.
func TestScheduleNoFlapping(t *testing.T) {
	s := ClusterView{Names: names(9), Nodes: alive("a", "b", "c"), Assign: map[string]Assignment{}}
	s.Assign = applyPlan(s, Schedule(s))
	// b lost: its names move to a and c.
	delete(s.Nodes, "b")
	s.Assign = applyPlan(s, Schedule(s))
	// b is back, settling: nothing moves to it.
	s.Nodes["b"] = NodeView{Alive: true, Converged: true, Settling: true}
	if p := Schedule(s); p.Released != 0 {
		t.Fatalf("balance moved %d onto a settling node: %+v", p.Released, p.Assign)
	}
	// A new name goes to it all the same (least loaded).
	s.Names = names(10)
	p := Schedule(s)
	if p.Placed["b"] != 1 {
		t.Fatalf("new name placed %v, want on b", p.Placed)
	}
	s.Assign = applyPlan(s, p)
	// Settled: balance, at most two moves per plan.
	s.Nodes["b"] = NodeView{Alive: true, Converged: true}
	s.MaxMoves = 2
	p = Schedule(s)
	if p.Released != 2 {
		t.Fatalf("released %d, want 2 (bounded)", p.Released)
	}
	checkOnce(t, s, applyPlan(s, p), 0)
}

// Leases revoked together (an etcd leader that resumed after a pause)
// come back one node at a time: the last one still lost counts with the
// ones back within the TTL, and nothing moves.
func TestScheduleMassLossWithinTTL(t *testing.T) {
	s := ClusterView{Names: names(9), Nodes: alive("a", "b", "c"), Assign: map[string]Assignment{}}
	s.Assign = applyPlan(s, Schedule(s))
	s.Nodes["a"] = NodeView{Alive: true, Converged: true, Returned: true}
	s.Nodes["b"] = NodeView{Alive: true, Converged: true, Returned: true}
	delete(s.Nodes, "c")
	if p := Schedule(s); p.Changed() || len(p.Held) != 1 || len(p.Remember) != 0 {
		t.Fatalf("c lost with a and b back within the TTL: plan %+v, want c held, not remembered", p)
	}
	// Later, a and b long back: c alone is lost, it fails over.
	s.Nodes = alive("a", "b")
	if p := Schedule(s); p.Orphaned["c"] != 3 {
		t.Fatalf("c lost alone: plan %+v", p)
	}
}

// Two of three nodes killed together expire one at a time: when the
// first is gone the second still holds a lease that missed its renewal
// (Suspect). Nothing moves then, nor once the second expires; if the
// suspect renews after all, the lone loss fails over.
func TestScheduleMassLossSuspect(t *testing.T) {
	s := ClusterView{Names: names(9), Nodes: alive("a", "b", "c"), Assign: map[string]Assignment{}}
	s.Assign = applyPlan(s, Schedule(s))
	delete(s.Nodes, "c")
	s.Nodes["b"] = NodeView{Alive: true, Converged: true, Suspect: true}
	if p := Schedule(s); p.Changed() || len(p.Held) != 1 || len(p.Remember) != 0 {
		t.Fatalf("c lost, b suspect: plan %+v, want c held, not remembered", p)
	}
	// b expires too: a firm mass loss, remembered.
	lost := s
	lost.Nodes = alive("a")
	if p := Schedule(lost); p.Changed() || len(p.Held) != 2 || len(p.Remember) != 2 {
		t.Fatalf("b and c lost: plan %+v, want both held and remembered", p)
	}
	// b renews instead: c alone is lost, and fails over.
	s.Nodes["b"] = NodeView{Alive: true, Converged: true}
	if p := Schedule(s); p.Orphaned["c"] != 3 {
		t.Fatalf("c lost alone: plan %+v", p)
	}
}

// A lease is suspect when less than half its TTL is left, as etcd tells
// it (whole seconds, rounded down).
func TestLeaseSuspect(t *testing.T) {
	for _, c := range []struct {
		left, granted int64
		want          bool
	}{
		{3, 5, false}, {2, 5, false}, {1, 5, true}, {0, 5, true},
		{2, 4, false}, {1, 4, true},
		{1, 2, false}, {0, 2, true},
		{-1, 5, false}, // lease gone: dead, not suspect
		{60, 60, false}, {28, 60, true},
	} {
		if got := leaseSuspect(c.left, c.granted); got != c.want {
			t.Errorf("leaseSuspect(%d left of %d) = %v, want %v", c.left, c.granted, got, c.want)
		}
	}
}

func TestPending(t *testing.T) {
	snap := &Snapshot{
		Names:     []string{"r-1", "r-2"},
		SpecRev:   10,
		Nodes:     map[string]NodeInfo{"a": {}, "b": {}},
		Assign:    map[string]Assignment{"a": {Names: []string{"r-1"}}, "b": {Names: []string{"r-2"}}},
		AssignRev: map[string]int64{"a": 5, "b": 6},
		Status:    map[string]NodeStatus{"a": {AssignRev: 5, SpecRev: 10}, "b": {AssignRev: 6, SpecRev: 9, Ready: 0, Assigned: 1}},
	}
	if p := Pending(snap, nil); !strings.Contains(p, "b has not converged to spec revision 10") {
		t.Errorf("b behind the spec: %q", p)
	}
	if p := Pending(snap, []string{"r-1"}); p != "" {
		t.Errorf("r-1 on a converged node: %q", p)
	}
	snap.Status["b"] = NodeStatus{AssignRev: 6, SpecRev: 10}
	if p := Pending(snap, nil); p != "" {
		t.Errorf("all converged: %q", p)
	}
	// Everything deleted: ready only once no node says it still serves.
	gone := &Snapshot{Nodes: snap.Nodes, Status: map[string]NodeStatus{"a": {AssignRev: 5, SpecRev: 10, Assigned: 1, Ready: 1}, "b": {}}}
	if p := Pending(gone, nil); !strings.Contains(p, "a still serves 1 namespaces") {
		t.Errorf("a spec deleted, a not torn down yet: %q", p)
	}
	gone.Status["a"] = NodeStatus{AssignRev: 5, SpecRev: 11}
	if p := Pending(gone, nil); p != "" {
		t.Errorf("a spec deleted and torn down: %q", p)
	}
	delete(snap.Nodes, "b")
	if p := Pending(snap, []string{"r-2"}); !strings.Contains(p, "b is lost") {
		t.Errorf("r-2 on a lost node: %q", p)
	}
	if p := Pending(snap, []string{"r-9"}); !strings.Contains(p, "not assigned") {
		t.Errorf("unknown name: %q", p)
	}
}

// A hold outlasts the moment that looked like a mass loss: once c's
// failover is forced, b (still lost, its hold remembered) stays held.
func TestScheduleHoldIsRemembered(t *testing.T) {
	s := ClusterView{Names: names(9), Nodes: alive("a", "b", "c"), Assign: map[string]Assignment{}}
	s.Assign = applyPlan(s, Schedule(s))
	delete(s.Nodes, "b")
	delete(s.Nodes, "c")
	p := Schedule(s)
	if len(p.Held) != 2 || len(p.Remember) != 2 {
		t.Fatalf("held %v, remembered %v, want b and c both", p.Held, p.Remember)
	}
	s.Held = map[string]bool{"b": true, "c": true}
	s.Forced = map[string]bool{"c": true}
	s.Assign = applyPlan(s, Schedule(s))
	s.Forced = nil
	// c failed over; b alone is lost of a and b, but its hold is kept.
	if p := Schedule(s); p.Changed() || len(p.Held) != 1 || p.Held[0] != "b" {
		t.Fatalf("after c's forced failover: plan %+v, want b still held", p)
	}
	// b returns: nothing held, nothing moved.
	s.Nodes = alive("a", "b")
	if p := Schedule(s); len(p.Held) != 0 {
		t.Fatalf("b back: held %v", p.Held)
	}
}

// A node whose agent runs an older layout keeps its names, gets none new,
// and is not drained or balanced.
func TestScheduleFrozen(t *testing.T) {
	s := ClusterView{Names: names(6), Nodes: alive("a", "b"), Assign: map[string]Assignment{
		"a": {Names: []string{"r-0", "r-1", "r-2", "r-3", "r-4"}},
	}}
	v := s.Nodes["a"]
	v.Frozen = true
	s.Nodes["a"] = v
	p := Schedule(s)
	if p.Assign["a"] != nil {
		t.Errorf("frozen a rewritten: %+v", p.Assign["a"])
	}
	if b := p.Assign["b"]; b == nil || len(b.Names) != 1 || b.Names[0] != "r-5" {
		t.Errorf("b = %+v, want only the unplaced r-5", b)
	}
	// Dead, it fails over as any node.
	delete(s.Nodes, "a")
	s.Nodes["c"] = NodeView{Alive: true, Converged: true}
	if p := Schedule(s); p.Orphaned["a"] != 5 {
		t.Errorf("frozen a lost: %+v", p)
	}
}

// Buckets spread names evenly enough to keep every value small, and
// assignOps writes only the buckets that changed.
func TestAssignBuckets(t *testing.T) {
	count := make([]int, AssignBuckets)
	var all []string
	for i := range 40000 {
		n := fmt.Sprintf("qrouter-%d", i)
		all = append(all, n)
		count[Bucket(n)]++
	}
	if lo, hi := slices.Min(count), slices.Max(count); lo < 500 || hi > 800 {
		t.Errorf("40,000 names over %d buckets: %d to %d per bucket", AssignBuckets, lo, hi)
	}
	snap := &Snapshot{Parts: map[string]Assignment{}}
	ops := assignOps(snap, map[string]*Assignment{"a": {Names: all}})
	if len(ops) != AssignBuckets {
		t.Fatalf("first write: %d ops, want %d", len(ops), AssignBuckets)
	}
	for _, op := range ops {
		var a Assignment
		if err := json.Unmarshal(op.ValueBytes(), &a); err != nil || len(op.ValueBytes()) > MaxValueBytes {
			t.Fatalf("%s: %d bytes, %v", op.KeyBytes(), len(op.ValueBytes()), err)
		}
		snap.Parts[string(op.KeyBytes())] = a
	}
	moved := &Assignment{Names: all[1:], Releasing: all[:1]}
	if ops := assignOps(snap, map[string]*Assignment{"a": moved}); len(ops) != 1 || string(ops[0].KeyBytes()) != AssignKey("a", Bucket(all[0])) {
		t.Errorf("one name released: %d ops", len(ops))
	}
	if ops := assignOps(snap, map[string]*Assignment{"a": {}}); len(ops) != AssignBuckets || !ops[0].IsDelete() {
		t.Errorf("emptied: %d ops", len(ops))
	}
	if b := batches(ops); len(b) != 1 {
		t.Errorf("64 ops cut into %d transactions", len(b))
	}
	many := make([]clientv3.Op, 300)
	for i := range many {
		many[i] = clientv3.OpPut("k", "v")
	}
	if b := batches(many); len(b) != 3 || len(b[0]) != maxTxnOps {
		t.Errorf("300 ops: %d transactions", len(b))
	}
	big := strings.Repeat("x", maxTxnBytes/3-len("k")-16) // a third, framing included
	for i := range 10 {
		many[i] = clientv3.OpPut("k", big)
	}
	if b := batches(many[:10]); len(b) != 4 {
		t.Errorf("10 ops of a third of the byte limit: %d transactions, want 4", len(b))
	}
}

// TestFailoverRecordsPerNode: two nodes lost in one plan keep a record
// each, and a record of the layout before (no node part) is still read.
func TestFailoverRecordsPerNode(t *testing.T) {
	s := &Snapshot{Bad: map[string]error{}}
	keys := []string{FailoverPrefix + "00000000000000000007", FailoverKey(9, "a"), FailoverKey(9, "b")}
	for i, k := range keys {
		if err := s.take(k, []byte(encode(Failover{Node: string(rune('x' + i))})), 9); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.Failovers) != 3 || len(s.Bad) != 0 || !slices.Equal(s.FailoverKeys, keys) {
		t.Fatalf("records %v under keys %v (bad %v), want 3 under %v", s.Failovers, s.FailoverKeys, s.Bad, keys)
	}
	if FailoverKey(9, "a") == FailoverKey(9, "b") {
		t.Fatal("two nodes lost in one plan share a key")
	}
}
