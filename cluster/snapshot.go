package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nsfleet/nsfleet/spec"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Snapshot is the cluster at one revision, decoded: every nsfleet key but
// the namespaces' values (their names only) and the host claims.
type Snapshot struct {
	Rev int64
	// Specs are the applied specs by name; SpecRev is the highest mod
	// revision among their keys (0: none), the revision at which the last
	// apply was whole.
	Specs   map[string]SpecMeta
	SpecRev int64
	// Names are the stored namespaces, in key order (by spec, then name);
	// SpecOf says which spec each belongs to.
	Names  []string
	SpecOf map[string]string
	Nodes  map[string]NodeInfo
	Status map[string]NodeStatus
	// Legacy are nodes whose agent still runs the version 1 layout (during
	// an upgrade): alive, serving what Migrate copied, given nothing new.
	Legacy  map[string]bool
	Cordons map[string]Cordon
	// Assign is each node's assignment, its buckets merged; Parts are the
	// buckets as stored (by key); AssignRev is the highest mod revision
	// among a node's buckets.
	Assign       map[string]Assignment
	Parts        map[string]Assignment
	AssignRev    map[string]int64
	AssignGenRev int64
	Failovers    []Failover
	FailoverKeys []string // each failover record's key
	// Bad holds the keys whose value does not decode, and why; they are
	// left out of the maps above. Readers decide: an agent keeps what it
	// had, the scheduler writes nothing while an assignment is unreadable.
	Bad map[string]error
	// Forced: lost nodes an operator ordered failed over (ForceKey).
	Forced map[string]bool
	// Held: lost nodes whose failover the scheduler holds (HeldKey).
	Held map[string]bool
}

// Unreadable names the keys the scheduler must be able to read (every
// assignment and spec) that do not decode; nil when there are none.
func (s *Snapshot) Unreadable() error {
	var errs []error
	for _, k := range sortedKeys(s.Bad) {
		if strings.HasPrefix(k, AssignPrefix) || strings.HasPrefix(k, SpecsPrefix) {
			errs = append(errs, fmt.Errorf("etcd key %s does not decode: %w", k, s.Bad[k]))
		}
	}
	return errors.Join(errs...)
}

// HasProcesses reports whether any applied spec runs processes.
func (s *Snapshot) HasProcesses() bool {
	for _, m := range s.Specs {
		if m.Processes {
			return true
		}
	}
	return false
}

// Read takes a Snapshot in one read-only transaction: the namespaces are
// read as keys only, so a scheduler round or a status costs the names,
// not the fleet.
func Read(ctx context.Context, cli *clientv3.Client) (*Snapshot, error) {
	end := clientv3.GetPrefixRangeEnd
	resp, err := cli.Txn(ctx).Then(
		clientv3.OpGet(Prefix, clientv3.WithRange(HostsPrefix)),
		clientv3.OpGet(NodesPrefix, clientv3.WithRange(NsPrefix)),
		clientv3.OpGet(NsPrefix, clientv3.WithRange(end(NsPrefix)), clientv3.WithKeysOnly()),
		clientv3.OpGet(end(NsPrefix), clientv3.WithRange(end(Prefix))),
		clientv3.OpGet(V1NodesPrefix, clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, err
	}
	s := &Snapshot{
		Rev: resp.Header.Revision, Specs: map[string]SpecMeta{}, SpecOf: map[string]string{},
		Nodes: map[string]NodeInfo{}, Status: map[string]NodeStatus{}, Legacy: map[string]bool{},
		Cordons: map[string]Cordon{}, Assign: map[string]Assignment{}, Parts: map[string]Assignment{},
		AssignRev: map[string]int64{}, Bad: map[string]error{}, Forced: map[string]bool{}, Held: map[string]bool{},
	}
	for i, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			if i == 4 {
				s.legacy(string(kv.Key), kv.Value)
				continue
			}
			if err := s.take(string(kv.Key), kv.Value, kv.ModRevision); err != nil {
				return nil, err
			}
		}
	}
	for node, a := range s.Assign {
		slices.Sort(a.Names)
		slices.Sort(a.Releasing)
		s.Assign[node] = a
	}
	return s, nil
}

