// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/l4xds/l4xds/pkg/devcerts"
)

// testServer is a go-control-plane ADS server with one linear cache per
// type, serving mTLS with the certificates of a devcerts directory, that
// records every request it receives.
type testServer struct {
	t         testing.TB
	addr      string
	clusters  *cache.LinearCache
	endpoints *cache.LinearCache
	grpc      *grpc.Server

	mu        sync.Mutex
	requests  []seenRequest
	responses []seenResponse
	// closeOnAck makes the server end the stream at every ACK or NACK.
	closeOnAck bool
}

// seenResponse is a response as the server sent it.
type seenResponse struct {
	TypeURL string
	Names   []string // the resources it carries
	Removed []string // Delta
}

// seenRequest is a SotW or Delta request as the server received it.
type seenRequest struct {
	TypeURL     string
	Node        *corev3.Node
	Version     string
	Nonce       string
	Names       []string
	Subscribe   []string
	Unsubscribe []string
	Error       string
}

// startServer serves on addr ("127.0.0.1:0" for any port) with the
// certificates in certDir; with certDir empty it serves plaintext. setup,
// if not nil, fills the caches before the first client can connect.
func startServer(t testing.TB, addr, certDir string, setup func(*testServer)) *testServer {
	t.Helper()
	s := &testServer{
		t:         t,
		clusters:  cache.NewLinearCache(ClusterType),
		endpoints: cache.NewLinearCache(EndpointType),
	}
	mux := &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return r.GetTypeUrl() },
		Caches:        map[string]cache.Cache{ClusterType: s.clusters, EndpointType: s.endpoints},
	}
	callbacks := server.CallbackFuncs{
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
			return s.record(seenRequest{
				TypeURL: r.GetTypeUrl(), Node: r.GetNode(), Version: r.GetVersionInfo(),
				Nonce: r.GetResponseNonce(), Names: r.GetResourceNames(), Error: r.GetErrorDetail().GetMessage(),
			})
		},
		StreamResponseFunc: func(_ context.Context, _ int64, _ *discoveryv3.DiscoveryRequest, r *discoveryv3.DiscoveryResponse) {
			seen := seenResponse{TypeURL: r.GetTypeUrl()}
			for _, a := range r.GetResources() {
				if m, err := a.UnmarshalNew(); err == nil {
					seen.Names = append(seen.Names, resourceName(m))
				}
			}
			s.recordResponse(seen)
		},
		StreamDeltaResponseFunc: func(_ int64, _ *discoveryv3.DeltaDiscoveryRequest, r *discoveryv3.DeltaDiscoveryResponse) {
			seen := seenResponse{TypeURL: r.GetTypeUrl(), Removed: r.GetRemovedResources()}
			for _, res := range r.GetResources() {
				seen.Names = append(seen.Names, res.GetName())
			}
			s.recordResponse(seen)
		},
		StreamDeltaRequestFunc: func(_ int64, r *discoveryv3.DeltaDiscoveryRequest) error {
			return s.record(seenRequest{
				TypeURL: r.GetTypeUrl(), Node: r.GetNode(), Nonce: r.GetResponseNonce(),
				Subscribe: r.GetResourceNamesSubscribe(), Unsubscribe: r.GetResourceNamesUnsubscribe(),
				Error: r.GetErrorDetail().GetMessage(),
			})
		},
	}
	var opts []grpc.ServerOption
	if certDir != "" {
		opts = append(opts, grpc.Creds(credentials.NewTLS(serverTLS(t, certDir))))
	}
	s.grpc = grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(s.grpc, server.NewServer(context.Background(), mux, callbacks))

	if setup != nil {
		setup(s)
	}
	lis := listen(t, addr)
	s.addr = lis.Addr().String()
	go s.grpc.Serve(lis)
	t.Cleanup(s.stop)
	return s
}

