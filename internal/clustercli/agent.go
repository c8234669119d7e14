package clustercli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/nsfleet/nsfleet/cluster"
	"github.com/nsfleet/nsfleet/cluster/etcdembed"
	"github.com/nsfleet/nsfleet/internal/caps"
	"github.com/nsfleet/nsfleet/internal/version"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func newAgent(g *globals) *cobra.Command {
	var cfg cluster.AgentConfig
	var local agentLocal
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
			if err := caps.Need("agent"); err != nil {
				return err
			}
			if cfg.Node == "" {
				h, err := os.Hostname()
				if err != nil {
					return fmt.Errorf("agent: --node not given and no hostname: %w", err)
				}
				cfg.Node = h
			}
			if err := cluster.ValidNodeName(cfg.Node); err != nil {
				return usageError{Err: fmt.Errorf("agent: %w", err)}
			}
			if cfg.Capacity < 0 {
				return usageError{Err: fmt.Errorf("agent: --capacity %d: want 0 (no limit) or more", cfg.Capacity)}
			}
			ctx := cmd.Context()
			eps, given := g.endpoints()
			var err error
			if cfg.TunnelAddr, err = tunnelAddr(local.tunnelAddr, cfg.PeerAddr, eps); err != nil {
				return usageError{Err: fmt.Errorf("agent: %w", err)}
			}
			if !given {
				srv, err := etcdembed.Start(etcdembed.Member{Name: cfg.Node, DataDir: filepath.Join(local.dataDir, "etcd"),
					Client: DefaultEtcd, Peer: "http://127.0.0.1:2380"})
				if err != nil {
					return fmt.Errorf("agent: embedded etcd: %w", err)
				}
				defer srv.Close()
				g.log.Info("embedded etcd serving on loopback", "client", DefaultEtcd, "data", local.dataDir)
			}
			var closeAll func()
			if cfg.Client, cfg.Renewers, closeAll, err = dialAgentEtcd(ctx, g, eps); err != nil {
				return err
			}
			defer closeAll()
			rd, err := netns.OpenRunDir(local.runDir, true)
			if err != nil {
				return fmt.Errorf("agent: %w", err)
			}
			lock, err := lockRunDir(ctx, rd, g.log)
			if err != nil {
				return fmt.Errorf("agent: %w", err)
			}
			defer lock.Unlock()
			if cfg.PeerAddr != "" && g.ca != "" && g.cert != "" && g.key != "" {
				// The peers' questions are mutual TLS with the certificates
				// every agent has for etcd.
				if cfg.PeerServerTLS, cfg.PeerClientTLS, err = cluster.PeerTLS(g.ca, g.cert, g.key); err != nil {
					return fmt.Errorf("agent: %w", err)
				}
			}
			cfg.RunDir, cfg.Metrics = rd, cluster.NewMetrics(cfg.Node)
			cfg.Log, cfg.Version, cfg.NoWatchdog = g.log.With("node", cfg.Node), version.String(), !local.watchdog
			a, err := cluster.NewAgent(cfg)
			if err != nil {
				return usageError{Err: fmt.Errorf("agent: %w", err)}
			}
			if local.metricsAddr != "" {
				srv, err := serveMetrics(local.metricsAddr, cfg.Metrics, a, local.pprof)
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
	agentFlags(cmd, &cfg, &local)
	return cmd
}

// agentLocal is what the agent command needs beyond cluster.AgentConfig.
type agentLocal struct {
	runDir, metricsAddr, dataDir string
	watchdog, pprof              bool
	tunnelAddr                   string
}

// tunnelAddr is the agent's underlay address for tunnels: the one given,
// else the host of --peer-addr, else the address this node sends from to
// reach etcd (a UDP socket's choice: nothing is sent).
func tunnelAddr(given, peerAddr string, eps []string) (netip.Addr, error) {
	if given != "" {
		a, err := netip.ParseAddr(given)
		if err != nil || !a.Is4() {
			return netip.Addr{}, fmt.Errorf("--tunnel-addr %q: want an IPv4 address of this node", given)
		}
		return a, nil
	}
	if host, _, err := net.SplitHostPort(peerAddr); err == nil {
		if a, err := netip.ParseAddr(host); err == nil && a.Is4() && !a.IsUnspecified() {
			return a, nil
		}
	}
	for _, ep := range eps {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			continue
		}
		c, err := net.Dial("udp4", u.Host)
		if err != nil {
			continue
		}
		a := c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
		c.Close()
		return a, nil
	}
	return netip.Addr{}, nil
}

