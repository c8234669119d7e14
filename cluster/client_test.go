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
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// pki writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, as PEM files in dir.
func pki(t *testing.T, dir string) (ca, srvCert, srvKey, cliCert, cliKey string) {
	t.Helper()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nsfleet test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(k)
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kb)
	}
	ca = write("ca.pem", "CERTIFICATE", caDER)
	srvCert, srvKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	cliCert, cliKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestConnectTLSAndAuth runs a real etcd with client certificate
// authentication, then with users, and connects as the agent does.
func TestConnectTLSAndAuth(t *testing.T) {
	dir := t.TempDir()
	ca, sc, sk, cc, ck := pki(t, dir)
	cu, _ := url.Parse("https://" + freePort(t))
	pu, _ := url.Parse("http://" + freePort(t))
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "data")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.ClientTLSInfo.CertFile, cfg.ClientTLSInfo.KeyFile = sc, sk
	cfg.ClientTLSInfo.TrustedCAFile, cfg.ClientTLSInfo.ClientCertAuth = ca, true
	// No log file: zap would keep it open after the server is closed.
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready")
	}
	ctx := context.Background()
	good := ClientConfig{Endpoints: []string{cu.String()}, CA: ca, Cert: cc, Key: ck, DialTimeout: 2 * time.Second}
	cli, err := Connect(ctx, good)
	if err != nil {
		t.Fatalf("with CA and client certificate: %v", err)
	}
	defer cli.Close()

	noCert := good
	noCert.Cert, noCert.Key = "", ""
	if c, err := Connect(ctx, noCert); err == nil {
		c.Close()
		t.Error("etcd requires a client certificate, but Connect without one succeeded")
	}
	halfCert := good
	halfCert.Key = ""
	if _, err := Connect(ctx, halfCert); err == nil || !strings.Contains(err.Error(), "go together") {
		t.Errorf("certificate without key: %v", err)
	}

	// Authentication on: root with a password.
	if _, err := cli.UserAdd(ctx, "root", "s3cret"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	withUser := good
	withUser.Username, withUser.Password = "root", "s3cret"
	c2, err := Connect(ctx, withUser)
	if err != nil {
		t.Fatalf("with user and password: %v", err)
	}
	if _, err := c2.Put(ctx, KeySchema, SchemaVersion); err != nil {
		t.Errorf("write as root: %v", err)
	}
	c2.Close()
	withUser.Password = "wrong"
	if c3, err := Connect(ctx, withUser); err == nil {
		c3.Close()
		t.Error("a wrong password connected")
	}
}