// listen retries for a while: the port of a stopped server may take a
// moment to be free again.
func listen(t testing.TB, addr string) net.Listener {
	var err error
	for range 100 {
		var lis net.Listener
		if lis, err = net.Listen("tcp", addr); err == nil {
			return lis
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("listen %s: %s", addr, err)
	return nil
}

func (s *testServer) stop() { s.grpc.Stop() }

func serverTLS(t testing.TB, dir string) *tls.Config {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, devcerts.ServerCert), filepath.Join(dir, devcerts.ServerKey))
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(filepath.Join(dir, devcerts.CACert))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
}

func (s *testServer) record(r seenRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, r)
	if s.closeOnAck && r.Nonce != "" {
		return errors.New("closing the stream as told")
	}
	return nil
}

func (s *testServer) recordResponse(r seenResponse) {
	s.mu.Lock()
	s.responses = append(s.responses, r)
	s.mu.Unlock()
}

// sent returns the responses of a type sent so far.
func (s *testServer) sent(typeURL string) []seenResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []seenResponse
	for _, r := range s.responses {
		if r.TypeURL == typeURL {
			out = append(out, r)
		}
	}
	return out
}

// seen returns the requests of a type received so far.
func (s *testServer) seen(typeURL string) []seenRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []seenRequest
	for _, r := range s.requests {
		if r.TypeURL == typeURL {
			out = append(out, r)
		}
	}
	return out
}

// waitRequest waits for a request of the type that satisfies match.
func (s *testServer) waitRequest(typeURL, what string, match func(seenRequest) bool) seenRequest {
	s.t.Helper()
	var found seenRequest
	waitFor(s.t, what, func() bool {
		for _, r := range s.seen(typeURL) {
			if match(r) {
				found = r
				return true
			}
		}
		return false
	})
	return found
}

func (s *testServer) setClusters(cs ...*clusterv3.Cluster) {
	m := map[string]types.Resource{}
	for _, c := range cs {
		m[c.GetName()] = c
	}
	s.clusters.SetResources(m)
}

func (s *testServer) setEndpoints(es ...*endpointv3.ClusterLoadAssignment) {
	m := map[string]types.Resource{}
	for _, e := range es {
		m[e.GetClusterName()] = e
	}
	s.endpoints.SetResources(m)
}

// cluster is a Cluster with only what tests need: a name, and a tag whose
// change makes a new version ("bad" makes the test handler reject it).
func cluster(name, tag string) *clusterv3.Cluster {
	return &clusterv3.Cluster{Name: name, AltStatName: tag}
}

func endpoints(name string, priority uint32) *endpointv3.ClusterLoadAssignment {
	return &endpointv3.ClusterLoadAssignment{
		ClusterName: name,
		Endpoints:   []*endpointv3.LocalityLbEndpoints{{Priority: priority}},
	}
}

// recorder is a Handler that records updates and holds what it accepted,
// as a consumer does. It rejects clusters tagged "bad" the way the load
// balancer rejects an invalid port, endpoints of priority 9, and a cluster
// whose VIP (in conflicts) is held by another cluster it holds.
type recorder struct {
	mu      sync.Mutex
	updates []Update
	held    map[string]string // name to tag or "p<priority>"
	// onUpdate runs inside the handler (to call SetNames from it).
	onUpdate func(Update)
	// conflicts maps a cluster to the one whose VIP it wants.
	conflicts map[string]string
}

const (
	badPortError      = "io.cilium.l4lb.port: 70000 is out of range 1..65535"
	badPriorityError  = "priority 9 is not supported"
	vipConflictPrefix = "VIP held by cluster "
)

