// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/l4xds/l4xds/pkg/devcerts"
)

// handshake connects to lis as a client of the CA in dir, with that dir's
// client certificate, and returns the handshake's error.
func handshake(t *testing.T, lis net.Listener, dir string) error {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dir, devcerts.CACert))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, devcerts.ClientCert), filepath.Join(dir, devcerts.ClientKey))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{
		RootCAs: pool, ServerName: "localhost", Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"},
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	// With TLS 1.3 the server's verdict on the client certificate arrives
	// after the client's handshake: read to see it.
	_, err = conn.Read(make([]byte, 1))
	return err
}

// Certificates rotated in place (here: a whole new CA) are used by the
// next handshake, without building a new configuration.
func TestServerTLSConfigReloadsRotatedFiles(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		if err := devcerts.Write(d, devcerts.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	conf, err := ServerTLSConfig(filepath.Join(dir, devcerts.ServerCert), filepath.Join(dir, devcerts.ServerKey), filepath.Join(dir, devcerts.CACert))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			// Complete the handshake, then send one byte.
			go func() {
				defer c.Close()
				if c.(*tls.Conn).Handshake() == nil {
					c.Write([]byte{1})
				}
			}()
		}
	}()

	if err := handshake(t, lis, dir); err != nil {
		t.Fatalf("client of the current CA: %v", err)
	}
	if err := handshake(t, lis, other); err == nil {
		t.Fatal("client of another CA accepted")
	}

	// Rotate: the files of dir now hold a new CA and certificates.
	for _, name := range []string{devcerts.CACert, devcerts.ServerCert, devcerts.ServerKey} {
		data, err := os.ReadFile(filepath.Join(other, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".tmp"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, name+".tmp"), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := handshake(t, lis, other); err != nil {
		t.Fatalf("client of the rotated CA: %v", err)
	}
}

func TestServerTLSConfigNamesBadFiles(t *testing.T) {
	dir := t.TempDir()
	if err := devcerts.Write(dir, devcerts.Options{}); err != nil {
		t.Fatal(err)
	}
	_, err := ServerTLSConfig(filepath.Join(dir, devcerts.ServerCert), filepath.Join(dir, devcerts.ServerKey), filepath.Join(dir, devcerts.ServerKey))
	if err == nil || err.Error() != "client CA "+filepath.Join(dir, devcerts.ServerKey)+": no PEM certificate found" {
		t.Fatalf("error = %v", err)
	}
}