func agentFlags(cmd *cobra.Command, cfg *cluster.AgentConfig, local *agentLocal) {
	f := cmd.Flags()
	f.StringVar(&cfg.Node, "node", "", "this node's name in the cluster (default: the hostname)")
	f.StringVar(&local.runDir, "run-dir", netns.DefaultRunDir, "directory of namespace pins")
	f.DurationVar(&cfg.LeaseTTL, "lease-ttl", 5*time.Second, "node lease: a node silent this long is lost and its namespaces move")
	f.IntVar(&cfg.Capacity, "capacity", 0, "most namespaces this node takes (0: no limit)")
	f.StringVar(&local.metricsAddr, "metrics-addr", "127.0.0.1:9465", "address of /metrics and /healthz (empty: none)")
	f.BoolVar(&local.pprof, "enable-pprof", false, "serve Go's profiles at /debug/pprof/ on --metrics-addr (as etcd's flag of that name)")
	f.BoolVar(&cfg.AllowProcesses, "allow-processes", false, "serve specs that run processes (whoever can write the cluster's keys then runs commands as root here)")
	f.DurationVar(&cfg.Resync, "resync", 5*time.Minute, "full check of every assigned namespace this often")
	f.StringVar(&local.dataDir, "data-dir", "/var/lib/nsfleet", "data of the embedded etcd (used without --etcd)")
	f.IntVarP(&cfg.Workers, "workers", "w", 0, "parallel workers (0: one per CPU)")
	f.StringVar(&cfg.PeerAddr, "peer-addr", "", "host:port on the node network where this agent answers its peers (announced in etcd); with it, an agent that loses etcd keeps serving while no peer reaches etcd either (failsafe); empty: it fences. With --etcd-ca, --etcd-cert and --etcd-key the peers speak mutual TLS with those certificates")
	f.DurationVar(&cfg.RebalanceAfter, "rebalance-after", cluster.DefaultSettle, "when this agent schedules: a node that came back (new lease after a pause or partition) gets namespaces moved onto it by balance only after this long")
	f.BoolVar(&local.watchdog, "watchdog", true, "run a watchdog process that sets this node's host veths down when the agent stops extending its deadline (stopped, frozen, or gone without a successor), at the moment the agent would have fenced")
	f.StringVar(&local.tunnelAddr, "tunnel-addr", "", "this node's IPv4 address for the VXLAN tunnels of links whose two namespaces are on two nodes (default: the host of --peer-addr, else the address this node reaches etcd from)")
	f.IntVar(&cfg.TunnelPort, "tunnel-port", 4789, "UDP port of those tunnels, the same on every node")
	f.IntVar(&cfg.TunnelMTU, "tunnel-mtu", 1500, "MTU of the node network under those tunnels: a tunnelled link's ends get at most this less 50 (VXLAN's overhead)")
	f.IntVar(&cfg.MaxMoves, "max-moves", cluster.DefaultMaxMoves, "when this agent schedules: most namespaces balance moves in one step (failover and drain are not bounded)")
}

// dialAgentEtcd connects the agent's client, waiting for etcd as a service
// does (an agent started while etcd is down comes up when it does, and its
// namespaces are left alone meanwhile), and with several endpoints one
// client per endpoint to renew the lease through (AgentConfig.Renewers).
func dialAgentEtcd(ctx context.Context, g *globals, eps []string) (*clientv3.Client, []*clientv3.Client, func(), error) {
	cli, err := cluster.Connect(ctx, g.clientConfig(eps))
	for errors.Is(err, cluster.ErrNoAnswer) && ctx.Err() == nil {
		g.log.Warn("agent: waiting for etcd", "err", err)
		time.Sleep(time.Second)
		cli, err = cluster.Connect(ctx, g.clientConfig(eps))
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("agent: %w", err)
	}
	var renewers []*clientv3.Client
	if len(eps) > 1 {
		for _, ep := range eps {
			c, err := cluster.Dial(g.clientConfig([]string{ep}))
			if err != nil {
				g.log.Warn("agent: renewing through one endpoint fewer", "endpoint", ep, "err", err)
				continue
			}
			renewers = append(renewers, c)
		}
	}
	closeAll := func() {
		for _, c := range renewers {
			c.Close()
		}
		cli.Close()
	}
	return cli, renewers, closeAll, nil
}

type closer interface{ Close() error }

func serveMetrics(addr string, m *cluster.Metrics, a *cluster.Agent, profiles bool) (closer, error) {
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
	if profiles {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
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
			return cluster.RunWatchdog(cmd.Context(), runDir, idle, g.log)
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
