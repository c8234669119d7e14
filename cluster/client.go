package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// ClientConfig says how to reach etcd.
type ClientConfig struct {
	Endpoints   []string
	CA          string // PEM file of the CA that signed etcd's server certificate
	Cert, Key   string // client certificate for etcd's client TLS authentication
	Username    string // etcd authentication (the password comes from NSFLEET_ETCD_PASSWORD)
	Password    string
	DialTimeout time.Duration // 0: 5 s
}

// DefaultDialTimeout bounds how long an unreachable etcd takes to report.
const DefaultDialTimeout = 5 * time.Second

func (c ClientConfig) dialTimeout() time.Duration {
	if c.DialTimeout <= 0 {
		return DefaultDialTimeout
	}
	return c.DialTimeout
}

// Where names the endpoints for messages.
func (c ClientConfig) Where() string { return strings.Join(c.Endpoints, ",") }

// ErrNoAnswer is matched by errors.Is when etcd did not answer Connect's
// first request in time: a transient fault that a daemon waits out.
var ErrNoAnswer = errors.New("no answer")

// Connect opens a client and proves etcd answers (one read) within the
// dial timeout, so that an unreachable etcd is an error here and not a
// hang later.
func Connect(ctx context.Context, c ClientConfig) (*clientv3.Client, error) {
	cli, err := Dial(c)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, c.dialTimeout())
	defer cancel()
	if _, err := cli.Get(pctx, KeySchema); err != nil {
		cli.Close()
		if errors.Is(err, context.DeadlineExceeded) || pctx.Err() != nil {
			return nil, fmt.Errorf("etcd %s: %w within %s (is it running and reachable? set --etcd or NSFLEET_ETCD)", c.Where(), ErrNoAnswer, c.dialTimeout())
		}
		return nil, fmt.Errorf("etcd %s: %w", c.Where(), err)
	}
	return cli, nil
}

// Dial opens a client without waiting for etcd: it connects when used.
func Dial(c ClientConfig) (*clientv3.Client, error) {
	if len(c.Endpoints) == 0 {
		return nil, errors.New("no etcd endpoints")
	}
	cfg := clientv3.Config{
		Endpoints:            c.Endpoints,
		DialTimeout:          c.dialTimeout(),
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Username:             c.Username,
		Password:             c.Password,
		Logger:               zap.NewNop(),
	}
	if c.CA != "" || c.Cert != "" {
		t, err := tlsConfig(c)
		if err != nil {
			return nil, err
		}
		cfg.TLS = t
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", c.Where(), err)
	}
	return cli, nil
}

func tlsConfig(c ClientConfig) (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CA != "" {
		pem, err := os.ReadFile(c.CA)
		if err != nil {
			return nil, fmt.Errorf("etcd CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd CA %s: no PEM certificate in it", c.CA)
		}
		t.RootCAs = pool
	}
	if c.Cert != "" || c.Key != "" {
		if c.Cert == "" || c.Key == "" {
			return nil, errors.New("etcd client TLS: --etcd-cert and --etcd-key go together")
		}
		pair, err := tls.LoadX509KeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, fmt.Errorf("etcd client certificate: %w", err)
		}
		t.Certificates = []tls.Certificate{pair}
	}
	return t, nil
}
