package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/spec"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// An applied spec is stored as one key per namespace (ns/SPEC/NAME), the
// spec's claims on host interfaces (hosts/SPEC/IF) and its SpecMeta. Apply
// compares what is stored with the file and writes only the difference:
// a file with one router changed writes that router's key and the meta.
//
// Applies and deletes take turns under an etcd mutex (LockPrefix), so the
// check that no other spec claims a name or a host interface holds when
// the keys are written; every write transaction is guarded by the mutex
// (a writer whose session lapsed writes nothing more). A large apply is
// cut into several transactions: agents may see part of it before the
// rest, each namespace whole. Removals go first, so that a name or host
// interface moved from one router to another is free when it is claimed.

// nsValue is the stored form of one namespace: its Origin apart from the
// rest, so that an apply compares what the kernel is asked for without the
// file and line (a line added above a router does not rewrite it).
type nsValue struct {
	Origin    spec.Origin     `json:"origin"`
	Namespace json.RawMessage `json:"namespace"`
}

// EncodeNamespace is a namespace's stored value and the part of it an
// apply compares.
func EncodeNamespace(ns *spec.Namespace) (val, body []byte) {
	n := *ns
	n.Origin = spec.Origin{}
	body, err := json.Marshal(&n)
	if err != nil {
		panic(err) // plain data: strings, numbers and netip values
	}
	val, err = json.Marshal(nsValue{Origin: ns.Origin, Namespace: body})
	if err != nil {
		panic(err)
	}
	return val, body
}

// DecodeNamespace reads a stored namespace; name is the one in its key.
func DecodeNamespace(name string, val []byte) (*spec.Namespace, error) {
	var v struct {
		Origin    spec.Origin    `json:"origin"`
		Namespace spec.Namespace `json:"namespace"`
	}
	if err := json.Unmarshal(val, &v); err != nil {
		return nil, err
	}
	if v.Namespace.Name != name {
		return nil, fmt.Errorf("the value names namespace %q", v.Namespace.Name)
	}
	v.Namespace.Origin = v.Origin
	return &v.Namespace, nil
}

// storedBody is the compared part of a stored value.
func storedBody(val []byte) ([]byte, bool) {
	var v nsValue
	if json.Unmarshal(val, &v) != nil {
		return nil, false
	}
	return v.Namespace, true
}

// ApplyOptions says how to store a spec.
type ApplyOptions struct {
	Name    string // the spec's name (ValidSpecName)
	Source  string // the file, for messages
	DryRun  bool   // compare and count, write nothing
	Version string // of this nsfleet, recorded in the spec's meta
	// Progress, if set, is called after each write transaction.
	Progress func(written, total int)
	noSchema bool // Migrate writes the schema itself, last
}

// ApplyResult says what Apply did (or, dry, would do).
type ApplyResult struct {
	Name                               string
	Added, Changed, Removed, Unchanged int
	Keys                               int   // keys written or deleted
	Txns                               int   // write transactions
	Rev                                int64 // the meta's revision after the apply
}

// Changes is how many namespaces the apply adds, changes or removes.
func (r ApplyResult) Changes() int { return r.Added + r.Changed + r.Removed }

// ErrLayoutV1 says the cluster still uses key layout 1.
var ErrLayoutV1 = errors.New("this cluster's etcd holds nsfleet key layout 1: run 'nsfleet cluster migrate' (with this version) first")

// checkSchema refuses a cluster of another layout.
func checkSchema(ctx context.Context, cli *clientv3.Client) error {
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(KeySchema), clientv3.OpGet(V1KeySchema)).Commit()
	if err != nil {
		return err
	}
	v2, v1 := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	switch {
	case len(v2) == 1 && string(v2[0].Value) != SchemaVersion:
		return fmt.Errorf("etcd holds nsfleet key layout %q; this nsfleet writes %q", v2[0].Value, SchemaVersion)
	case len(v2) == 0 && len(v1) == 1 && string(v1[0].Value) == "1":
		return ErrLayoutV1
	}
	return nil
}

// applyLock takes the apply mutex; the returned func releases it.
func applyLock(ctx context.Context, cli *clientv3.Client) (*concurrency.Mutex, func(), error) {
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(15), concurrency.WithContext(ctx))
	if err != nil {
		return nil, nil, err
	}
	m := concurrency.NewMutex(sess, LockPrefix)
	if err := m.Lock(ctx); err != nil {
		sess.Close()
		return nil, nil, fmt.Errorf("waiting for another apply or delete to finish: %w", err)
	}
	return m, func() {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		m.Unlock(rctx)
		cancel()
		sess.Close()
	}, nil
}

