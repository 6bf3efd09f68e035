// SPDX-License-Identifier: Apache-2.0

// Package cptest runs the reference control plane (pkg/controlplane) inside
// a test: real gRPC, real mTLS certificates made for the test, driven from
// hive scripts. The standalone agent's and the Cilium module's script tests
// share it.
package cptest

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"

	"github.com/l4xds/l4xds/pkg/controlplane"
	"github.com/l4xds/l4xds/pkg/devcerts"
	"github.com/l4xds/l4xds/pkg/xds"
)

// Start makes certificates and starts a server on a loopback port; it
// stops with the test.
func Start(tb testing.TB) *Server {
	certs := tb.TempDir()
	if err := devcerts.Write(certs, devcerts.Options{}); err != nil {
		tb.Fatal(err)
	}
	s := &Server{tb: tb, certs: certs}
	s.start("127.0.0.1:0")
	tb.Cleanup(s.stop)
	return s
}

// Configure points an xDS client at the server over mTLS, with protocol
// (xds.ProtocolSotW or xds.ProtocolDelta) and a short does-not-exist timeout.
func (s *Server) Configure(c *xds.Config, protocol string) {
	c.EnableXDSControlPlane = true
	c.XDSServerAddress = s.addr
	c.XDSServerName = "localhost"
	c.XDSCACertPath = filepath.Join(s.certs, devcerts.CACert)
	c.XDSClientCertPath = filepath.Join(s.certs, devcerts.ClientCert)
	c.XDSClientKeyPath = filepath.Join(s.certs, devcerts.ClientKey)
	c.XDSNodeID = "script-node"
	c.XDSProtocol = protocol
	c.XDSResourceDoesNotExistTimeout = 2 * time.Second
}

// Server is the reference control plane in-process for tests, with real
// mTLS, restartable on the same address, remembering the NACKs its clients
// sent. Its script commands (Commands) drive it from hive scripts.
type Server struct {
	tb    testing.TB
	certs string
	addr  string

	mu        sync.Mutex
	srv       *controlplane.Server
	resources controlplane.Resources
	nacks     []string
}

func (s *Server) start(addr string) {
	tlsConfig, err := controlplane.ServerTLSConfig(
		filepath.Join(s.certs, devcerts.ServerCert), filepath.Join(s.certs, devcerts.ServerKey),
		filepath.Join(s.certs, devcerts.CACert))
	if err != nil {
		s.tb.Fatal(err)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		s.tb.Fatal(err)
	}
	srv := controlplane.NewServer(controlplane.Options{
		TLS:    tlsConfig,
		Logger: slog.New(&nackRecorder{s: s, next: hivetest.Logger(s.tb).Handler()}),
	})
	s.mu.Lock()
	s.addr, s.srv = lis.Addr().String(), srv
	// A server told nothing yet serves an empty state, as the scripts
	// expect: the real server holds streams until its first Set.
	res := s.resources
	if res == nil {
		res = controlplane.Resources{}
	}
	if err := srv.Set(res); err != nil {
		s.tb.Fatal(err)
	}
	s.mu.Unlock()
	go srv.Serve(lis)
}

func (s *Server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		s.srv.Stop()
		s.srv = nil
	}
}

// Set serves res instead of the current resources (also while stopped:
// the next start serves them).
func (s *Server) Set(res controlplane.Resources) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resources = res
	if s.srv != nil {
		return s.srv.Set(res)
	}
	return nil
}

// Commands are the xds-server/* script commands.
func (s *Server) Commands() map[string]script.Cmd {
	return map[string]script.Cmd{
		"xds-server/set": script.Command(
			script.CmdUsage{Summary: "Serve the resources of a file (multi-document YAML) instead of the current ones", Args: "file"},
			func(st *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				res, err := controlplane.LoadFile(st.Path(args[0]))
				if err != nil {
					return nil, err
				}
				return nil, s.Set(res)
			}),
		"xds-server/stop": script.Command(
			script.CmdUsage{Summary: "Stop the server: every stream breaks, nobody answers"},
			func(*script.State, ...string) (script.WaitFunc, error) { s.stop(); return nil, nil }),
		"xds-server/start": script.Command(
			script.CmdUsage{Summary: "Start the server again on the same address, serving the last set resources"},
			func(*script.State, ...string) (script.WaitFunc, error) { s.start(s.addr); return nil, nil }),
		"xds-server/nack": script.Command(
			script.CmdUsage{Summary: "Wait until a client NACKed with an error_detail matching the pattern", Args: "pattern"},
			func(st *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				re, err := regexp.Compile(args[0])
				if err != nil {
					return nil, err
				}
				for {
					s.mu.Lock()
					nacks := s.nacks
					s.mu.Unlock()
					for _, n := range nacks {
						if re.MatchString(n) {
							st.Logf("NACK: %s\n", n)
							return nil, nil
						}
					}
					select {
					case <-st.Context().Done():
						return nil, fmt.Errorf("no NACK matched %q; NACKs: %q", args[0], nacks)
					case <-time.After(50 * time.Millisecond):
					}
				}
			}),
		"xds-server/clear-nacks": script.Command(
			script.CmdUsage{Summary: "Forget the NACKs seen so far"},
			func(*script.State, ...string) (script.WaitFunc, error) {
				s.mu.Lock()
				s.nacks = nil
				s.mu.Unlock()
				return nil, nil
			}),
	}
}

// nackRecorder keeps the error_detail of every NACK the server logs.
type nackRecorder struct {
	s    *Server
	next slog.Handler
}

func (r *nackRecorder) Enabled(ctx context.Context, l slog.Level) bool { return true }

func (r *nackRecorder) Handle(ctx context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, "NACK") {
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "error" {
				r.s.mu.Lock()
				r.s.nacks = append(r.s.nacks, a.Value.String())
				r.s.mu.Unlock()
			}
			return true
		})
	}
	return r.next.Handle(ctx, rec)
}

func (r *nackRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &nackRecorder{s: r.s, next: r.next.WithAttrs(as)}
}

func (r *nackRecorder) WithGroup(g string) slog.Handler {
	return &nackRecorder{s: r.s, next: r.next.WithGroup(g)}
}
