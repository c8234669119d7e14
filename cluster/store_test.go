package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/spec"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// testEtcd starts a one-member etcd with etcd's default limits (1.5 MiB
// requests, 128 operations per transaction) and returns a client.
func testEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	cu, _ := url.Parse("http://" + freePort(t))
	pu, _ := url.Parse("http://" + freePort(t))
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(t.TempDir(), "data")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop()) // no log file left open
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{cu.String()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// routers writes a heterogeneous spec: one template per router, each with
// its own addresses and route; extra is added to router 1's routes.
func routers(prefix string, n int, extra string) string {
	var b strings.Builder
	b.WriteString("namespaces:\n")
	for i := 1; i <= n; i++ {
		a, b2, c := i/16384, i/64%256, i%64*4
		fmt.Fprintf(&b, "  - name: %sr%d\n    veths:\n      - host: %sq%d\n        peer: qr-in\n        up: true\n        peer_addresses: [\"10.%d.%d.%d/30\"]\n    routes:\n      - to: default\n        via: 10.%d.%d.%d\n",
			prefix, i, prefix, i, a, b2, c+2, a, b2, c+1)
		if i == 1 && extra != "" {
			b.WriteString(extra)
		}
	}
	return b.String()
}

func mustParse(t *testing.T, file, yaml string) *spec.Fleet {
	t.Helper()
	f, err := spec.Parse(file, []byte(yaml), spec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestApplyIsADiff(t *testing.T) {
	cli := testEtcd(t)
	ctx := context.Background()
	apply := func(file, name, yaml string, dry bool) (ApplyResult, error) {
		return Apply(ctx, cli, mustParse(t, file, yaml), ApplyOptions{Name: name, Source: file, DryRun: dry})
	}
	res, err := apply("a.yaml", "a", routers("a-", 3, ""), false)
	if err != nil || res.Added != 3 || res.Keys != 3+3+1 {
		t.Fatalf("first apply: %+v, %v (want 3 added, 3 namespaces + 3 host claims + meta)", res, err)
	}
	if res, err := apply("a.yaml", "a", routers("a-", 3, ""), false); err != nil || res.Keys != 0 || res.Unchanged != 3 {
		t.Errorf("same again: %+v, %v", res, err)
	}
	// One route more on one router: that router's key and the meta.
	route := "      - to: 192.0.2.0/24\n        via: 10.0.0.5\n"
	if res, err := apply("a.yaml", "a", routers("a-", 3, route), true); err != nil || res.Changed != 1 || res.Keys != 2 {
		t.Errorf("dry run of one change: %+v, %v", res, err)
	}
	snap, _ := Read(ctx, cli)
	res, err = apply("a.yaml", "a", routers("a-", 3, route), false)
	if err != nil || res.Changed != 1 || res.Unchanged != 2 || res.Keys != 2 || res.Rev <= snap.SpecRev {
		t.Errorf("one change: %+v, %v", res, err)
	}
	// A line added above every router moves their origins only.
	if res, err := apply("a.yaml", "a", "# a comment\n"+routers("a-", 3, route), false); err != nil || res.Keys != 0 {
		t.Errorf("lines moved: %+v, %v", res, err)
	}
	// Router 3 removed, router 4 added.
	four := routers("a-", 4, route)
	three := strings.Replace(four, routers("a-", 3, route)[len("namespaces:\n"):], routers("a-", 2, route)[len("namespaces:\n"):], 1)
	if res, err := apply("a.yaml", "a", three, false); err != nil || res.Removed != 1 || res.Added != 1 || res.Unchanged != 2 {
		t.Errorf("one removed, one added: %+v, %v", res, err)
	}
	nss, err := Namespaces(ctx, cli)
	if err != nil || len(nss) != 3 {
		t.Fatalf("stored: %d, %v", len(nss), err)
	}
	if ns := nss[0]; ns.Name != "a-r1" || len(ns.Routes) != 2 || ns.Origin.File != "a.yaml" || ns.Origin.Line == 0 {
		t.Errorf("a-r1 stored as %+v", ns)
	}

	// Another spec may not take a name or a host interface of this one.
	_, err = apply("b.yaml", "b", "namespaces:\n  - name: a-r1\n", false)
	if err == nil || !strings.Contains(err.Error(), "b.yaml:2: namespace a-r1 is also in spec a (a.yaml:") {
		t.Errorf("name of another spec: %v", err)
	}
	_, err = apply("b.yaml", "b", "namespaces:\n  - name: b-r1\n    veths:\n      - host: a-q2\n        peer: x\n", false)
	if err == nil || !strings.Contains(err.Error(), "host interface a-q2 of b-r1 is also claimed by a-r2 of spec a (a.yaml:") {
		t.Errorf("host interface of another spec: %v", err)
	}
	if res, err := apply("b.yaml", "b", routers("b-", 2, ""), false); err != nil || res.Added != 2 {
		t.Fatalf("second spec: %+v, %v", res, err)
	}
	snap, err = Read(ctx, cli)
	if err != nil || len(snap.Names) != 5 || len(snap.Specs) != 2 || snap.SpecOf["b-r2"] != "b" {
		t.Fatalf("two specs: %+v, %v", snap, err)
	}
	if _, err := Delete(ctx, cli, "nope"); err == nil || !strings.Contains(err.Error(), "stored: a, b") {
		t.Errorf("delete of an unknown spec: %v", err)
	}
	if res, err := Delete(ctx, cli, "a"); err != nil || res.Namespaces != 3 {
		t.Errorf("delete a: %+v, %v", res, err)
	}
	snap, _ = Read(ctx, cli)
	if !slices.Equal(snap.Names, []string{"b-r1", "b-r2"}) || len(snap.Specs) != 1 {
		t.Errorf("after deleting a: %v, specs %v", snap.Names, snap.Specs)
	}
	// a's claims went with it: b may take its host interface now.
	if _, err = apply("b.yaml", "b", routers("b-", 2, "")+"  - name: b-r9\n    veths:\n      - host: a-q2\n        peer: x\n", false); err != nil {
		t.Errorf("a host interface freed by delete: %v", err)
	}
}

// A heterogeneous fleet of twice etcd's request limit is stored within
// etcd's defaults, no value over MaxValueBytes; one change writes two keys.
func TestApplyLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("stores 16,000 namespaces")
	}
	cli := testEtcd(t)
	ctx := context.Background()
	const n = 16000
	yaml := routers("", n, "")
	if len(yaml) < 1536*1024*3/2 {
		t.Fatalf("spec of %d bytes: not larger than etcd's request limit", len(yaml))
	}
	res, err := Apply(ctx, cli, mustParse(t, "big.yaml", yaml), ApplyOptions{Name: "big", Source: "big.yaml"})
	if err != nil || res.Added != n || res.Txns < 2*n/maxTxnOps {
		t.Fatalf("apply: %+v, %v", res, err)
	}
	resp, err := cli.Get(ctx, Prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if len(kv.Value) > MaxValueBytes {
			t.Errorf("%s: %d bytes", kv.Key, len(kv.Value))
		}
	}
	snap, err := Read(ctx, cli)
	if err != nil || len(snap.Names) != n {
		t.Fatalf("read: %d names, %v", len(snap.Names), err)
	}
	res, err = Apply(ctx, cli, mustParse(t, "big.yaml", routers("", n, "      - to: 192.0.2.0/24\n        via: 10.0.0.5\n")), ApplyOptions{Name: "big", Source: "big.yaml"})
	if err != nil || res.Changed != 1 || res.Keys != 2 || res.Txns != 1 {
		t.Errorf("one change in %d: %+v, %v", n, res, err)
	}
}

// A cluster of key layout 1 is moved while it serves: frozen (its spec no
// longer parses, its scheduler's writes in flight fail), copied whole.
func TestMigrate(t *testing.T) {
	cli := testEtcd(t)
	ctx := context.Background()
	yaml := "namespaces:\n  - name: \"bar-{i}\"\n    count: 4\n    veths:\n      - host: \"qro-{i}\"\n        peer: qri\n"
	lease, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	put := func(k string, v any, opts ...clientv3.OpOption) {
		s, ok := v.(string)
		if !ok {
			s = encode(v)
		}
		if _, err := cli.Put(ctx, k, s, opts...); err != nil {
			t.Fatal(err)
		}
	}
	put(V1KeySchema, "1")
	put(V1KeySpec, v1SpecDoc{Source: "/etc/nsfleet/fake-routers.yaml", YAML: yaml, Count: 4})
	put(V1Prefix+"assign/node-a", Assignment{Names: []string{"bar-1", "bar-3"}})
	put(V1Prefix+"assign/node-b", Assignment{Names: []string{"bar-2"}, Releasing: []string{"bar-4"}})
	put(V1Prefix+"cordon/node-b", Cordon{Reason: "maintenance"})
	put(V1NodesPrefix+"node-a", NodeInfo{Name: "node-a", LeaseID: int64(lease.ID)}, clientv3.WithLease(lease.ID))
	put(V1KeyAssignGen, "g")
	gen, _ := cli.Get(ctx, V1KeyAssignGen)

	if _, err := Apply(ctx, cli, mustParse(t, "x.yaml", yaml), ApplyOptions{Name: "x"}); err != ErrLayoutV1 {
		t.Errorf("apply before migrate: %v, want ErrLayoutV1", err)
	}
	res, err := Migrate(ctx, cli, "", "test")
	if err != nil || res.Spec != "fake-routers" || res.Assigned != 3 || res.Nodes != 2 || !res.Frozen {
		t.Fatalf("migrate: %+v, %v", res, err)
	}
	snap, err := Read(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	if a := snap.Assign["node-a"]; !slices.Equal(a.Names, []string{"bar-1", "bar-3"}) {
		t.Errorf("node-a: %+v", a)
	}
	if b := snap.Assign["node-b"]; !slices.Equal(b.Names, []string{"bar-2"}) || !slices.Equal(b.Releasing, []string{"bar-4"}) {
		t.Errorf("node-b: %+v", b)
	}
	if len(snap.Names) != 4 || snap.Specs["fake-routers"].Count != 4 || snap.Cordons["node-b"].Reason != "maintenance" {
		t.Errorf("copied: names %v, specs %v, cordons %v", snap.Names, snap.Specs, snap.Cordons)
	}
	if !snap.Legacy["node-a"] || snap.Nodes["node-a"].LeaseID != int64(lease.ID) {
		t.Errorf("node-a, still on layout 1, is not seen alive: %+v", snap.Nodes)
	}
	st := ViewOf(snap, snap.Names)
	if p := Schedule(st); p.Assign["node-a"] != nil {
		t.Errorf("the scheduler rewrites the legacy node's assignment: %+v", p.Assign["node-a"])
	}
	// Layout 1 is frozen: its spec does not parse, assign-gen moved.
	cur, _ := cli.Get(ctx, V1KeySpec)
	var doc v1SpecDoc
	json.Unmarshal(cur.Kvs[0].Value, &doc)
	if _, err := spec.Parse(doc.Source, []byte(doc.YAML), spec.Options{}); err == nil {
		t.Errorf("layout 1 spec still parses: %q", doc.YAML)
	}
	if g, _ := cli.Get(ctx, V1KeyAssignGen); g.Kvs[0].ModRevision == gen.Kvs[0].ModRevision {
		t.Error("layout 1 assign-gen not bumped")
	}
	// Again: nothing to do, nothing broken.
	if res, err := Migrate(ctx, cli, "", "test"); err != nil || res.Frozen || res.Spec != "fake-routers" {
		t.Errorf("second migrate: %+v, %v", res, err)
	}
	if res, err := Apply(ctx, cli, mustParse(t, "fake-routers.yaml", yaml), ApplyOptions{Name: "fake-routers", Source: "/etc/nsfleet/fake-routers.yaml"}); err != nil || res.Unchanged != 4 || res.Keys != 0 {
		t.Errorf("apply after migrate: %+v, %v", res, err)
	}
}

// FuzzDecodeNamespace: any stored value either is refused or decodes to a
// namespace that, stored again, decodes to the same.
func FuzzDecodeNamespace(f *testing.F) {
	fl, err := spec.Parse("f.yaml", []byte(routers("f-", 2, "")), spec.Options{})
	if err != nil {
		f.Fatal(err)
	}
	for i := range fl.Namespaces {
		val, _ := EncodeNamespace(&fl.Namespaces[i])
		f.Add("f-r"+strconv.Itoa(i+1), val)
	}
	f.Add("x", []byte(`{"origin":{},"namespace":{"name":"x","veths":[{"host":"a","peer":"b","host_addresses":["10.0.0.1/8"]}],"routes":[{"to":"0.0.0.0/0","via":"1.2.3.4"}]}}`))
	f.Fuzz(func(t *testing.T, name string, val []byte) {
		ns, err := DecodeNamespace(name, val)
		if err != nil {
			return
		}
		again, _ := EncodeNamespace(ns)
		ns2, err := DecodeNamespace(name, again)
		if err != nil {
			t.Fatalf("re-encoded value refused: %v\n%s", err, again)
		}
		if !reflect.DeepEqual(ns, ns2) {
			t.Fatalf("round trip changed it:\n%+v\n%+v", ns, ns2)
		}
	})
}

// A plan longer than one transaction is written whole, chained on
// assign-gen; a write by someone else in between breaks the chain.
func TestCommitChained(t *testing.T) {
	cli := testEtcd(t)
	ctx := context.Background()
	leader, err := cli.Put(ctx, "leader", "x")
	if err != nil {
		t.Fatal(err)
	}
	sc := &scheduler{cli: cli}
	guard := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision("leader"), "=", leader.Header.Revision),
		clientv3.Compare(clientv3.ModRevision(KeyAssignGen), "=", 0),
	}
	var ops []clientv3.Op
	for i := range 300 {
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("%sk%03d", AssignPrefix, i), "v"))
	}
	rev, ok, err := sc.commit(ctx, guard, ops, time.Now())
	if err != nil || !ok {
		t.Fatalf("commit of 300 ops: %v, %v", ok, err)
	}
	resp, _ := cli.Get(ctx, AssignPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	gen, _ := cli.Get(ctx, KeyAssignGen)
	if resp.Count != 300 || len(gen.Kvs) != 1 || gen.Kvs[0].ModRevision != rev {
		t.Errorf("after commit: %d keys, assign-gen %v, rev %d", resp.Count, gen.Kvs, rev)
	}
	// A stale guard (assign-gen moved since): nothing written.
	if _, ok, err := sc.commit(ctx, guard, ops[:1], time.Now()); err != nil || ok {
		t.Errorf("stale guard: ok %v, %v", ok, err)
	}
}

