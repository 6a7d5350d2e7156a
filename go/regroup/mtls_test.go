// SPDX-License-Identifier: Apache-2.0

package regroup

import (
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
)

// testCA signs certificates for a test: PEM files in a temporary folder.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	writePEM(t, filepath.Join(dir, name+".crt"), "CERTIFICATE", der)
	return &testCA{cert: cert, key: key, dir: dir}
}

// sign writes NAME.crt and NAME.key, for 127.0.0.1, signed by the CA; returns the pair.
func (ca *testCA) sign(t *testing.T, name string, serial int64) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(ca.dir, name+".crt"), "CERTIFICATE", der)
	writePEM(t, filepath.Join(ca.dir, name+".key"), "PRIVATE KEY", keyDER)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Mutual TLS (issue 40): a coordinator given TLSClientCAFile completes a connection only with a
// client presenting a certificate that CA signed. Under TLS 1.3 the client's side of the handshake
// ends first; the server's refusal arrives as an alert on the first read, and an accepted client
// reads the server's HTTP/2 settings instead.
func TestACoordinatorWithAClientCAServesOnlyClientsItSigned(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	other := newTestCA(t, dir, "other-ca")
	ca.sign(t, "server", 2)
	manager := ca.sign(t, "manager", 3)
	stranger := other.sign(t, "stranger", 4)

	e := newEngine(t, Options{})
	c, err := StartCoordinator(e, CoordinatorOptions{Listen: "127.0.0.1:0", Credential: "token",
		TLSCertFile: filepath.Join(dir, "server.crt"), TLSKeyFile: filepath.Join(dir, "server.key"),
		TLSClientCAFile: filepath.Join(dir, "ca.crt")})
	if err != nil {
		t.Fatalf("StartCoordinator with a client CA: %v", err)
	}
	defer c.Close()
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	// connect reports whether the coordinator answered a client presenting `certs`.
	connect := func(certs []tls.Certificate) error {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp",
			fmt.Sprintf("127.0.0.1:%d", c.Port()),
			&tls.Config{RootCAs: roots, Certificates: certs, NextProtos: []string{"h2"}})
		if err != nil {
			return err
		}
		defer conn.Close()
		if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			return err
		}
		_, err = conn.Read(make([]byte, 64))
		return err
	}
	if err := connect([]tls.Certificate{manager}); err != nil {
		t.Errorf("a manager with a certificate the client CA signed: %v; want served", err)
	}
	if err := connect(nil); err == nil {
		t.Errorf("a manager without a certificate was served; want refused")
	}
	if err := connect([]tls.Certificate{stranger}); err == nil {
		t.Errorf("a manager with another CA's certificate was served; want refused")
	}
}
