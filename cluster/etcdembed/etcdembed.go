// Package etcdembed runs an etcd member inside nsfleet's cluster binary:
// the agent's single-member default (one machine needs nothing else) and
// the members of `nsfleet sim`'s three-member cluster. Only the cluster
// binary imports it, so that etcd's server stays out of the start-up of
// every other nsfleet command.
package etcdembed

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Member describes one etcd member.
type Member struct {
	Name    string
	DataDir string
	Client  string // client URL, e.g. http://127.0.0.1:2379
	Peer    string // peer URL, e.g. http://127.0.0.1:2380
	// Cluster is the initial cluster, "name=peerURL,..."; empty: this
	// member alone.
	Cluster string
	LogFile string // etcd's own log; empty: DataDir/etcd.log
}

// Server is a running member.
type Server struct{ e *embed.Etcd }

// Start starts the member and waits until it serves (or 60 s).
func Start(m Member) (*Server, error) {
	cu, err := url.Parse(m.Client)
	if err != nil {
		return nil, fmt.Errorf("etcd client URL %q: %w", m.Client, err)
	}
	pu, err := url.Parse(m.Peer)
	if err != nil {
		return nil, fmt.Errorf("etcd peer URL %q: %w", m.Peer, err)
	}
	if err := os.MkdirAll(m.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("etcd data dir: %w", err)
	}
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = filepath.Join(m.DataDir, "member-data")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = m.Cluster
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = m.Name + "=" + m.Peer
	}
	cfg.InitialClusterToken = "nsfleet"
	if _, err := os.Stat(filepath.Join(cfg.Dir, "member")); err == nil {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	cfg.LogLevel = "warn"
	log := m.LogFile
	if log == "" {
		log = filepath.Join(m.DataDir, "etcd.log")
	}
	cfg.LogOutputs = []string{log}
	// No metrics listener of its own: the agent exposes nsfleet's.
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w (its log: %s)", m.Name, err, log)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd %s: %w (its log: %s)", m.Name, err, log)
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("etcd %s: not ready after 60 s (its log: %s)", m.Name, log)
	}
	return &Server{e: e}, nil
}

// Err reports a fatal error of the running member.
func (s *Server) Err() <-chan error { return s.e.Err() }

// Close stops the member.
func (s *Server) Close() { s.e.Close() }