// With a node dead, a live node whose lease missed its renewals is
// suspect, one that renews is not; with nobody dead nobody is asked.
func TestMarkSuspects(t *testing.T) {
	cli := testEtcd(t)
	ctx := context.Background()
	grant := func() clientv3.LeaseID {
		l, err := cli.Grant(ctx, 4)
		if err != nil {
			t.Fatal(err)
		}
		return l.ID
	}
	renewing, silent := grant(), grant()
	snap := &Snapshot{
		Nodes:  map[string]NodeInfo{"a": {LeaseID: int64(renewing)}, "b": {LeaseID: int64(silent)}},
		Assign: map[string]Assignment{"a": {Names: []string{"r-1"}}, "b": {Names: []string{"r-2"}}},
	}
	sc := &scheduler{cli: cli, timeout: 5 * time.Second, log: slog.New(slog.DiscardHandler)}
	marked := func() (a, b bool) {
		st := ViewOf(snap, []string{"r-1", "r-2", "r-3"})
		sc.markSuspects(ctx, &st, snap)
		return st.Nodes["a"].Suspect, st.Nodes["b"].Suspect
	}
	// 2.5 s of a 4 s lease: b has 1.5 s left, a just renewed.
	time.Sleep(2500 * time.Millisecond)
	if _, err := cli.KeepAliveOnce(ctx, renewing); err != nil {
		t.Fatal(err)
	}
	if a, b := marked(); a || b {
		t.Errorf("nobody dead: suspects a=%v b=%v, want none asked about", a, b)
	}
	snap.Assign["c"] = Assignment{Names: []string{"r-3"}} // c: an assignment, no lease
	if a, b := marked(); a || !b {
		t.Errorf("c dead: suspects a=%v b=%v, want b only", a, b)
	}
}

