// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// tlsFiles makes the TLS configuration of the connections to the server from
// files on disk. The files are read at every handshake rather than once: a
// handshake happens once per connection attempt, so the cost is nil, and a
// rotated certificate or CA (cert-manager, a mounted Secret) is used by the
// next connection without a restart and without a watcher that could miss
// an atomic rename.
type tlsFiles struct {
	certPath, keyPath, caPath string
	serverName                string

	mu      sync.Mutex
	lastErr error
}

func (f *tlsFiles) config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: f.serverName,
		// The chain and the name are verified in verifyConnection against
		// the CA file as it is at this handshake; crypto/tls can only
		// verify against a pool fixed when the config is made.
		InsecureSkipVerify:   true,
		VerifyConnection:     f.verifyConnection,
		GetClientCertificate: f.clientCertificate,
	}
}

func (f *tlsFiles) clientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(f.certPath, f.keyPath)
	if err != nil {
		return nil, f.fail(fmt.Errorf("tls: client certificate: %w", err))
	}
	return &cert, nil
}

func (f *tlsFiles) verifyConnection(cs tls.ConnectionState) error {
	pem, err := os.ReadFile(f.caPath)
	if err != nil {
		return f.fail(fmt.Errorf("tls: CA certificates: %w", err))
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return f.fail(fmt.Errorf("tls: CA certificates: no PEM certificate in %s", f.caPath))
	}
	if len(cs.PeerCertificates) == 0 {
		return f.fail(errors.New("tls: server presented no certificate"))
	}
	intermediates := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		intermediates.AddCert(c)
	}
	_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: intermediates,
		DNSName:       f.serverName,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return f.fail(fmt.Errorf("tls: %s", strings.TrimPrefix(err.Error(), "x509: ")))
	}
	return nil
}

// fail remembers the handshake error: gRPC wraps it in several layers of
// text, and the operator deserves the one line that matters.
func (f *tlsFiles) fail(err error) error {
	f.mu.Lock()
	f.lastErr = err
	f.mu.Unlock()
	return err
}

// takeErr returns and forgets the last handshake error.
func (f *tlsFiles) takeErr() error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.lastErr
	f.lastErr = nil
	return err
}

// Prefixes gRPC puts in front of a transport error.
var grpcErrorPrefixes = []string{
	"connection error: desc = ",
	"transport: authentication handshake failed: ",
	"transport: ",
	"error reading server preface: ",
}

// cleanError turns a stream error into one readable line: the gRPC status
// message without gRPC's wrapping, or the TLS error the handshake reported.
func cleanError(err error, handshakeErr error) error {
	if handshakeErr != nil {
		return handshakeErr
	}
	s, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := s.Message()
	for changed := true; changed; {
		changed = false
		if u, uerr := strconv.Unquote(msg); uerr == nil {
			msg, changed = u, true
		}
		for _, p := range grpcErrorPrefixes {
			if strings.HasPrefix(msg, p) {
				msg, changed = strings.TrimPrefix(msg, p), true
			}
		}
	}
	switch s.Code() {
	case codes.Unavailable, codes.Unknown:
		return errors.New(msg)
	default:
		return fmt.Errorf("%s: %s", s.Code(), msg)
	}
}

// verdictWait bounds how long a new TLS 1.3 connection waits for the
// server's first bytes before gRPC takes over.
const verdictWait = 500 * time.Millisecond

// verdictCreds waits, after a TLS 1.3 handshake, for the server's first
// bytes. In TLS 1.3 the server checks the client certificate after the
// client considers the handshake done; a server that refuses it sends an
// alert, and gRPC, busy writing its preface, would report "broken pipe"
// instead. gRPC servers speak first (their HTTP/2 SETTINGS), so this costs
// one round trip at most; the bytes read are replayed to gRPC.
type verdictCreds struct {
	credentials.TransportCredentials
	files *tlsFiles
}

func (c verdictCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, err
	}
	if ti, ok := info.(credentials.TLSInfo); !ok || ti.State.Version != tls.VersionTLS13 {
		return conn, info, nil
	}
	conn.SetReadDeadline(time.Now().Add(verdictWait))
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	conn.SetReadDeadline(time.Time{})
	var nerr net.Error
	if n == 0 && err != nil && !(errors.As(err, &nerr) && nerr.Timeout()) {
		conn.Close()
		return nil, nil, c.files.fail(fmt.Errorf("tls: the server refused the connection: %w", err))
	}
	return &replayConn{Conn: conn, pending: buf[:n]}, info, nil
}

func (c verdictCreds) Clone() credentials.TransportCredentials {
	return verdictCreds{c.TransportCredentials.Clone(), c.files}
}

// replayConn returns pending before reading from Conn.
type replayConn struct {
	net.Conn
	pending []byte
}

func (c *replayConn) Read(b []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(b, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}
