package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/spec"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// desired is what the cluster asks of this node, as last read: every
// stored namespace (catalog) and this node's assignment, kept up to date
// key by key from one watch. An assignment bucket or a namespace whose
// value does not decode is not taken: the previous value stays in force
// and the error is reported in the node's status, so that a bad write
// never makes a node tear down what it serves.
type desired struct {
	// rev is the etcd revision up to which every change was taken.
	rev     int64
	catalog *catalog
	// parts are this node's assignment buckets by key; assign is their
	// union, rebuilt when one changes.
	parts     map[string]Assignment
	assign    Assignment
	assignBad map[string]error // bucket key -> why it does not decode
	// tunnels are the other live nodes' tunnel addresses, by node.
	tunnels map[string]netip.Addr
}

// setTunnel records node's tunnel address (invalid: none, or the node is
// gone) and reports whether that changed anything.
func (d *desired) setTunnel(node string, addr netip.Addr) bool {
	if d.tunnels == nil {
		d.tunnels = map[string]netip.Addr{}
	}
	old, had := d.tunnels[node]
	if !addr.IsValid() {
		delete(d.tunnels, node)
		return had
	}
	d.tunnels[node] = addr
	return !had || old != addr
}

// tunnelPeers lists the other nodes' tunnel addresses, sorted.
func (d *desired) tunnelPeers() []netip.Addr {
	out := make([]netip.Addr, 0, len(d.tunnels))
	for _, a := range d.tunnels {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// tunnelList is tunnelPeers as one string, for Decide.
func (d *desired) tunnelList() string {
	var b strings.Builder
	for _, a := range d.tunnelPeers() {
		b.WriteString(a.String() + " ")
	}
	return b.String()
}

// tunnelAddr reads a node's announced tunnel address (invalid: none).
func tunnelAddr(info NodeInfo) netip.Addr {
	a, err := netip.ParseAddr(info.TunnelAddr)
	if err != nil {
		return netip.Addr{}
	}
	return a
}

// catalog holds every stored namespace as its raw value and decodes one
// only when the agent needs it (those assigned here, and pins): an agent
// of a 40,000-namespace cluster keeps 40,000 small values, not 40,000
// expanded namespaces, and a change costs one decode.
type catalog struct {
	raw     map[string][]byte          // name -> stored value
	decoded map[string]*spec.Namespace // decoded on demand; dropped when the value changes
	bad     map[string]error           // values that do not decode (the previous decoded one is kept)
}

func newCatalog() *catalog {
	return &catalog{raw: map[string][]byte{}, decoded: map[string]*spec.Namespace{}, bad: map[string]error{}}
}

// Has reports whether name is stored (whether or not its value decodes).
func (c *catalog) Has(name string) bool { _, ok := c.raw[name]; return ok }

// Lookup returns what name is to be: decoded from its stored value, or the
// last value that decoded when the current one does not.
func (c *catalog) Lookup(name string) (*spec.Namespace, bool) {
	if ns, ok := c.decoded[name]; ok {
		return ns, true
	}
	val, ok := c.raw[name]
	if !ok {
		return nil, false
	}
	ns, err := DecodeNamespace(name, val)
	if err != nil {
		c.bad[name] = err
		return nil, false
	}
	c.decoded[name] = ns
	return ns, true
}

// put takes a new value of name. A value is decoded here only if the
// previous one was (the agent uses it), so that a full apply costs each
// agent no decode of what other nodes serve; one that does not decode
// leaves the previous value in force (Lookup finds the others' errors).
func (c *catalog) put(name string, val []byte) {
	c.raw[name] = val
	delete(c.bad, name)
	_, used := c.decoded[name]
	if !used {
		return
	}
	if ns, err := DecodeNamespace(name, val); err != nil {
		c.bad[name] = err // prev stays
	} else {
		c.decoded[name] = ns
	}
}

func (c *catalog) remove(name string) {
	delete(c.raw, name)
	delete(c.decoded, name)
	delete(c.bad, name)
}

// subset is the fleet of the named namespaces that decode. A namespace
// whose name or host interface an earlier one has (written around apply's
// check) is left out: it fails to serve rather than fail the others.
func (c *catalog) subset(names []string) *spec.Fleet {
	nss := make([]spec.Namespace, 0, len(names))
	seen := map[string]bool{}
	for _, n := range names {
		ns, ok := c.Lookup(n)
		if !ok || seen["ns:"+n] {
			continue
		}
		clash := false
		for _, v := range ns.Veths {
			clash = clash || seen["if:"+v.Host]
		}
		if clash {
			continue
		}
		seen["ns:"+n] = true
		for _, v := range ns.Veths {
			seen["if:"+v.Host] = true
		}
		nss = append(nss, *ns)
	}
	f, _ := spec.FleetOf("cluster", nss) // no duplicates left
	return f
}

// errs says which of names have a stored value that does not decode.
func (c *catalog) errs(names []string) error {
	var errs []error
	for _, n := range names {
		if _, done := c.decoded[n]; !done {
			c.Lookup(n) // decodes it now, or notes why not
		}
		if err, bad := c.bad[n]; bad {
			errs = append(errs, fmt.Errorf("stored namespace %s does not decode: %w; serving the previous value", n, err))
			if len(errs) == 3 {
				break
			}
		}
	}
	return errors.Join(errs...)
}

// load takes the namespaces, this node's assignment and its peers from a
// full read (ns values included).
func (a *Agent) load(snap *Snapshot, nsKvs map[string][]byte) {
	a.peers.set(snap.Nodes, a.cfg.Node)
	d := &a.desired
	d.tunnels = nil
	for n, info := range snap.Nodes {
		if n != a.cfg.Node {
			d.setTunnel(n, tunnelAddr(info))
		}
	}
	d.rev = snap.Rev
	old := d.catalog
	d.catalog = newCatalog()
	var changed []string // while the watch was down
	for name, val := range nsKvs {
		if old != nil && string(old.raw[name]) == string(val) {
			d.catalog.raw[name] = old.raw[name]
			if ns, ok := old.decoded[name]; ok {
				d.catalog.decoded[name] = ns // same pointer: Decide sees no change
			}
			continue
		}
		d.catalog.put(name, val)
		changed = append(changed, name)
	}
	prefix := AssignNodePrefix(a.cfg.Node)
	parts := map[string]Assignment{}
	for k, v := range snap.Parts {
		if strings.HasPrefix(k, prefix) {
			parts[k] = v
		}
	}
	bad := map[string]error{}
	for k, err := range snap.Bad {
		if strings.HasPrefix(k, prefix) {
			bad[k] = err
			if prev, ok := d.parts[k]; ok {
				parts[k] = prev
			}
		}
	}
	d.parts, d.assignBad = parts, bad
	a.mergeAssign()
	var served []string
	for _, n := range changed {
		if isIn(d.assign.Names, n) {
			served = append(served, n)
		}
	}
	a.learnHosts(served)
}

// mergeAssign rebuilds the assignment from its buckets.
func (a *Agent) mergeAssign() {
	d := &a.desired
	var as Assignment
	for _, k := range sortedKeys(d.parts) {
		as.Names = append(as.Names, d.parts[k].Names...)
		as.Releasing = append(as.Releasing, d.parts[k].Releasing...)
	}
	slices.Sort(as.Names)
	// Only names new to the assignment are learned: a bucket's event must
	// not cost a walk of every namespace the node serves.
	var added []string
	for _, n := range as.Names {
		if !isIn(d.assign.Names, n) {
			added = append(added, n)
		}
		a.held.served[n] = true
	}
	d.assign = as
	a.assigned.Store(&as.Names)
	a.learnHosts(added)
}

// assignErr says which buckets of the assignment do not decode.
func (d *desired) assignErr() error {
	var errs []error
	for _, k := range sortedKeys(d.assignBad) {
		errs = append(errs, fmt.Errorf("assignment %s does not decode: %w; serving the previous one", k, d.assignBad[k]))
	}
	return errors.Join(errs...)
}

// readAll reads a snapshot and, at its revision, every namespace's value.
func readAll(ctx context.Context, cli *clientv3.Client) (*Snapshot, map[string][]byte, error) {
	snap, err := Read(ctx, cli)
	if err != nil {
		return nil, nil, err
	}
	kvs := map[string][]byte{}
	key, end := NsPrefix, clientv3.GetPrefixRangeEnd(NsPrefix)
	for {
		// Pages keep each response small at any fleet size.
		resp, err := cli.Get(ctx, key, clientv3.WithRange(end), clientv3.WithRev(snap.Rev), clientv3.WithLimit(5000))
		if err != nil {
			return nil, nil, err
		}
		for _, kv := range resp.Kvs {
			if _, name, ok := splitKey(string(kv.Key), NsPrefix); ok {
				kvs[name] = kv.Value
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return snap, kvs, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// specWatch follows the cluster from a full read onwards, key by key. When
// the watch ends (etcd compacted past it, or lost its leader), it reads
// everything again and watches from there; while etcd cannot be read,
// retry fires every 500 ms.
type specWatch struct {
	a      *Agent
	ctx    context.Context
	ch     chan watchItem // from the pump; nil: not watching
	cancel context.CancelFunc
	retry  *time.Timer
}

// restart reads everything, takes what it says, and watches from it.
func (w *specWatch) restart() bool {
	if w.retry == nil {
		w.retry = time.NewTimer(time.Hour)
	}
	w.stopWatch()
	rctx, cancel := w.a.rpc(w.ctx)
	snap, kvs, err := readAll(rctx, w.a.cli)
	cancel()
	if err != nil {
		w.retry.Reset(500 * time.Millisecond)
		return false
	}
	w.a.load(snap, kvs)
	wctx, wcancel := context.WithCancel(w.ctx)
	w.cancel = wcancel
	src := w.a.cli.Watch(clientv3.WithRequireLeader(wctx), Prefix, clientv3.WithPrefix(), clientv3.WithRev(snap.Rev+1))
	w.ch = make(chan watchItem, 64)
	go w.a.pump(wctx, src, w.ch)
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

// take applies one watch response; it reports whether something this node
// serves, or is assigned, changed.
func (w *specWatch) take(resp clientv3.WatchResponse, ok bool) bool {
	if !ok || resp.Err() != nil || resp.Canceled {
		return w.restart()
	}
	a := w.a
	changed := false
	for _, ev := range resp.Events {
		a.desired.rev = max(a.desired.rev, ev.Kv.ModRevision)
		if a.takeEvent(ev) {
			changed = true
		}
	}
	return changed
}

// takeEvent applies one key's change.
func (a *Agent) takeEvent(ev *clientv3.Event) bool {
	k, del := string(ev.Kv.Key), ev.Type == clientv3.EventTypeDelete
	d := &a.desired
	switch {
	case strings.HasPrefix(k, NsPrefix):
		_, name, ok := splitKey(k, NsPrefix)
		if !ok {
			return false
		}
		if del {
			d.catalog.remove(name)
		} else {
			d.catalog.put(name, ev.Kv.Value)
		}
		_, applied := a.held.applied[name]
		assigned := isIn(d.assign.Names, name)
		if assigned && !del {
			a.learnHosts([]string{name})
		}
		return applied || assigned
	case strings.HasPrefix(k, SpecsPrefix):
		// An apply or delete is whole: reconcile (mostly nothing to do) so
		// that the status says the node has taken it.
		return true
	case strings.HasPrefix(k, AssignNodePrefix(a.cfg.Node)):
		delete(d.assignBad, k)
		var as Assignment
		if del {
			delete(d.parts, k)
		} else if err := json.Unmarshal(ev.Kv.Value, &as); err != nil {
			d.assignBad[k] = err
			a.log.Error("assignment does not decode; keeping the previous one", "key", k, "err", err)
		} else {
			d.parts[k] = as
		}
		a.mergeAssign()
		return true
	case strings.HasPrefix(k, NodesPrefix) && NodeOf(k, NodesPrefix) != a.cfg.Node:
		var info NodeInfo
		node := NodeOf(k, NodesPrefix)
		switch {
		case del:
			a.peers.remove(node)
			return d.setTunnel(node, netip.Addr{})
		case json.Unmarshal(ev.Kv.Value, &info) == nil:
			a.peers.put(node, info.PeerURL)
			return d.setTunnel(node, tunnelAddr(info))
		}
	}
	return false
}

// learnHosts maps the host veths of the named namespaces to them, so that
// host events name them; the host event of a veth's creation also carries
// the id of its namespace, which maps the events from inside it. It
// returns the map.
func (a *Agent) learnHosts(names []string) map[string]string {
	hostOf := map[string]string{}
	if a.drift == nil {
		return hostOf
	}
	for _, n := range names {
		ns, ok := a.desired.catalog.Lookup(n)
		if !ok {
			continue
		}
		var hs []string
		for _, v := range ns.Veths {
			hs = append(hs, v.Host)
			hostOf[v.Host] = ns.Name
		}
		a.drift.learn(ns.Name, hs, -1)
	}
	return hostOf
}
