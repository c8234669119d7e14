package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
)

// PeerTLS returns the TLS configurations of the failsafe's peer questions,
// made from the cluster's etcd client certificates: every agent has one,
// signed by the cluster's CA. The agent serves its answer with its
// certificate and asks for the asker's; both sides accept a certificate
// only if the CA signed it. Host names are not checked (node addresses
// are rarely in etcd client certificates); the CA is the trust.
func PeerTLS(caFile, certFile, keyFile string) (server, client *tls.Config, err error) {
	// The same files, read as for etcd itself.
	base, err := tlsConfig(ClientConfig{CA: caFile, Cert: certFile, Key: keyFile})
	if err != nil {
		return nil, nil, fmt.Errorf("peer TLS: %w", err)
	}
	pool, pair := base.RootCAs, base.Certificates[0]
	verify := func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("peer TLS: no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err
	}
	server = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair},
		ClientAuth: tls.RequireAnyClientCert, VerifyConnection: verify}
	client = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair},
		InsecureSkipVerify: true, VerifyConnection: verify} // verified by VerifyConnection, against the CA
	return server, client, nil
}
