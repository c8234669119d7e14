package clustercli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/nsfleet/nsfleet/cluster"
	"github.com/nsfleet/nsfleet/cluster/etcdembed"
	"github.com/nsfleet/nsfleet/internal/privilege"
	"github.com/nsfleet/nsfleet/internal/version"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func newAgent(g *globals) *cobra.Command {
	var node, runDir, metricsAddr, dataDir, peerAddr string
	var ttl, resync time.Duration
	var capacity, workers, maxMoves int
	var rebalanceAfter time.Duration
	watchdog := true
	var allowProcs bool
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Serve this node's share of the cluster's fleet, and fail over for lost nodes",
		Long: `agent runs on every node. It holds a lease in etcd (the node is alive while
the lease is), takes part in the scheduler election, and makes the node serve
what is assigned to it: it creates and repairs those namespaces with the same
engine as 'nsfleet up', tears down what moved away, and keeps their processes
running as 'nsfleet supervise' does. Drift (a namespace or veth deleted, lo
set down, forwarding changed) is repaired within about a second, from kernel
events; a full check runs every --resync.

If the lease cannot be renewed, the agent fences itself before the lease can
expire: host veths set down, nothing created. With --peer-addr it first asks
its peers: if every one answers and none reaches etcd either (an etcd outage,
not a node cut off), nobody can take its namespaces over, so it keeps serving
them, changing nothing, until etcd is back (failsafe). When it reaches etcd again it
tears down every namespace that moved away before it takes new work. An agent
restarted on the same node adopts the namespaces still assigned to it.

Without --etcd (or NSFLEET_ETCD) the agent starts an etcd of its own, a
single member on loopback with its data in --data-dir: one machine needs
nothing else.`,
		Example: `  # one machine, embedded etcd
  nsfleet agent &
  nsfleet cluster apply -f examples/fake-routers.yaml

  # a node of a real cluster
  nsfleet agent --node gw-3 --etcd https://10.0.0.1:2379 --etcd-ca ca.pem \
      --etcd-cert gw-3.pem --etcd-key gw-3-key.pem --capacity 4000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := privilege.Need("agent"); err != nil {
				return err
			}
			if node == "" {
				h, err := os.Hostname()
				if err != nil {
					return fmt.Errorf("agent: --node not given and no hostname: %w", err)
				}
				node = h
			}
			if err := cluster.ValidNodeName(node); err != nil {
				return usageError{fmt.Errorf("agent: %w", err)}
			}
			if capacity < 0 {
				return usageError{fmt.Errorf("agent: --capacity %d: want 0 (no limit) or more", capacity)}
			}
			ctx := cmd.Context()
			eps, given := g.endpoints()
			if !given {
				srv, err := etcdembed.Start(etcdembed.Member{Name: node, DataDir: filepath.Join(dataDir, "etcd"),
					Client: DefaultEtcd, Peer: "http://127.0.0.1:2380"})
				if err != nil {
					return fmt.Errorf("agent: embedded etcd: %w", err)
				}
				defer srv.Close()
				g.log.Info("embedded etcd serving on loopback", "client", DefaultEtcd, "data", dataDir)
			}
			// A service waits for etcd: an agent started (or restarted)
			// while etcd is down must come up when it does, and its
			// namespaces are left alone meanwhile.
			cli, err := cluster.Connect(ctx, g.clientConfig(eps))
			for errors.Is(err, cluster.ErrNoAnswer) && ctx.Err() == nil {
				g.log.Warn("agent: waiting for etcd", "err", err)
				time.Sleep(time.Second)
				cli, err = cluster.Connect(ctx, g.clientConfig(eps))
			}
			if err != nil {
				return fmt.Errorf("agent: %w", err)
			}
			defer cli.Close()
			var renewers []*clientv3.Client
			if len(eps) > 1 {
				for _, ep := range eps {
					c, err := cluster.Dial(g.clientConfig([]string{ep}))
					if err != nil {
						g.log.Warn("agent: renewing through one endpoint fewer", "endpoint", ep, "err", err)
						continue
					}
					defer c.Close()
					renewers = append(renewers, c)
				}
			}
			rd, err := netns.OpenRunDir(runDir, true)
			if err != nil {
				return fmt.Errorf("agent: %w", err)
			}
			lock, err := lockRunDir(ctx, rd, g.log)
			if err != nil {
				return fmt.Errorf("agent: %w", err)
			}
			defer lock.Unlock()
			var peerSrv, peerCli *tls.Config
			if peerAddr != "" && g.ca != "" && g.cert != "" && g.key != "" {
				// The peers' questions are mutual TLS with the certificates
				// every agent has for etcd.
				if peerSrv, peerCli, err = cluster.PeerTLS(g.ca, g.cert, g.key); err != nil {
					return fmt.Errorf("agent: %w", err)
				}
			}
			m := cluster.NewMetrics(node)
			a, err := cluster.NewAgent(cluster.AgentConfig{Node: node, Client: cli, RunDir: rd, LeaseTTL: ttl,
				Capacity: capacity, AllowProcesses: allowProcs, Resync: resync, Workers: workers,
				Log: g.log.With("node", node), Metrics: m, Version: version.String(), PeerAddr: peerAddr,
				RebalanceAfter: rebalanceAfter, MaxMoves: maxMoves, NoWatchdog: !watchdog, Renewers: renewers,
				PeerServerTLS: peerSrv, PeerClientTLS: peerCli})
			if err != nil {
				return usageError{fmt.Errorf("agent: %w", err)}
			}
			if metricsAddr != "" {
				srv, err := serveMetrics(metricsAddr, m, a)
				if err != nil {
					return fmt.Errorf("agent: metrics: %w", err)
				}
				defer srv.Close()
			}
			err = a.Run(ctx)
			if errors.Is(err, context.Canceled) {
				err = nil
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&node, "node", "", "this node's name in the cluster (default: the hostname)")
	f.StringVar(&runDir, "run-dir", netns.DefaultRunDir, "directory of namespace pins")
	f.DurationVar(&ttl, "lease-ttl", 5*time.Second, "node lease: a node silent this long is lost and its namespaces move")
	f.IntVar(&capacity, "capacity", 0, "most namespaces this node takes (0: no limit)")
	f.StringVar(&metricsAddr, "metrics-addr", "127.0.0.1:9465", "address of /metrics and /healthz (empty: none)")
	f.BoolVar(&allowProcs, "allow-processes", false, "serve specs that run processes (whoever can write the cluster's keys then runs commands as root here)")
	f.DurationVar(&resync, "resync", 5*time.Minute, "full check of every assigned namespace this often")
	f.StringVar(&dataDir, "data-dir", "/var/lib/nsfleet", "data of the embedded etcd (used without --etcd)")
	f.IntVarP(&workers, "workers", "w", 0, "parallel workers (0: one per CPU)")
	f.StringVar(&peerAddr, "peer-addr", "", "host:port on the node network where this agent answers its peers (announced in etcd); with it, an agent that loses etcd keeps serving while no peer reaches etcd either (failsafe); empty: it fences. With --etcd-ca, --etcd-cert and --etcd-key the peers speak mutual TLS with those certificates")
	f.DurationVar(&rebalanceAfter, "rebalance-after", cluster.DefaultSettle, "when this agent schedules: a node that came back (new lease after a pause or partition) gets namespaces moved onto it by balance only after this long")
	f.BoolVar(&watchdog, "watchdog", true, "run a watchdog process that sets this node's host veths down when the agent stops extending its deadline (stopped, frozen, or gone without a successor), at the moment the agent would have fenced")
	f.IntVar(&maxMoves, "max-moves", cluster.DefaultMaxMoves, "when this agent schedules: most namespaces balance moves in one step (failover and drain are not bounded)")
	return cmd
}

type closer interface{ Close() error }

func serveMetrics(addr string, m *cluster.Metrics, a *cluster.Agent) (closer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ok, why := a.Healthy()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, why)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return srv, nil
}

func newWatchdog(g *globals) *cobra.Command {
	var runDir string
	var idle time.Duration
	cmd := &cobra.Command{
		Use:    "__watchdog",
		Short:  "fence this node when its agent stops (started by the agent)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cluster.RunWatchdog(cmd.Context(), cluster.WatchdogAddr(runDir), idle, g.log)
		},
	}
	cmd.Flags().StringVar(&runDir, "run-dir", netns.DefaultRunDir, "the agent's run dir")
	cmd.Flags().DurationVar(&idle, "idle", time.Minute, "exit when no agent extended the deadline for this long")
	return cmd
}

func newEtcdMember(g *globals) *cobra.Command {
	var m etcdembed.Member
	cmd := &cobra.Command{
		Use:    "__etcd-member",
		Short:  "run one etcd member (used by nsfleet sim)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			srv, err := etcdembed.Start(m)
			if err != nil {
				return err
			}
			defer srv.Close()
			select {
			case <-cmd.Context().Done():
				return nil
			case err := <-srv.Err():
				return err
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&m.Name, "name", "", "member name")
	f.StringVar(&m.DataDir, "data-dir", "", "data directory")
	f.StringVar(&m.Client, "client", "", "client URL")
	f.StringVar(&m.Peer, "peer", "", "peer URL")
	f.StringVar(&m.Cluster, "initial-cluster", "", "name=peerURL,...")
	return cmd
}

// lockRunDir takes the run dir's lock, waiting while another nsfleet holds
// it: a `nsfleet up` run by hand finishes, and an agent restarted after a
// crash finds its predecessor's lock held until the last of that process's
// threads has exited (its main thread is a zombie before then). An agent is
// a service: failing would only make its supervisor restart it.
func lockRunDir(ctx context.Context, rd *netns.RunDir, log *slog.Logger) (*netns.Lock, error) {
	for logged := false; ; {
		lock, err := rd.Lock(false)
		if !errors.Is(err, netns.ErrLocked) {
			return lock, err
		}
		if !logged {
			log.Warn("waiting for the run dir lock", "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}