// Apply stores f as the spec o.Name: the whole file is checked against
// every other stored spec (no name or host interface in two specs), then
// only the namespaces that differ from what is stored are written.
func Apply(ctx context.Context, cli *clientv3.Client, f *spec.Fleet, o ApplyOptions) (ApplyResult, error) {
	res := ApplyResult{Name: o.Name}
	if err := ValidSpecName(o.Name); err != nil {
		return res, err
	}
	if err := checkSchema(ctx, cli); err != nil {
		return res, err
	}
	return apply(ctx, cli, f, o)
}

func apply(ctx context.Context, cli *clientv3.Client, f *spec.Fleet, o ApplyOptions) (ApplyResult, error) {
	res := ApplyResult{Name: o.Name}
	var m *concurrency.Mutex
	if !o.DryRun {
		var unlock func()
		var err error
		if m, unlock, err = applyLock(ctx, cli); err != nil {
			return res, err
		}
		defer unlock()
	}
	plan, err := planApply(ctx, cli, f, o)
	if err != nil {
		return res, err
	}
	res.Added, res.Changed, res.Removed, res.Unchanged = plan.added, plan.changed, plan.removed, plan.unchanged
	res.Rev = plan.metaRev
	if len(plan.ops) == 0 && plan.metaSame {
		return res, nil
	}
	meta := SpecMeta{Name: o.Name, Source: o.Source, Count: len(f.Namespaces), Processes: f.HasProcesses(),
		Links: len(f.Links), Applied: time.Now().UTC(), Version: o.Version}
	ops := append(plan.ops, clientv3.OpPut(SpecKey(o.Name), encode(meta)))
	res.Keys = len(ops)
	if !o.noSchema {
		ops = append(ops, clientv3.OpPut(KeySchema, SchemaVersion))
	}
	if o.DryRun {
		res.Txns = len(batches(ops))
		return res, nil
	}
	written := 0
	for _, b := range batches(ops) {
		resp, err := cli.Txn(ctx).If(m.IsOwner()).Then(b...).Commit()
		if err != nil {
			return res, fmt.Errorf("after %d of %d keys: %w", written, len(ops), err)
		}
		if !resp.Succeeded {
			return res, fmt.Errorf("lost the apply lock (its lease lapsed) after %d of %d keys: apply again", written, len(ops))
		}
		written += len(b)
		res.Txns++
		res.Rev = resp.Header.Revision
		if o.Progress != nil {
			o.Progress(written, len(ops))
		}
	}
	return res, nil
}

// plannedApply is what an apply writes.
type plannedApply struct {
	ops                                []clientv3.Op
	added, changed, removed, unchanged int
	metaRev                            int64
	metaSame                           bool // the stored meta says the same source and count
}

