package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestFailsafeVerdict(t *testing.T) {
	cut := &PeerAnswer{Node: "x", ReachesEtcd: false}
	reaches := &PeerAnswer{Node: "x", ReachesEtcd: true}
	for _, tc := range []struct {
		name    string
		peers   []string
		answers map[string]*PeerAnswer
		serve   bool
	}{
		{"no peers: nobody can take over", nil, nil, true},
		{"all answer, none reaches etcd: an etcd outage", []string{"a", "b"}, map[string]*PeerAnswer{"a": cut, "b": cut}, true},
		{"one reaches etcd: it may take over", []string{"a", "b"}, map[string]*PeerAnswer{"a": cut, "b": reaches}, false},
		{"one does not answer: it may be the one that reaches etcd", []string{"a", "b"}, map[string]*PeerAnswer{"a": cut}, false},
		{"cut off from everyone", []string{"a", "b"}, map[string]*PeerAnswer{}, false},
	} {
		if got, why := FailsafeVerdict(tc.peers, tc.answers); got != tc.serve {
			t.Errorf("%s: serve %v (%s), want %v", tc.name, got, why, tc.serve)
		}
	}
}

// certs writes a CA and two certificates it signed (for nodes a and b,
// client usage only, as etcd client certificates are), and one signed by
// another CA; it returns their files.
func certs(t *testing.T) (ca string, a, b, stranger [2]string) {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, der []byte, typ string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true,
			BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		return c, key, der
	}
	leaf := func(name string, caCert *x509.Certificate, caKey *ecdsa.PrivateKey) [2]string {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kd, _ := x509.MarshalECPrivateKey(key)
		return [2]string{write(name+".pem", der, "CERTIFICATE"), write(name+"-key.pem", kd, "EC PRIVATE KEY")}
	}
	caCert, caKey, caDER := newCA("cluster CA")
	otherCert, otherKey, _ := newCA("another CA")
	return write("ca.pem", caDER, "CERTIFICATE"), leaf("a", caCert, caKey), leaf("b", caCert, caKey), leaf("x", otherCert, otherKey)
}

// TestPeerTLS: peers that hold certificates of the cluster's CA ask and
// answer each other; a certificate of another CA is refused both ways.
func TestPeerTLS(t *testing.T) {
	ca, a, b, x := certs(t)
	serve := func(pair [2]string) string {
		srvTLS, _, err := PeerTLS(ca, pair[0], pair[1])
		if err != nil {
			t.Fatal(err)
		}
		ag := &Agent{cfg: AgentConfig{Node: "b", LeaseTTL: 5 * time.Second, PeerServerTLS: srvTLS}}
		ag.lastQuorum.Store(time.Now().UnixNano())
		ts := httptest.NewUnstartedServer(ag.PeerHandler())
		ts.TLS = srvTLS
		ts.StartTLS()
		t.Cleanup(ts.Close)
		return ts.URL + PeerPath
	}
	ask := func(pair [2]string, url string) (*PeerAnswer, error) {
		_, cliTLS, err := PeerTLS(ca, pair[0], pair[1])
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return askPeer(ctx, peerClient(cliTLS), url)
	}
	url := serve(b)
	if ans, err := ask(a, url); err != nil || ans.Node != "b" || !ans.ReachesEtcd {
		t.Fatalf("a asks b: %+v %v", ans, err)
	}
	if _, err := ask(x, url); err == nil {
		t.Fatal("a certificate of another CA was answered")
	}
	if _, err := ask(a, serve(x)); err == nil {
		t.Fatal("an answer under a certificate of another CA was taken")
	}
}
