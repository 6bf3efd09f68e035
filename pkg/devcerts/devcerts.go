// SPDX-License-Identifier: Apache-2.0

// Package devcerts makes a development certificate authority and the server
// and client certificates signed by it, for trying l4xds with mTLS and for
// tests. They are not meant for production: keys are written unencrypted.
package devcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// File names written by Write.
const (
	CACert     = "ca.crt"
	CAKey      = "ca.key"
	ServerCert = "server.crt"
	ServerKey  = "server.key"
	ClientCert = "client.crt"
	ClientKey  = "client.key"
)

// Options of Write.
type Options struct {
	// ServerName is put in the server certificate's DNS names, or its IP
	// addresses when it is one; "localhost", 127.0.0.1 and ::1 are always
	// there too.
	ServerName string
	// ClientName is the client certificate's common name.
	ClientName string
	// Validity of every certificate; 1 year when zero.
	Validity time.Duration
}

// Write creates dir if needed and writes a new CA and a server and a client
// certificate signed by it, each as PEM files named by the constants above.
func Write(dir string, opts Options) error {
	if opts.ClientName == "" {
		opts.ClientName = "l4xds-agent"
	}
	if opts.Validity == 0 {
		opts.Validity = 365 * 24 * time.Hour
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	now := time.Now().Add(-time.Minute)
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "l4xds development CA"},
		NotBefore:             now,
		NotAfter:              now.Add(opts.Validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("create CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writePair(dir, CACert, CAKey, caDER, caKey); err != nil {
		return err
	}

	dnsNames := []string{"localhost"}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	// Clients check an address they dial against the IP addresses of the
	// certificate, never against its DNS names.
	if ip := net.ParseIP(opts.ServerName); ip != nil {
		ips = append(ips, ip)
	} else if opts.ServerName != "" && opts.ServerName != "localhost" {
		dnsNames = append(dnsNames, opts.ServerName)
	}
	leaves := []struct {
		cert, key string
		tmpl      x509.Certificate
	}{
		{ServerCert, ServerKey, x509.Certificate{
			Subject:     pkix.Name{CommonName: dnsNames[len(dnsNames)-1]},
			DNSNames:    dnsNames,
			IPAddresses: ips,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}},
		{ClientCert, ClientKey, x509.Certificate{
			Subject:     pkix.Name{CommonName: opts.ClientName},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}},
	}
	for _, l := range leaves {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := l.tmpl
		tmpl.SerialNumber = serial()
		tmpl.NotBefore = now
		tmpl.NotAfter = now.Add(opts.Validity)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, &tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("create %s: %w", l.cert, err)
		}
		if err := writePair(dir, l.cert, l.key, der, key); err != nil {
			return err
		}
	}
	return nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// writePair writes a certificate and its key; each file is written to a
// temporary name and renamed, so a watcher never reads half a file.
func writePair(dir, certName, keyName string, der []byte, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(dir, keyName), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, certName), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
