// SPDX-License-Identifier: Apache-2.0

package devcerts

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteMakesAChainThatVerifies(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, Options{ServerName: "xds.example.internal"}); err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, CACert))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.crt holds no certificate")
	}
	for _, c := range []struct {
		cert, key, name string
		usage           x509.ExtKeyUsage
	}{
		{ServerCert, ServerKey, "xds.example.internal", x509.ExtKeyUsageServerAuth},
		{ServerCert, ServerKey, "localhost", x509.ExtKeyUsageServerAuth},
		{ClientCert, ClientKey, "", x509.ExtKeyUsageClientAuth},
	} {
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, c.cert), filepath.Join(dir, c.key))
		if err != nil {
			t.Fatalf("%s: %v", c.cert, err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: c.name, KeyUsages: []x509.ExtKeyUsage{c.usage}}); err != nil {
			t.Errorf("%s for %q: %v", c.cert, c.name, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, ClientKey)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("client.key mode = %v, %v; want 0600", fi.Mode().Perm(), err)
	}
}