// A spec with links is stored with a VNI for every link, in both of its
// namespaces' values, from the cluster's counter; applied again, the
// links keep theirs and nothing is written; the status reads the links.
func TestApplyLinks(t *testing.T) {
	cli := testEtcd(t)
	ctx := context.Background()
	f := mustParse(t, "lab.yaml", "namespaces:\n  - name: \"r{i}\"\n    count: 3\nlinks:\n  - {a: \"r{i}:e1\", b: \"r{i+1}:e0\", count: 2}\n")
	res, err := Apply(ctx, cli, f, ApplyOptions{Name: "lab", Source: "lab.yaml"})
	if err != nil || res.Added != 3 {
		t.Fatalf("apply: %+v %v", res, err)
	}
	resp, err := cli.Get(ctx, NsKey("lab", "r2"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("r2: %v", err)
	}
	r2, err := DecodeNamespace("r2", resp.Kvs[0].Value)
	if err != nil || len(r2.Links) != 2 || r2.Links[0].VNI == 0 || r2.Links[1].VNI == r2.Links[0].VNI {
		t.Fatalf("r2 stored: %+v %v", r2, err)
	}
	again := mustParse(t, "lab.yaml", "namespaces:\n  - name: \"r{i}\"\n    count: 3\nlinks:\n  - {a: \"r{i}:e1\", b: \"r{i+1}:e0\", count: 2}\n")
	if res, err := Apply(ctx, cli, again, ApplyOptions{Name: "lab", Source: "lab.yaml"}); err != nil || res.Changes() != 0 || res.Keys != 0 {
		t.Fatalf("second apply: %+v %v", res, err)
	}
	rep, err := Status(ctx, cli)
	if err != nil || rep.Links != 2 || rep.LinksCut != 0 {
		t.Fatalf("status links %d cut %d: %v", rep.Links, rep.LinksCut, err)
	}
}

// A failover plan cut off between two of its transactions (etcd timing
// out under load, or another writer) still leaves a failover record, which
// the next rounds complete and close: nothing is lost, nothing counted
// twice.
func TestFailoverCutOff(t *testing.T) {
	cli := testEtcd(t)
	ctx := context.Background()
	leader, err := cli.Put(ctx, "leader", "x")
	if err != nil {
		t.Fatal(err)
	}
	lease, err := cli.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"b", "c"} {
		if _, err := cli.Put(ctx, NodeKey(n), encode(NodeInfo{LeaseID: int64(lease.ID)}), clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
	}
	// Node a is dead and held 400 names, spread over its buckets.
	parts := map[string]*Assignment{}
	for i := range 400 {
		name := fmt.Sprintf("r-%d", i)
		if _, err := cli.Put(ctx, NsKey("gw", name), "{}"); err != nil {
			t.Fatal(err)
		}
		k := AssignKey("a", Bucket(name))
		if parts[k] == nil {
			parts[k] = &Assignment{}
		}
		parts[k].Names = append(parts[k].Names, name)
	}
	for k, a := range parts {
		if _, err := cli.Put(ctx, k, encode(a)); err != nil {
			t.Fatal(err)
		}
	}
	sc := &scheduler{cli: cli, timeout: 5 * time.Second, log: slog.New(slog.DiscardHandler)}
	round := func() *Snapshot {
		t.Helper()
		snap, err := Read(ctx, cli)
		if err != nil {
			t.Fatal(err)
		}
		if err := sc.round(ctx, snap, "leader", leader.Header.Revision); err != nil {
			t.Fatal(err)
		}
		snap, err = Read(ctx, cli)
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	// Cut off after the first transaction: another write moves assign-gen.
	sc.afterBatch = func(i int) {
		if i == 0 {
			cli.Put(ctx, KeyAssignGen, "someone else")
		}
	}
	snap := round()
	sc.afterBatch = nil
	if len(snap.Failovers) != 1 || snap.Failovers[0].Node != "a" || snap.Failovers[0].AssignRev != 0 || snap.Failovers[0].Moved != 400 {
		t.Fatalf("after the cut: records %+v, want one pending for a with 400 moved", snap.Failovers)
	}
	// The dead node's assignment went in the first transaction, part of
	// the survivors' after it: the next round sees no lost node, only
	// names to place.
	if got := len(snap.Assign["a"].Names) + len(snap.Assign["b"].Names) + len(snap.Assign["c"].Names); got >= 400 {
		t.Fatalf("the cut left %d names assigned: want part of the plan unwritten", got)
	}
	// The next rounds finish the move; still one record, still 400.
	for range 3 {
		snap = round()
	}
	placed := len(snap.Assign["b"].Names) + len(snap.Assign["c"].Names)
	if len(snap.Assign["a"].Names) != 0 || placed != 400 || len(snap.Failovers) != 1 || snap.Failovers[0].Moved != 400 {
		t.Fatalf("after the rounds: a %d, b+c %d, records %+v", len(snap.Assign["a"].Names), placed, snap.Failovers)
	}
	// b and c report the assignment served: the failover is done.
	for _, n := range []string{"b", "c"} {
		st := NodeStatus{AssignRev: snap.AssignGenRev, Assigned: len(snap.Assign[n].Names), Ready: len(snap.Assign[n].Names)}
		if _, err := cli.Put(ctx, StatusKey(n), encode(st)); err != nil {
			t.Fatal(err)
		}
	}
	snap = round()
	if len(snap.Failovers) != 1 || snap.Failovers[0].Ready.IsZero() {
		t.Errorf("after b and c served it: %+v, want the failover ready", snap.Failovers)
	}
}
