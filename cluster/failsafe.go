package cluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Failsafe: an agent that cannot renew its lease asks its peers before it
// fences. If every peer it knows answers, and none of them reaches etcd
// either, nobody can take its namespaces over (taking over needs etcd: the
// scheduler writes assignments there), so it keeps serving what it has,
// creating and changing nothing, until etcd is back. If any peer does not
// answer, or any peer reaches etcd, it fences as before. The rule is
// Patroni's failsafe_mode: all peers, not a majority, since a peer that
// does not answer may be the one that reaches etcd.

// PeerPath is where an agent answers its peers.
const PeerPath = "/v1/peer"

// PeerAnswer is what an agent tells a peer about itself.
type PeerAnswer struct {
	Node string `json:"node"`
	// ReachesEtcd: its lease was renewed, and etcd answered a
	// linearizable read (it had a quorum), within one renewal period
	// (TTL/3) plus 250 ms. Longer would count a peer that lost etcd a moment
	// after this node did as reaching it; a peer whose renewal is merely
	// slow says false until it succeeds, and the asking node, which asks
	// again every failsafeRetry, fences then.
	ReachesEtcd bool      `json:"reaches_etcd"`
	LastQuorum  time.Time `json:"last_quorum"`
}

// PeerHandler answers peers' questions about this agent.
func (a *Agent) PeerHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PeerPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(a.peerAnswer())
	})
	return mux
}

func (a *Agent) peerAnswer() PeerAnswer {
	last := time.Unix(0, a.lastQuorum.Load())
	return PeerAnswer{Node: a.cfg.Node, LastQuorum: last.UTC(),
		ReachesEtcd: a.lastQuorum.Load() != 0 && time.Since(last) < a.cfg.LeaseTTL/3+250*time.Millisecond}
}

// servePeers listens on the configured peer address until ctx ends.
func (a *Agent) servePeers(ctx context.Context) error {
	if a.cfg.PeerAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", a.cfg.PeerAddr)
	if err != nil {
		return fmt.Errorf("peer address %s: %w", a.cfg.PeerAddr, err)
	}
	srv := &http.Server{Handler: a.PeerHandler(), ReadHeaderTimeout: time.Second}
	if a.cfg.PeerServerTLS != nil {
		ln = tls.NewListener(ln, a.cfg.PeerServerTLS)
	}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go srv.Serve(ln)
	return nil
}

// peerURL is what this agent announces in its node key.
func (a *Agent) peerURL() string {
	if a.cfg.PeerAddr == "" {
		return ""
	}
	if a.cfg.PeerServerTLS != nil {
		return "https://" + a.cfg.PeerAddr + PeerPath
	}
	return "http://" + a.cfg.PeerAddr + PeerPath
}

// peerBook is the peers an agent knows, from its last reads of the node
// keys: node name to peer URL ("" for a node that announced none).
type peerBook struct {
	mu    sync.Mutex
	peers map[string]string
}

func (b *peerBook) set(all map[string]NodeInfo, self string) {
	m := map[string]string{}
	for n, info := range all {
		if n != self {
			m[n] = info.PeerURL
		}
	}
	b.mu.Lock()
	b.peers = m
	b.mu.Unlock()
}

func (b *peerBook) put(node, url string) {
	b.mu.Lock()
	if b.peers == nil {
		b.peers = map[string]string{}
	}
	b.peers[node] = url
	b.mu.Unlock()
}

func (b *peerBook) remove(node string) {
	b.mu.Lock()
	delete(b.peers, node)
	b.mu.Unlock()
}

// snapshot copies the book; nil when no node keys were read yet.
func (b *peerBook) snapshot() map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.peers == nil {
		return nil
	}
	m := make(map[string]string, len(b.peers))
	for k, v := range b.peers {
		m[k] = v
	}
	return m
}

// FailsafeVerdict decides, from the peers' answers, whether a node that
// cannot renew its lease may keep serving. answers has one entry per known
// peer; a nil answer is a peer that did not answer. It is pure.
func FailsafeVerdict(peers []string, answers map[string]*PeerAnswer) (bool, string) {
	for _, p := range peers {
		a := answers[p]
		switch {
		case a == nil:
			return false, "peer " + p + " does not answer"
		case a.ReachesEtcd:
			return false, "peer " + p + " reaches etcd"
		}
	}
	if len(peers) == 0 {
		return true, "no peers: nobody can take over"
	}
	return true, fmt.Sprintf("all %d peers answer and none reaches etcd", len(peers))
}

// askPeers asks every known peer, in parallel, within timeout.
func (a *Agent) askPeers(ctx context.Context, timeout time.Duration) (bool, string) {
	book := a.peers.snapshot()
	if book == nil {
		return false, "peers unknown (no node keys read yet)"
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var mu sync.Mutex
	answers := map[string]*PeerAnswer{}
	var wg sync.WaitGroup
	names := make([]string, 0, len(book))
	for node, url := range book {
		names = append(names, node)
		if url == "" {
			continue // announced no address: cannot answer
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ans, err := askPeer(ctx, a.peerHTTP, url)
			if err == nil && ans.Node == node {
				mu.Lock()
				answers[node] = ans
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return FailsafeVerdict(names, answers)
}

// peerClient asks peers; with tlsConfig (PeerTLS) it speaks TLS with the
// node's certificate.
func peerClient(tlsConfig *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil, TLSClientConfig: tlsConfig}}
}

func askPeer(ctx context.Context, client *http.Client, url string) (*PeerAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, errors.New(resp.Status)
	}
	var ans PeerAnswer
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 4096)).Decode(&ans); err != nil {
		return nil, err
	}
	return &ans, nil
}
