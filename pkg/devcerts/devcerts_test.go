// SPDX-License-Identifier: Apache-2.0

package devcerts

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
)

// verify checks the certificate of a pair written to dir against dir's CA,
// for name (a DNS name or an IP address, "" for none) and usage.
func verify(t *testing.T, dir, cert, key, name string, usage x509.ExtKeyUsage) error {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dir, CACert))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.crt holds no certificate")
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, cert), filepath.Join(dir, key))
	if err != nil {
		t.Fatalf("%s: %v", cert, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: name, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

func TestWriteMakesAChainThatVerifies(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, Options{ServerName: "xds.example.internal"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cert, key, name string
		usage           x509.ExtKeyUsage
	}{
		{ServerCert, ServerKey, "xds.example.internal", x509.ExtKeyUsageServerAuth},
		{ServerCert, ServerKey, "localhost", x509.ExtKeyUsageServerAuth},
		{ServerCert, ServerKey, "127.0.0.1", x509.ExtKeyUsageServerAuth},
		{ClientCert, ClientKey, "", x509.ExtKeyUsageClientAuth},
	} {
		if err := verify(t, dir, c.cert, c.key, c.name, c.usage); err != nil {
			t.Errorf("%s for %q: %v", c.cert, c.name, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, ClientKey)); err != nil {
		t.Error(err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Errorf("client.key mode = %v, want 0600", fi.Mode().Perm())
	}
}

// A server reached by IP address: its certificate must hold the address.
func TestWriteServerNameIsAnIPAddress(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, Options{ServerName: "10.0.0.5"}); err != nil {
		t.Fatal(err)
	}
	if err := verify(t, dir, ServerCert, ServerKey, "10.0.0.5", x509.ExtKeyUsageServerAuth); err != nil {
		t.Fatal(err)
	}
}
