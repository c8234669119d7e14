package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Graph is the links between stored namespaces: for each namespace with
// links, the namespaces at their other ends (once per link). Only specs
// with links (SpecMeta.Links) are read for it, so a cluster of routers
// without links pays nothing.
type Graph map[string][]string

// graphKey names the specs a Graph was read from, as applied: it changes
// when one of them is applied again, or one with links comes or goes.
func graphKey(snap *Snapshot) string {
	var b strings.Builder
	for _, name := range sortedKeys(snap.Specs) {
		if m := snap.Specs[name]; m.Links > 0 {
			fmt.Fprintf(&b, "%s@%s/%d;", name, m.Applied.Format("20060102T150405.000000000"), m.Links)
		}
	}
	return b.String()
}

// ReadGraph reads the links of every stored spec that has some.
func ReadGraph(ctx context.Context, cli *clientv3.Client, snap *Snapshot) (Graph, error) {
	g := Graph{}
	for _, sp := range sortedKeys(snap.Specs) {
		if snap.Specs[sp].Links == 0 {
			continue
		}
		prefix := NsPrefix + sp + "/"
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(snap.Rev))
		if err != nil {
			return nil, fmt.Errorf("links of spec %s: %w", sp, err)
		}
		for _, kv := range resp.Kvs {
			name := strings.TrimPrefix(string(kv.Key), prefix)
			ns, err := DecodeNamespace(name, kv.Value)
			if err != nil {
				continue // the agents report it; no links known for it
			}
			for i := range ns.Links {
				_, other := ns.Links[i].Ends(name)
				g[name] = append(g[name], other.Namespace)
			}
		}
	}
	return g, nil
}

// Links is how many links g has.
func (g Graph) Links() int {
	n := 0
	for _, o := range g {
		n += len(o)
	}
	return n / 2
}

// Cut counts the links whose two namespaces are assigned to two nodes
// (where: namespace to node; a namespace assigned nowhere cuts nothing).
func (g Graph) Cut(where map[string]string) int {
	n := 0
	for a, others := range g {
		for _, b := range others {
			na, nb := where[a], where[b]
			if a < b && na != "" && nb != "" && na != nb {
				n++
			}
		}
	}
	return n
}

// Placement maps each assigned namespace to its node (Releasing ones too:
// they are still there).
func Placement(assign map[string]Assignment) map[string]string {
	where := map[string]string{}
	for _, node := range sortedKeys(assign) {
		a := assign[node]
		for _, n := range slices.Concat(a.Names, a.Releasing) {
			where[n] = node
		}
	}
	return where
}