// planApply reads what is stored and compares it with f.
func planApply(ctx context.Context, cli *clientv3.Client, f *spec.Fleet, o ApplyOptions) (*plannedApply, error) {
	mine := NsPrefix + o.Name + "/"
	resp, err := cli.Txn(ctx).Then(
		clientv3.OpGet(mine, clientv3.WithPrefix()),
		clientv3.OpGet(NsPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(HostsPrefix, clientv3.WithPrefix()),
		clientv3.OpGet(SpecKey(o.Name)),
		clientv3.OpGet(KeyVNINext),
	).Commit()
	if err != nil {
		return nil, err
	}
	stored := map[string][]byte{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		stored[strings.TrimPrefix(string(kv.Key), mine)] = kv.Value
	}
	other := map[string]string{} // name -> key, in other specs
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if sp, name, ok := splitKey(string(kv.Key), NsPrefix); ok && sp != o.Name {
			other[name] = string(kv.Key)
		}
	}
	claims, otherHosts := map[string]string{}, map[string]string{}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		sp, ifname, ok := splitKey(string(kv.Key), HostsPrefix)
		switch {
		case !ok:
		case sp == o.Name:
			claims[ifname] = string(kv.Value)
		default:
			otherHosts[ifname] = sp + ": namespace " + string(kv.Value)
		}
	}
	if err := conflicts(ctx, cli, f, other, otherHosts); err != nil {
		return nil, err
	}
	p := &plannedApply{}
	if kvs := resp.Responses[3].GetResponseRange().Kvs; len(kvs) == 1 {
		p.metaRev = kvs[0].ModRevision
		var m SpecMeta
		p.metaSame = json.Unmarshal(kvs[0].Value, &m) == nil && m.Source == o.Source && m.Count == len(f.Namespaces) && m.Links == len(f.Links)
	}
	if len(f.Links) > 0 {
		op, err := allocateVNIs(f, stored, resp.Responses[4].GetResponseRange().Kvs)
		if err != nil {
			return nil, err
		}
		if op != nil {
			p.ops = append(p.ops, *op)
		}
	}
	// Removals first (see above), then claims, then namespaces.
	want := map[string]bool{}
	wantHosts := map[string]string{}
	for i := range f.Namespaces {
		ns := &f.Namespaces[i]
		want[ns.Name] = true
		for _, v := range ns.Veths {
			wantHosts[v.Host] = ns.Name
		}
	}
	for _, name := range sortedKeys(stored) {
		if !want[name] {
			p.ops = append(p.ops, clientv3.OpDelete(NsKey(o.Name, name)))
			p.removed++
		}
	}
	for _, ifname := range sortedKeys(claims) {
		if _, ok := wantHosts[ifname]; !ok {
			p.ops = append(p.ops, clientv3.OpDelete(HostKey(o.Name, ifname)))
		}
	}
	for _, ifname := range sortedKeys(wantHosts) {
		if claims[ifname] != wantHosts[ifname] {
			p.ops = append(p.ops, clientv3.OpPut(HostKey(o.Name, ifname), wantHosts[ifname]))
		}
	}
	for i := range f.Namespaces {
		ns := &f.Namespaces[i]
		val, body := EncodeNamespace(ns)
		if len(val) > MaxValueBytes {
			return nil, fmt.Errorf("%s: namespace %s takes %d KiB stored; one value holds at most %d KiB", ns.Origin, ns.Name, len(val)>>10, MaxValueBytes>>10)
		}
		old, had := stored[ns.Name]
		if had {
			if ob, ok := storedBody(old); ok && bytes.Equal(ob, body) {
				p.unchanged++
				continue
			}
			p.changed++
		} else {
			p.added++
		}
		p.ops = append(p.ops, clientv3.OpPut(NsKey(o.Name, ns.Name), string(val)))
	}
	return p, nil
}

// MaxVNI is the largest VXLAN network identifier (24 bits).
const MaxVNI = 1<<24 - 1

// allocateVNIs gives every link of f its VNI: the one stored for the same
// link (same two ends), else the next from the cluster's counter
// (vni-next), so that no two links of any specs share one and a link
// keeps its own across applies. It returns the counter's update, if any.
func allocateVNIs(f *spec.Fleet, stored map[string][]byte, counter []*mvccpb.KeyValue) (*clientv3.Op, error) {
	had := map[string]uint32{}
	for name, val := range stored {
		ns, err := DecodeNamespace(name, val)
		if err != nil {
			continue // rewritten by this apply
		}
		for _, l := range ns.Links {
			if l.VNI != 0 {
				had[l.String()] = l.VNI
			}
		}
	}
	next := uint64(1)
	if len(counter) == 1 {
		n, err := strconv.ParseUint(string(counter[0].Value), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s holds %q, not a number", KeyVNINext, counter[0].Value)
		}
		next = n
	}
	start := next
	vni := map[string]uint32{}
	for i := range f.Links {
		id := f.Links[i].String()
		if v, ok := had[id]; ok {
			vni[id] = v
			continue
		}
		if next > MaxVNI {
			return nil, fmt.Errorf("%s: link %s: the cluster has given out every VXLAN network identifier (%d)", f.Links[i].Origin.File, id, MaxVNI)
		}
		vni[id] = uint32(next)
		next++
	}
	for i := range f.Links {
		f.Links[i].VNI = vni[f.Links[i].String()]
	}
	for i := range f.Namespaces {
		for k := range f.Namespaces[i].Links {
			l := &f.Namespaces[i].Links[k]
			l.VNI = vni[l.String()]
		}
	}
	if next == start {
		return nil, nil
	}
	op := clientv3.OpPut(KeyVNINext, strconv.FormatUint(next, 10))
	return &op, nil
}

