// Package clustercli is the command line of nsfleet's cluster binary
// (agent, cluster, sim). It is a binary of its own so that etcd's client
// and server stay out of the start-up of every other nsfleet command;
// `nsfleet agent|cluster|sim` hand over to it.
package clustercli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/cluster"
	"github.com/nsfleet/nsfleet/internal/exitcode"
	"github.com/nsfleet/nsfleet/internal/version"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultEtcd is where the agent's embedded etcd listens, and so where the
// cluster commands look when neither --etcd nor NSFLEET_ETCD says.
const DefaultEtcd = "http://127.0.0.1:2379"

type globals struct {
	etcd        string
	ca, cert    string
	key, user   string
	dialTimeout time.Duration
	verbose     bool
	logFormat   string
	stdout      io.Writer
	stderr      io.Writer
	log         *slog.Logger
}

// usageError is exitcode's, by its short local name.
type usageError = exitcode.UsageError

// Run runs the cluster binary with args and returns the exit code (see
// package exitcode).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := &globals{stdout: stdout, stderr: stderr}
	return exitcode.Execute(ctx, newRoot(g), args, stdout, stderr)
}

// Command is the cluster binary's command tree, for generated docs (man
// pages); it runs nothing.
func Command() *cobra.Command { return newRoot(&globals{stdout: io.Discard, stderr: io.Discard}) }

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "nsfleet",
		Short: "nsfleet's cluster: agents on etcd, the cluster's commands, a cluster on one machine",
		Long: `A fleet spread over nodes: an agent per node (nsfleet agent) serves what the
elected scheduler assigns to it, in etcd; when a node's lease expires, its
namespaces are re-created on the survivors. 'nsfleet cluster' changes and
shows the cluster; 'nsfleet sim' makes a whole cluster on one machine.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			level := slog.LevelInfo
			if g.verbose {
				level = slog.LevelDebug
			}
			opts := &slog.HandlerOptions{Level: level}
			switch g.logFormat {
			case "text":
				g.log = slog.New(slog.NewTextHandler(g.stderr, opts))
			case "json":
				g.log = slog.New(slog.NewJSONHandler(g.stderr, opts))
			default:
				return usageError{Err: fmt.Errorf("--log-format %q: want text or json", g.logFormat)}
			}
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.etcd, "etcd", "", "etcd client URLs, comma-separated (default $NSFLEET_ETCD, else "+DefaultEtcd+")")
	pf.StringVar(&g.ca, "etcd-ca", "", "CA certificate (PEM) that signed etcd's server certificate")
	pf.StringVar(&g.cert, "etcd-cert", "", "client certificate (PEM) for etcd's client authentication")
	pf.StringVar(&g.key, "etcd-key", "", "key of --etcd-cert")
	pf.StringVar(&g.user, "etcd-user", "", "etcd user (authentication on); the password is read from $NSFLEET_ETCD_PASSWORD")
	pf.DurationVar(&g.dialTimeout, "dial-timeout", cluster.DefaultDialTimeout, "how long an unreachable etcd may take to report")
	pf.BoolVarP(&g.verbose, "verbose", "v", false, "log more")
	pf.StringVar(&g.logFormat, "log-format", "text", "text (for people) or json (one object a line, for log shippers)")
	root.AddCommand(newAgent(g), newCluster(g), newSim(g), newEtcdMember(g), newWatchdog(g), version.Command(g.stdout))
	// Its commands are completed through nsfleet's script (nsfleet asks
	// this binary's hidden __complete), so no script of its own, which
	// would claim the name nsfleet.
	root.CompletionOptions.DisableDefaultCmd = true
	completions(root, g)
	return root
}

// endpoints returns the etcd URLs asked for, and whether any was.
func (g *globals) endpoints() ([]string, bool) {
	s := g.etcd
	if s == "" {
		s = os.Getenv("NSFLEET_ETCD")
	}
	if s == "" {
		return []string{DefaultEtcd}, false
	}
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out, true
}

func (g *globals) clientConfig(eps []string) cluster.ClientConfig {
	return cluster.ClientConfig{Endpoints: eps, CA: g.ca, Cert: g.cert, Key: g.key,
		Username: g.user, Password: os.Getenv("NSFLEET_ETCD_PASSWORD"), DialTimeout: g.dialTimeout}
}

// connect opens a client to the configured etcd.
func (g *globals) connect(ctx context.Context, op string) (*clientv3.Client, error) {
	eps, _ := g.endpoints()
	cli, err := cluster.Connect(ctx, g.clientConfig(eps))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return cli, nil
}

// rpc bounds one request by the dial timeout, so that an etcd that dies
// mid-command is an error, not a hang.
func (g *globals) rpc(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, g.dialTimeout)
}
