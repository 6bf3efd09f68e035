// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
)

// ServerTLSConfig returns a TLS 1.2+ server configuration that presents
// certFile/keyFile and requires every client to present a certificate
// signed by a CA in clientCAFile.
//
// The three files are checked again at each handshake and re-read when one
// of them changed (size or modification time, through symlinks), so rotated
// certificates take effect without a restart. A rotation caught half-written
// keeps the previous certificates until the files are whole again.
func ServerTLSConfig(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	r := &tlsReloader{certFile: certFile, keyFile: keyFile, caFile: clientCAFile}
	if err := r.reload(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequireAndVerifyClientCert,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.current(), nil
		},
	}, nil
}

type tlsReloader struct {
	certFile, keyFile, caFile string

	mu     sync.Mutex
	stamps [3]fileStamp
	config *tls.Config
}

// fileStamp tells whether a file changed. The inode catches a
// rename-replace even within the file system's time resolution.
type fileStamp struct {
	size    int64
	modTime time.Time
	inode   uint64
}

func (r *tlsReloader) stat() ([3]fileStamp, error) {
	var out [3]fileStamp
	for i, f := range []string{r.certFile, r.keyFile, r.caFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return out, err
		}
		out[i] = fileStamp{size: fi.Size(), modTime: fi.ModTime()}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			out[i].inode = st.Ino
		}
	}
	return out, nil
}

func (r *tlsReloader) current() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	if stamps, err := r.stat(); err == nil && stamps != r.stamps {
		if err := r.reloadLocked(); err != nil {
			slog.Warn("Keeping the previous TLS certificates", "error", err)
		}
	}
	return r.config
}

func (r *tlsReloader) reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reloadLocked()
}

func (r *tlsReloader) reloadLocked() error {
	stamps, err := r.stat()
	if err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("loading server certificate %s and key %s: %w", r.certFile, r.keyFile, err)
	}
	caPEM, err := os.ReadFile(r.caFile)
	if err != nil {
		return fmt.Errorf("reading client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("client CA %s: no PEM certificate found", r.caFile)
	}
	r.config = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		Certificates: []tls.Certificate{cert},
		// gRPC requires HTTP/2 to be negotiated.
		NextProtos: []string{"h2"},
	}
	r.stamps = stamps
	return nil
}
