package rls

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// testCA issues certificates for the TLS test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a leaf's PEM certificate and key.
func (ca *testCA) issue(t *testing.T, cn string, serial int64, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

// TestTLS: gRPC over mutual TLS; a client without a certificate from the
// client CA is refused; a reload with a new certificate serves it to new
// connections on the same listener; unreadable files fail the reload and
// change nothing.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA := newCA(t, "server ca"), newCA(t, "envoy ca")
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c1, k1 := serverCA.issue(t, "rls-1", 2, x509.ExtKeyUsageServerAuth)
	write("server.crt", c1)
	write("server.key", k1)
	write("client-ca.crt", clientCA.pem)
	cc, ck := clientCA.issue(t, "envoy", 3, x509.ExtKeyUsageClientAuth)
	clientCert, err := tls.X509KeyPair(cc, ck)
	if err != nil {
		t.Fatal(err)
	}
	policy := fmt.Sprintf(`
l7:
  rls:
    listen: 127.0.0.1:0
    tls: {cert: %[1]s/server.crt, key: %[1]s/server.key, client_ca: %[1]s/client-ca.crt}
    rules:
      - {name: per-ip, domain: edge, descriptor: [remote_address], limits: [{name: ip, rate: 10/s}]}
`, dir)
	s, _ := startServer(t, policy, nil, nil)
	addr := s.Addrs()["grpc+tls"]
	if addr == "" {
		t.Fatalf("no grpc+tls listener: %v", s.Addrs())
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(serverCA.pem)
	call := func(certs []tls.Certificate) (string, error) {
		var peerCN string
		tc := &tls.Config{RootCAs: roots, Certificates: certs, MinVersion: tls.VersionTLS12,
			VerifyConnection: func(cs tls.ConnectionState) error {
				peerCN = cs.PeerCertificates[0].Subject.CommonName
				return nil
			}}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			return "", err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		res, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address=192.0.2.1")}})
		if err == nil && res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			err = fmt.Errorf("answer %v", res.GetOverallCode())
		}
		return peerCN, err
	}
	if cn, err := call([]tls.Certificate{clientCert}); err != nil || cn != "rls-1" {
		t.Fatalf("mutual TLS: server %q, %v; want rls-1 and an answer", cn, err)
	}
	if _, err := call(nil); err == nil {
		t.Fatal("a client without a certificate was answered")
	}
	other := newCA(t, "someone else")
	oc, ok := other.issue(t, "intruder", 4, x509.ExtKeyUsageClientAuth)
	otherCert, _ := tls.X509KeyPair(oc, ok)
	if _, err := call([]tls.Certificate{otherCert}); err == nil {
		t.Fatal("a client certificate from another CA was answered")
	}
	// Rotation: new files, one reload, the same listener.
	c2, k2 := serverCA.issue(t, "rls-2", 5, x509.ExtKeyUsageServerAuth)
	write("server.crt", c2)
	write("server.key", k2)
	reload(t, s, policy)
	if got := s.Addrs()["grpc+tls"]; got != addr {
		t.Fatalf("the reload moved the listener: %s -> %s", addr, got)
	}
	if cn, err := call([]tls.Certificate{clientCert}); err != nil || cn != "rls-2" {
		t.Fatalf("after the rotation: server %q, %v; want rls-2", cn, err)
	}
	// A key that does not match fails the reload; the old certificate stays.
	write("server.key", k1)
	_, cfg := decodeL7(t, policy)
	if _, err := s.Prepare(cfg); err == nil {
		t.Fatal("a reload with a mismatched key succeeded")
	}
	if cn, err := call([]tls.Certificate{clientCert}); err != nil || cn != "rls-2" {
		t.Fatalf("after the failed reload: server %q, %v; want rls-2", cn, err)
	}
	// ALPN h2 is required: a client offering only http/1.1 fails the
	// handshake; one offering nothing is closed after it, unanswered.
	for _, protos := range [][]string{{"http/1.1"}, nil} {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{clientCert}, NextProtos: protos})
		if err != nil {
			continue // refused in the handshake
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.Write([]byte(http2.ClientPreface))
		if n, err := c.Read(make([]byte, 64)); err == nil {
			t.Errorf("ALPN %q: the server answered %d bytes, want the connection closed", protos, n)
		}
		_ = c.Close()
	}
}