func (r *recorder) HandleUpdate(_ context.Context, u Update) map[string]error {
	r.mu.Lock()
	r.updates = append(r.updates, u)
	f := r.onUpdate
	if r.held == nil {
		r.held = map[string]string{}
	}
	for _, n := range u.Removed {
		delete(r.held, n)
	}
	rejected := map[string]error{}
	for _, res := range u.Upserted {
		switch m := res.Message.(type) {
		case *clusterv3.Cluster:
			if m.GetAltStatName() == "bad" {
				rejected[res.Name] = errString(badPortError)
				continue
			}
			if other, ok := r.conflicts[res.Name]; ok {
				if _, held := r.held[other]; held {
					rejected[res.Name] = errString(vipConflictPrefix + other)
					continue
				}
			}
			r.held[res.Name] = m.GetAltStatName()
		case *endpointv3.ClusterLoadAssignment:
			p := m.GetEndpoints()[0].GetPriority()
			if p == 9 {
				rejected[res.Name] = errString(badPriorityError)
				continue
			}
			r.held[res.Name] = "p" + string(rune('0'+p))
		}
	}
	r.mu.Unlock()
	if f != nil {
		f(u)
	}
	return rejected
}

type errString string

func (e errString) Error() string { return string(e) }

func (r *recorder) all() []Update {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.updates)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.updates)
}

// state is what the consumer holds: name to tag (clusters) or priority
// (endpoints), as a string.
func (r *recorder) state() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.held)
}

// removedNames lists every name ever delivered as Removed.
func (r *recorder) removedNames() []string {
	var out []string
	for _, u := range r.all() {
		out = append(out, u.Removed...)
	}
	return out
}

// waitFor polls cond with a generous deadline: machines are noisy.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testClient is a running client and its handlers.
type testClient struct {
	*Client
	db       *statedb.DB
	clusters *recorder
	eps      *recorder
}

var testBackoff = Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2}

func testConfig(addr, certDir, protocol string) Config {
	cfg := DefaultConfig
	cfg.EnableXDSControlPlane = true
	cfg.XDSServerAddress = addr
	cfg.XDSNodeID = "node-1"
	cfg.XDSNodeZone = "zone-a"
	cfg.XDSProtocol = protocol
	if certDir == "" {
		cfg.XDSInsecure = true
	} else {
		cfg.XDSClientCertPath = filepath.Join(certDir, devcerts.ClientCert)
		cfg.XDSClientKeyPath = filepath.Join(certDir, devcerts.ClientKey)
		cfg.XDSCACertPath = filepath.Join(certDir, devcerts.CACert)
	}
	return cfg
}

// startClient runs a client watching clusters (wildcard) and endpoints
// (by name) until the test ends. Each setup runs before the client does.
func startClient(t *testing.T, cfg Config, setup ...func(*testClient)) *testClient {
	t.Helper()
	db := statedb.New()
	c, err := NewClient(cfg, hivetest.Logger(t, hivetest.LogLevel(slog.LevelDebug)), db, WithBackoff(testBackoff))
	if err != nil {
		t.Fatal(err)
	}
	tc := &testClient{Client: c, db: db, clusters: &recorder{}, eps: &recorder{}}
	c.Watch(ClusterType, true, tc.clusters)
	c.Watch(EndpointType, false, tc.eps)
	for _, f := range setup {
		f(tc)
	}

	runClient(t, c)
	return tc
}

// runClient runs c until the test ends.
func runClient(t *testing.T, c *Client) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(ctx); err != nil {
			t.Errorf("Run: %s", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func (tc *testClient) resource(typeURL, name string) *ResourceStatus {
	r, _, _ := tc.resources.Get(tc.db.ReadTxn(), ResourceByName(typeURL, name))
	return r
}

func (tc *testClient) typeStatus(typeURL string) *TypeStatus {
	s, _, _ := tc.status.Get(tc.db.ReadTxn(), TypeStatusIndex.Query(typeURL))
	return s
}

// waitState waits until a resource's row is in the given state.
func (tc *testClient) waitState(t *testing.T, typeURL, name string, state ResourceState) *ResourceStatus {
	t.Helper()
	var r *ResourceStatus
	waitFor(t, name+" "+string(state), func() bool {
		r = tc.resource(typeURL, name)
		return r != nil && r.State == state
	})
	return r
}

// newCerts writes a fresh CA and certificates to a new directory.
func newCerts(t *testing.T) string {
	dir := t.TempDir()
	if err := devcerts.Write(dir, devcerts.Options{}); err != nil {
		t.Fatal(err)
	}
	return dir
}