// legacy takes a version 1 agent's node key: alive, unless the node
// already joined with this version.
func (s *Snapshot) legacy(key string, val []byte) {
	node := NodeOf(key, V1NodesPrefix)
	var v NodeInfo
	if _, joined := s.Nodes[node]; joined || json.Unmarshal(val, &v) != nil {
		return
	}
	s.Nodes[node] = v
	s.Legacy[node] = true
}

// take decodes one key; only a layout it cannot read is an error.
func (s *Snapshot) take(k string, val []byte, modRev int64) error {
	var err error
	switch {
	case k == KeySchema:
		if v := string(val); v != SchemaVersion {
			return fmt.Errorf("etcd holds nsfleet key layout %q; this nsfleet reads %q", v, SchemaVersion)
		}
	case k == KeyAssignGen:
		s.AssignGenRev = modRev
	case strings.HasPrefix(k, NsPrefix):
		if sp, name, ok := splitKey(k, NsPrefix); ok {
			s.Names = append(s.Names, name)
			s.SpecOf[name] = sp
		}
	case strings.HasPrefix(k, SpecsPrefix):
		var v SpecMeta
		if err = json.Unmarshal(val, &v); err == nil {
			s.Specs[NodeOf(k, SpecsPrefix)] = v
		}
		s.SpecRev = max(s.SpecRev, modRev)
	case strings.HasPrefix(k, NodesPrefix):
		var v NodeInfo
		if err = json.Unmarshal(val, &v); err == nil {
			s.Nodes[NodeOf(k, NodesPrefix)] = v
		}
	case strings.HasPrefix(k, StatusPrefix):
		var v NodeStatus
		if err = json.Unmarshal(val, &v); err == nil {
			s.Status[NodeOf(k, StatusPrefix)] = v
		}
	case strings.HasPrefix(k, CordonPrefix):
		var v Cordon
		if err = json.Unmarshal(val, &v); err == nil {
			s.Cordons[NodeOf(k, CordonPrefix)] = v
		}
	case strings.HasPrefix(k, AssignPrefix):
		node, _, ok := splitKey(k, AssignPrefix)
		var v Assignment
		if err = json.Unmarshal(val, &v); err == nil && ok {
			s.Parts[k] = v
			a := s.Assign[node]
			a.Names = append(a.Names, v.Names...)
			a.Releasing = append(a.Releasing, v.Releasing...)
			s.Assign[node] = a
		}
		if ok {
			s.AssignRev[node] = max(s.AssignRev[node], modRev)
		}
	case strings.HasPrefix(k, ForcePrefix):
		s.Forced[NodeOf(k, ForcePrefix)] = true
	case strings.HasPrefix(k, HeldPrefix):
		s.Held[NodeOf(k, HeldPrefix)] = true
	case strings.HasPrefix(k, FailoverPrefix):
		var v Failover
		rev, _, _ := strings.Cut(NodeOf(k, FailoverPrefix), "/")
		_, perr := strconv.ParseInt(rev, 10, 64)
		if err = errors.Join(json.Unmarshal(val, &v), perr); err == nil {
			s.Failovers = append(s.Failovers, v)
			s.FailoverKeys = append(s.FailoverKeys, k)
		}
	}
	if err != nil {
		s.Bad[k] = err
	}
	return nil
}

// Namespaces reads every stored namespace (in pages), decoded; one that
// does not decode is an error naming its key.
func Namespaces(ctx context.Context, cli *clientv3.Client) ([]*spec.Namespace, error) {
	_, kvs, err := readAll(ctx, cli)
	if err != nil {
		return nil, err
	}
	out := make([]*spec.Namespace, 0, len(kvs))
	for _, name := range sortedKeys(kvs) {
		ns, err := DecodeNamespace(name, kvs[name])
		if err != nil {
			return nil, fmt.Errorf("stored namespace %s: %w", name, err)
		}
		out = append(out, ns)
	}
	return out, nil
}