// conflicts refuses names and host interfaces another spec holds, naming
// both places (the other's file and line from its stored value).
func conflicts(ctx context.Context, cli *clientv3.Client, f *spec.Fleet, other, otherHosts map[string]string) error {
	var errs []error
	where := func(key, name string) string {
		resp, err := cli.Get(ctx, key)
		if err != nil || len(resp.Kvs) == 0 {
			return key
		}
		sp, _, _ := splitKey(key, NsPrefix)
		if ns, err := DecodeNamespace(name, resp.Kvs[0].Value); err == nil && ns.Origin.File != "" {
			return fmt.Sprintf("spec %s (%s:%d)", sp, ns.Origin.File, ns.Origin.Line)
		}
		return "spec " + sp
	}
	for i := range f.Namespaces {
		if len(errs) >= 10 {
			errs = append(errs, errors.New("... and maybe more"))
			break
		}
		ns := &f.Namespaces[i]
		if key, ok := other[ns.Name]; ok {
			errs = append(errs, fmt.Errorf("%s:%d: namespace %s is also in %s", ns.Origin.File, ns.Origin.Line, ns.Name, where(key, ns.Name)))
			continue
		}
		for _, v := range ns.Veths {
			if by, ok := otherHosts[v.Host]; ok {
				sp, name, _ := strings.Cut(by, ": namespace ")
				errs = append(errs, fmt.Errorf("%s:%d: host interface %s of %s is also claimed by %s of %s", ns.Origin.File, ns.Origin.Line, v.Host, ns.Name, name, where(NsKey(sp, name), name)))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("nothing stored: %w", errors.Join(errs...))
	}
	return nil
}

// batches cuts ops into transactions within maxTxnOps and maxTxnBytes.
func batches(ops []clientv3.Op) [][]clientv3.Op {
	var out [][]clientv3.Op
	start, bytes := 0, 0
	for i := range ops {
		n := len(ops[i].KeyBytes()) + len(ops[i].ValueBytes()) + 16 // and framing
		if i > start && (i-start >= maxTxnOps || bytes+n > maxTxnBytes) {
			out = append(out, ops[start:i])
			start, bytes = i, 0
		}
		bytes += n
	}
	if start < len(ops) {
		out = append(out, ops[start:])
	}
	return out
}

// DeleteResult says what Delete removed.
type DeleteResult struct {
	Namespaces int
	Rev        int64
}

// ErrNoSpec is returned by Delete for a name that is not stored.
var ErrNoSpec = errors.New("no such spec")

// Delete removes the spec name and all its namespaces in one transaction
// (three range deletes); every agent then tears down what it serves of it.
func Delete(ctx context.Context, cli *clientv3.Client, name string) (DeleteResult, error) {
	var res DeleteResult
	if err := ValidSpecName(name); err != nil {
		return res, err
	}
	if err := checkSchema(ctx, cli); err != nil {
		return res, err
	}
	m, unlock, err := applyLock(ctx, cli)
	if err != nil {
		return res, err
	}
	defer unlock()
	cur, err := cli.Txn(ctx).Then(clientv3.OpGet(SpecKey(name)),
		clientv3.OpGet(NsPrefix+name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())).Commit()
	if err != nil {
		return res, err
	}
	if len(cur.Responses[0].GetResponseRange().Kvs) == 0 {
		specs, _ := SpecNames(ctx, cli)
		return res, fmt.Errorf("%w %q (stored: %s)", ErrNoSpec, name, orNone(specs))
	}
	res.Namespaces = int(cur.Responses[1].GetResponseRange().Count)
	resp, err := cli.Txn(ctx).If(m.IsOwner()).Then(
		clientv3.OpDelete(NsPrefix+name+"/", clientv3.WithPrefix()),
		clientv3.OpDelete(HostsPrefix+name+"/", clientv3.WithPrefix()),
		clientv3.OpDelete(SpecKey(name)),
	).Commit()
	if err != nil {
		return res, err
	}
	if !resp.Succeeded {
		return res, errors.New("lost the apply lock (its lease lapsed): nothing deleted; run it again")
	}
	res.Rev = resp.Header.Revision
	return res, nil
}

// SpecNames lists the stored specs.
func SpecNames(ctx context.Context, cli *clientv3.Client) ([]string, error) {
	resp, err := cli.Get(ctx, SpecsPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, NodeOf(string(kv.Key), SpecsPrefix))
	}
	slices.Sort(out)
	return out, nil
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
