package clustercli

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/cluster"
	"github.com/nsfleet/nsfleet/cluster/sim"
	"github.com/nsfleet/nsfleet/internal/complete"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// completeTimeout bounds what a TAB may wait for etcd: an unreachable
// cluster completes nothing rather than hanging the shell.
const completeTimeout = time.Second

// completions teaches the shells' completion what each argument is: node
// names (from etcd for the cluster's commands, from the sim's directory
// for sim's), stored spec names, namespace names, spec files.
func completions(root *cobra.Command, g *globals) {
	complete.Files(root)
	for _, c := range root.Commands() {
		for _, sub := range c.Commands() {
			switch c.Name() + " " + sub.Name() {
			case "cluster drain", "cluster failover":
				sub.ValidArgsFunction = g.etcdKeys(cluster.NodesPrefix, cluster.AssignPrefix)
			case "cluster uncordon":
				sub.ValidArgsFunction = g.etcdKeys(cluster.CordonPrefix)
			case "cluster delete":
				sub.ValidArgsFunction = g.etcdKeys(cluster.SpecsPrefix)
			case "cluster wait":
				sub.ValidArgsFunction = g.etcdKeys(cluster.NsPrefix)
			case "sim kill", "sim partition", "sim heal", "sim restart":
				sub.ValidArgsFunction = simNodes
			}
		}
	}
}

// etcdKeys completes one argument from the first path element after each
// prefix's keys (a node, a spec), or the last one for namespace keys
// (ns/SPEC/NAME); keys only, no values.
func (g *globals) etcdKeys(prefixes ...string) complete.Func {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 && prefixes[0] != cluster.NsPrefix {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), completeTimeout)
		defer cancel()
		eps, _ := g.endpoints()
		cfg := g.clientConfig(eps)
		cfg.DialTimeout = completeTimeout
		cli, err := cluster.Connect(ctx, cfg)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer cli.Close()
		seen := map[string]bool{}
		for _, p := range prefixes {
			resp, err := cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			for _, kv := range resp.Kvs {
				rest := strings.TrimPrefix(string(kv.Key), p)
				if p == cluster.NsPrefix {
					rest = rest[strings.LastIndexByte(rest, '/')+1:]
				} else if i := strings.IndexByte(rest, '/'); i >= 0 {
					rest = rest[:i]
				}
				if rest != "" && strings.HasPrefix(rest, toComplete) {
					seen[rest] = true
				}
			}
		}
		return sortedKeys(seen), cobra.ShellCompDirectiveNoFileComp
	}
}

// simNodes completes a node of the sim that --dir names.
func simNodes(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	dir, _ := cmd.Flags().GetString("dir")
	if len(args) > 0 || dir == "" {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	st, err := sim.Load(dir)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	seen := map[string]bool{}
	for _, n := range st.Nodes {
		if strings.HasPrefix(n.Name, toComplete) {
			seen[n.Name] = true
		}
	}
	return sortedKeys(seen), cobra.ShellCompDirectiveNoFileComp
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
