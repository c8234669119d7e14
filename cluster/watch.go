package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/spec"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// desired is what the cluster asks of this node, as last read. A stored
// spec or an assignment that does not decode is not taken: the previous
// one stays in force and the error is reported in the node's status, so
// that a bad write never makes a node tear down what it serves.
type desired struct {
	specRev   int64
	specDoc   *SpecDoc
	fleet     *spec.Fleet // nil: no spec (or none parsed yet)
	specErr   error
	assign    Assignment
	assignRev int64
	assignErr error
}

// load takes the spec, this node's assignment and its peers from a
// snapshot.
func (a *Agent) load(snap *Snapshot) {
	a.peers.set(snap.Nodes, a.cfg.Node)
	if err, bad := snap.Bad[KeySpec]; bad {
		a.badSpec(snap.SpecRev, err)
	} else {
		a.setSpec(snap.Spec, snap.SpecRev)
	}
	key := AssignKey(a.cfg.Node)
	if err, bad := snap.Bad[key]; bad {
		a.badAssign(snap.AssignRev[a.cfg.Node], err)
	} else {
		a.setAssign(snap.Assign[a.cfg.Node], snap.AssignRev[a.cfg.Node])
	}
}

func (a *Agent) setSpec(doc *SpecDoc, rev int64) {
	d := &a.desired
	if rev == d.specRev && (doc == nil) == (d.specDoc == nil) && d.specErr == nil {
		return
	}
	d.specRev, d.specDoc = rev, doc
	if doc == nil {
		d.fleet, d.specErr = nil, nil
		return
	}
	f, err := doc.ParseSpec()
	if err != nil {
		a.badSpec(rev, err)
		return
	}
	d.fleet, d.specErr = f, nil
	a.learnHosts()
}

func (a *Agent) badSpec(rev int64, err error) {
	a.desired.specRev = rev
	a.desired.specErr = fmt.Errorf("stored spec (revision %d): %w; serving the previous one", rev, err)
	a.log.Error("stored spec does not parse; keeping the previous one", "rev", rev, "err", err)
}

func (a *Agent) setAssign(as Assignment, rev int64) {
	a.desired.assign, a.desired.assignRev, a.desired.assignErr = as, rev, nil
	for _, n := range as.Names {
		a.held.served[n] = true
	}
}

func (a *Agent) badAssign(rev int64, err error) {
	a.desired.assignErr = fmt.Errorf("assignment (revision %d) does not decode: %w; serving the previous one", rev, err)
	a.log.Error("assignment does not decode; keeping the previous one", "rev", rev, "err", err)
}

// specWatch follows the spec and this node's assignment from a snapshot
// onwards. When the watch ends (etcd compacted past it, or lost its
// leader), it reads everything again and watches from there; while etcd
// cannot be read, retry fires every 500 ms.
type specWatch struct {
	a      *Agent
	ctx    context.Context
	ch     clientv3.WatchChan // nil: not watching
	cancel context.CancelFunc
	retry  *time.Timer
}

// restart reads a snapshot, takes what it says, and watches from it.
func (w *specWatch) restart() bool {
	if w.retry == nil {
		w.retry = time.NewTimer(time.Hour)
	}
	w.stopWatch()
	rctx, cancel := w.a.rpc(w.ctx)
	snap, err := Read(rctx, w.a.cli)
	cancel()
	if err != nil {
		w.retry.Reset(500 * time.Millisecond)
		return false
	}
	w.a.load(snap)
	wctx, wcancel := context.WithCancel(w.ctx)
	w.cancel = wcancel
	w.ch = w.a.cli.Watch(clientv3.WithRequireLeader(wctx), Prefix, clientv3.WithPrefix(), clientv3.WithRev(snap.Rev+1))
	return true
}

func (w *specWatch) stopWatch() {
	if w.cancel != nil {
		w.cancel()
		w.cancel, w.ch = nil, nil
	}
}

func (w *specWatch) stop() {
	w.stopWatch()
	if w.retry != nil {
		w.retry.Stop()
	}
}

// take applies one watch response; it reports whether the spec or this
// node's assignment changed.
func (w *specWatch) take(resp clientv3.WatchResponse, ok bool) bool {
	if !ok || resp.Err() != nil || resp.Canceled {
		return w.restart()
	}
	a := w.a
	changed := false
	for _, ev := range resp.Events {
		if k := string(ev.Kv.Key); strings.HasPrefix(k, NodesPrefix) && NodeOf(k, NodesPrefix) != a.cfg.Node {
			var info NodeInfo
			switch {
			case ev.Type == clientv3.EventTypeDelete:
				a.peers.remove(NodeOf(k, NodesPrefix))
			case json.Unmarshal(ev.Kv.Value, &info) == nil:
				a.peers.put(NodeOf(k, NodesPrefix), info.PeerURL)
			}
			continue
		}
		switch string(ev.Kv.Key) {
		case KeySpec:
			changed = true
			if ev.Type == clientv3.EventTypeDelete {
				a.setSpec(nil, ev.Kv.ModRevision)
				continue
			}
			var doc SpecDoc
			if err := json.Unmarshal(ev.Kv.Value, &doc); err != nil {
				a.badSpec(ev.Kv.ModRevision, err)
				continue
			}
			a.setSpec(&doc, ev.Kv.ModRevision)
		case AssignKey(a.cfg.Node):
			changed = true
			var as Assignment
			if ev.Type != clientv3.EventTypeDelete {
				if err := json.Unmarshal(ev.Kv.Value, &as); err != nil {
					a.badAssign(ev.Kv.ModRevision, err)
					continue
				}
			}
			a.setAssign(as, ev.Kv.ModRevision)
		}
	}
	return changed
}

// learnHosts maps every host veth of the spec to its namespace, so that
// host events name it; the host event of a veth's creation also carries
// the id of its namespace, which maps the events from inside it.
func (a *Agent) learnHosts() map[string]string {
	hostOf := map[string]string{}
	fl := a.desired.fleet
	if fl == nil || a.drift == nil {
		return hostOf
	}
	for i := range fl.Namespaces {
		ns := &fl.Namespaces[i]
		var hs []string
		for _, v := range ns.Veths {
			hs = append(hs, v.Host)
			hostOf[v.Host] = ns.Name
		}
		a.drift.learn(ns.Name, hs, -1)
	}
	return hostOf
}
