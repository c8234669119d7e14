package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/spec"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Key layout 1, as far as Migrate and the agents of an upgrade read it.
// It stored the whole spec as one YAML value and each node's assignment as
// one value: a fleet of 6,000 routers with their own addresses passed
// etcd's request limit.
const (
	V1Prefix       = "/nsfleet/v1/"
	V1KeySchema    = V1Prefix + "schema"
	V1KeySpec      = V1Prefix + "spec"
	V1KeyAssignGen = V1Prefix + "assign-gen"
	V1NodesPrefix  = V1Prefix + "nodes/"
	V1StatusPrefix = V1Prefix + "status/"
	v1AssignPrefix = V1Prefix + "assign/"
	v1CordonPrefix = V1Prefix + "cordon/"
	v1HeldPrefix   = V1Prefix + "failover-held/"
)

// v1SpecDoc is layout 1's spec value.
type v1SpecDoc struct {
	Source  string    `json:"source"`
	YAML    string    `json:"yaml"`
	Count   int       `json:"count"`
	Applied time.Time `json:"applied"`
}

// v1Frozen is the spec Migrate leaves in layout 1: valid JSON whose YAML
// no version parses. A version 1 agent keeps serving the spec it had (it
// never takes a spec that does not parse) and its scheduler writes nothing
// while the stored spec does not parse: the layout 1 cluster stands still
// while its agents are restarted with this version, one by one.
const v1FrozenYAML = "moved_to_key_layout: 2  # by 'nsfleet cluster migrate': restart this agent with that version\n"

// MigrateResult says what Migrate did.
type MigrateResult struct {
	Spec     string // the name the layout 1 spec is stored under
	Apply    ApplyResult
	Assigned int // namespaces whose assignment was copied
	Nodes    int
	Frozen   bool // layout 1 was frozen by this run (false: it already was)
}

// Migrate moves a cluster from key layout 1 to 2 in place, while it
// serves. First it freezes layout 1 (see v1FrozenYAML; the freeze also
// bumps layout 1's assign-gen, so a version 1 scheduler's write in flight
// fails), then it copies the spec, under name (default: the applied file's
// base name), every assignment as it stands, cordons and held failovers.
// The version 1 agents go on serving what they hold; an agent of this
// version adopts its node's lease and assignment, so a rolling restart
// moves nothing. Running it again finishes a migration cut short.
func Migrate(ctx context.Context, cli *clientv3.Client, name, version string) (MigrateResult, error) {
	var res MigrateResult
	cur, err := cli.Get(ctx, V1Prefix, clientv3.WithPrefix())
	if err != nil {
		return res, err
	}
	v1 := map[string][]byte{}
	var specRev int64
	for _, kv := range cur.Kvs {
		v1[string(kv.Key)] = kv.Value
		if string(kv.Key) == V1KeySpec {
			specRev = kv.ModRevision
		}
	}
	if string(v1[V1KeySchema]) != "1" {
		return res, errors.New("etcd holds no key layout 1 cluster (no /nsfleet/v1/schema): nothing to migrate")
	}
	var doc v1SpecDoc
	if err := json.Unmarshal(v1[V1KeySpec], &doc); err != nil && v1[V1KeySpec] != nil {
		return res, fmt.Errorf("layout 1 spec does not decode: %w", err)
	}
	frozen := doc.YAML == v1FrozenYAML
	if !frozen && doc.YAML != "" {
		res.Spec = name
		if res.Spec == "" {
			res.Spec = DefaultSpecName(doc.Source)
		}
		// Freeze first, so that the assignments copied are final.
		frozenDoc := v1SpecDoc{Source: res.Spec, YAML: v1FrozenYAML, Count: doc.Count, Applied: time.Now().UTC()}
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(V1KeySpec), "=", specRev)).
			Then(clientv3.OpPut(V1KeySpec, encode(frozenDoc)), clientv3.OpPut(V1KeyAssignGen, time.Now().UTC().Format(time.RFC3339Nano))).Commit()
		if err != nil {
			return res, err
		}
		if !resp.Succeeded {
			return res, errors.New("the layout 1 spec changed while migrating: nothing done; run it again")
		}
		res.Frozen = true
		if err := migrateSpec(ctx, cli, doc, res.Spec, version, &res); err != nil {
			return res, fmt.Errorf("layout 1 frozen, spec not copied (run migrate again): %w", err)
		}
	} else if frozen {
		res.Spec = doc.Source // a frozen doc's source is the name it was copied to
	}
	// The assignments, read again after the freeze.
	after, err := cli.Get(ctx, V1Prefix, clientv3.WithPrefix())
	if err != nil {
		return res, err
	}
	if err := migrateState(ctx, cli, after.Kvs, &res); err != nil {
		return res, fmt.Errorf("layout 1 frozen, state not all copied (run migrate again): %w", err)
	}
	return res, nil
}

// migrateSpec stores the layout 1 spec's namespaces under name.
func migrateSpec(ctx context.Context, cli *clientv3.Client, doc v1SpecDoc, name, version string, res *MigrateResult) error {
	f, err := spec.Parse(doc.Source, []byte(doc.YAML), spec.Options{})
	if err != nil {
		return fmt.Errorf("layout 1 spec: %w", err)
	}
	res.Apply, err = apply(ctx, cli, f, ApplyOptions{Name: name, Source: doc.Source, Version: version, noSchema: true})
	return err
}

// migrateState copies assignments, cordons and held failovers, and writes
// the schema last: a layout 2 agent that starts before it refuses to join.
func migrateState(ctx context.Context, cli *clientv3.Client, kvs []*mvccpb.KeyValue, res *MigrateResult) error {
	snap := &Snapshot{Parts: map[string]Assignment{}}
	plan := map[string]*Assignment{}
	var ops []clientv3.Op
	for _, kv := range kvs {
		k := string(kv.Key)
		switch {
		case strings.HasPrefix(k, v1AssignPrefix):
			var a Assignment
			if err := json.Unmarshal(kv.Value, &a); err != nil {
				return fmt.Errorf("layout 1 key %s: %w", k, err)
			}
			plan[NodeOf(k, v1AssignPrefix)] = &a
			res.Assigned += len(a.Names)
			res.Nodes++
		case strings.HasPrefix(k, v1CordonPrefix):
			ops = append(ops, clientv3.OpPut(CordonKey(NodeOf(k, v1CordonPrefix)), string(kv.Value)))
		case strings.HasPrefix(k, v1HeldPrefix):
			ops = append(ops, clientv3.OpPut(HeldKey(NodeOf(k, v1HeldPrefix)), string(kv.Value)))
		}
	}
	cur, err := Read(ctx, cli)
	if err != nil {
		return err
	}
	snap.Parts = cur.Parts
	ops = append(ops, assignOps(snap, plan)...)
	ops = append(ops, clientv3.OpPut(KeyAssignGen, time.Now().UTC().Format(time.RFC3339Nano)), clientv3.OpPut(KeySchema, SchemaVersion))
	for _, b := range batches(ops) {
		if _, err := cli.Txn(ctx).Then(b...).Commit(); err != nil {
			return err
		}
	}
	return nil
}

// DefaultSpecName is the name a spec file is stored under unless told:
// its base name without the extension, made a valid key part.
func DefaultSpecName(file string) string {
	base := strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
	var b strings.Builder
	for _, c := range base {
		if !keyChar(c) {
			c = '-'
		}
		b.WriteRune(c)
	}
	s := b.String()
	if len(s) > 63 {
		s = s[:63]
	}
	if s == "" || s == "." || s == "-" {
		return "fleet"
	}
	return s
}
