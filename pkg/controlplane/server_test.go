// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"bytes"
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
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/l4xds/l4xds/pkg/devcerts"
)

// testTimeout bounds every wait; it is generous because CI machines are slow.
const testTimeout = 30 * time.Second

type testEnv struct {
	srv     *Server
	addr    string
	certDir string
	logs    *syncBuffer
}

// startServer serves over real gRPC with mTLS on 127.0.0.1.
func startServer(t *testing.T) *testEnv {
	t.Helper()
	return startServerWith(t, Options{})
}

// startServerWith is startServer with opts (their TLS and Logger are the
// test's).
func startServerWith(t *testing.T, opts Options) *testEnv {
	t.Helper()
	dir := t.TempDir()
	if err := devcerts.Write(dir, devcerts.Options{}); err != nil {
		t.Fatal(err)
	}
	tlsConf, err := ServerTLSConfig(filepath.Join(dir, devcerts.ServerCert), filepath.Join(dir, devcerts.ServerKey), filepath.Join(dir, devcerts.CACert))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	opts.TLS, opts.Logger = tlsConf, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := NewServer(opts)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &testEnv{srv: srv, addr: lis.Addr().String(), certDir: dir, logs: logs}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (e *testEnv) clientTLS(t *testing.T, withCert bool) *tls.Config {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(e.certDir, devcerts.CACert))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	conf := &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	if withCert {
		cert, err := tls.LoadX509KeyPair(filepath.Join(e.certDir, devcerts.ClientCert), filepath.Join(e.certDir, devcerts.ClientKey))
		if err != nil {
			t.Fatal(err)
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf
}

func (e *testEnv) dial(t *testing.T, creds credentials.TransportCredentials) discovery.AggregatedDiscoveryServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return discovery.NewAggregatedDiscoveryServiceClient(conn)
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

var testNode = &corev3.Node{Id: "node-1", Cluster: "test"}

func cfpResources(t *testing.T) Resources {
	t.Helper()
	res, err := LoadFile("testdata/cfp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// withEndpoint returns a copy of the CFP resources whose CLA has one more
// endpoint.
func withEndpoint(t *testing.T, res Resources, addr string) Resources {
	t.Helper()
	out := cloneResources(res)
	cla := out[resource.EndpointType]["my-database-service"].(*endpointv3.ClusterLoadAssignment)
	cla.Endpoints[0].LbEndpoints = append(cla.Endpoints[0].LbEndpoints, &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 3306},
			}}},
		}},
	})
	return out
}

// withVIP returns a copy whose cluster has another VIP in its metadata.
func withVIP(t *testing.T, res Resources, vip string) Resources {
	t.Helper()
	out := cloneResources(res)
	c := out[resource.ClusterType]["my-database-service"].(*clusterv3.Cluster)
	c.Metadata.FilterMetadata["io.cilium.l4lb"].Fields["vip"] = structpb.NewStringValue(vip)
	return out
}

func cloneResources(res Resources) Resources {
	out := Resources{}
	for typeURL, byName := range res {
		out[typeURL] = map[string]proto.Message{}
		for name, msg := range byName {
			out[typeURL][name] = proto.Clone(msg)
		}
	}
	return out
}

func decodeAll(t *testing.T, anys []*anypb.Any) map[string]proto.Message {
	t.Helper()
	out := map[string]proto.Message{}
	for _, a := range anys {
		msg, err := a.UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		out[resourceName(msg)] = msg
	}
	return out
}

func resourceName(msg proto.Message) string {
	switch m := msg.(type) {
	case *clusterv3.Cluster:
		return m.GetName()
	case *endpointv3.ClusterLoadAssignment:
		return m.GetClusterName()
	}
	return ""
}

func vipOf(msg proto.Message) string {
	return msg.(*clusterv3.Cluster).GetMetadata().GetFilterMetadata()["io.cilium.l4lb"].GetFields()["vip"].GetStringValue()
}

func endpointCount(msg proto.Message) int {
	n := 0
	for _, le := range msg.(*endpointv3.ClusterLoadAssignment).GetEndpoints() {
		n += len(le.GetLbEndpoints())
	}
	return n
}

// sotwClient is a minimal ADS SotW client: it subscribes, receives and ACKs.
type sotwClient struct {
	t      *testing.T
	stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	// names subscribed per type URL; nil is the wildcard.
	names map[string][]string
}

func (e *testEnv) sotw(t *testing.T, names map[string][]string) *sotwClient {
	t.Helper()
	stream, err := e.dial(t, credentials.NewTLS(e.clientTLS(t, true))).StreamAggregatedResources(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	c := &sotwClient{t: t, stream: stream, names: names}
	for _, typeURL := range slices.Sorted(maps.Keys(names)) {
		c.send(&discovery.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names[typeURL]})
	}
	return c
}

func (c *sotwClient) send(req *discovery.DiscoveryRequest) {
	c.t.Helper()
	req.Node = testNode
	if err := c.stream.Send(req); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// recv receives one response and ACKs it.
func (c *sotwClient) recv() (*discovery.DiscoveryResponse, map[string]proto.Message) {
	c.t.Helper()
	resp, err := c.stream.Recv()
	if err != nil {
		c.t.Fatalf("recv: %v", err)
	}
	c.send(&discovery.DiscoveryRequest{
		TypeUrl: resp.GetTypeUrl(), ResourceNames: c.names[resp.GetTypeUrl()],
		VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(),
	})
	return resp, decodeAll(c.t, resp.GetResources())
}

// recvTypes receives (and ACKs) until it has a response of n types, and
// returns the last response's resources of each.
func (c *sotwClient) recvTypes(n int) Resources {
	c.t.Helper()
	got := Resources{}
	for len(got) < n {
		resp, msgs := c.recv()
		got[resp.GetTypeUrl()] = msgs
	}
	return got
}

func checkServed(t *testing.T, got, want Resources) {
	t.Helper()
	for typeURL, byName := range want {
		if len(got[typeURL]) != len(byName) {
			t.Fatalf("%s: got %d resources, want %d", typeURL, len(got[typeURL]), len(byName))
		}
		for name, msg := range byName {
			if !proto.Equal(got[typeURL][name], msg) {
				t.Fatalf("%s %q served as %v, want %v", typeURL, name, got[typeURL][name], msg)
			}
		}
	}
}

func TestServerSotW(t *testing.T) {
	env := startServer(t)
	cfp := cfpResources(t)
	if err := env.srv.Set(cfp); err != nil {
		t.Fatal(err)
	}

	c := env.sotw(t, map[string][]string{resource.ClusterType: nil, resource.EndpointType: {"my-database-service"}})
	checkServed(t, c.recvTypes(2), cfp)

	// Only the CLA changes: an EDS response comes, and no CDS one, since
	// the unchanged cluster keeps its version.
	step2 := withEndpoint(t, cfp, "192.168.1.12")
	if err := env.srv.Set(step2); err != nil {
		t.Fatal(err)
	}
	resp, msgs := c.recv()
	if resp.GetTypeUrl() != resource.EndpointType {
		t.Fatalf("got a %s response, want only the changed CLA: %v", resp.GetTypeUrl(), msgs)
	}
	if n := endpointCount(msgs["my-database-service"]); n != 3 {
		t.Fatalf("CLA has %d endpoints, want 3", n)
	}

	// Now the cluster changes. Had step 2 sent the cluster again, that
	// response (old VIP) would come before this one.
	if err := env.srv.Set(withVIP(t, step2, "10.1.2.4")); err != nil {
		t.Fatal(err)
	}
	resp, msgs = c.recv()
	if resp.GetTypeUrl() != resource.ClusterType || vipOf(msgs["my-database-service"]) != "10.1.2.4" {
		t.Fatalf("got %s %v, want the cluster with VIP 10.1.2.4", resp.GetTypeUrl(), msgs)
	}
}

// deltaClient is a minimal ADS Delta client.
type deltaClient struct {
	t      *testing.T
	stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
}

func (e *testEnv) delta(t *testing.T, names map[string][]string) *deltaClient {
	t.Helper()
	stream, err := e.dial(t, credentials.NewTLS(e.clientTLS(t, true))).DeltaAggregatedResources(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	c := &deltaClient{t: t, stream: stream}
	for _, typeURL := range slices.Sorted(maps.Keys(names)) {
		if err := stream.Send(&discovery.DeltaDiscoveryRequest{Node: testNode, TypeUrl: typeURL, ResourceNamesSubscribe: names[typeURL]}); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func (c *deltaClient) recv() *discovery.DeltaDiscoveryResponse {
	c.t.Helper()
	resp, err := c.stream.Recv()
	if err != nil {
		c.t.Fatalf("recv: %v", err)
	}
	if err := c.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
		c.t.Fatalf("ack: %v", err)
	}
	return resp
}

// versions maps the resources of a delta response to their versions.
func versions(resp *discovery.DeltaDiscoveryResponse) map[string]string {
	out := map[string]string{}
	for _, r := range resp.GetResources() {
		out[r.GetName()] = r.GetVersion()
	}
	return out
}

func TestServerDelta(t *testing.T) {
	env := startServer(t)
	cfp := cfpResources(t)
	if err := env.srv.Set(cfp); err != nil {
		t.Fatal(err)
	}
	c := env.delta(t, map[string][]string{resource.ClusterType: {"*"}, resource.EndpointType: {"my-database-service"}})

	first := map[string]*discovery.DeltaDiscoveryResponse{}
	for len(first) < 2 {
		resp := c.recv()
		first[resp.GetTypeUrl()] = resp
	}
	got := Resources{}
	for typeURL, resp := range first {
		got[typeURL] = map[string]proto.Message{}
		for _, r := range resp.GetResources() {
			msg, err := r.GetResource().UnmarshalNew()
			if err != nil {
				t.Fatal(err)
			}
			got[typeURL][r.GetName()] = msg
		}
	}
	checkServed(t, got, cfp)
	claVersion := versions(first[resource.EndpointType])["my-database-service"]

	// A new cluster and a changed CLA: the CDS delta carries only the new
	// cluster, the EDS delta the CLA with a new version.
	step2 := withEndpoint(t, cfp, "192.168.1.12")
	if err := step2.Add(&clusterv3.Cluster{Name: "web"}); err != nil {
		t.Fatal(err)
	}
	if err := env.srv.Set(step2); err != nil {
		t.Fatal(err)
	}
	second := map[string]*discovery.DeltaDiscoveryResponse{}
	for len(second) < 2 {
		resp := c.recv()
		if second[resp.GetTypeUrl()] != nil {
			t.Fatalf("second %s response: %v", resp.GetTypeUrl(), resp)
		}
		second[resp.GetTypeUrl()] = resp
	}
	if v := versions(second[resource.ClusterType]); len(v) != 1 || v["web"] == "" {
		t.Fatalf("CDS delta carries %v, want only the new cluster web", v)
	}
	if v := versions(second[resource.EndpointType])["my-database-service"]; v == "" || v == claVersion {
		t.Fatalf("CLA version %q after change, was %q", v, claVersion)
	}

	// Removing web is a removal, nothing else.
	delete(step2[resource.ClusterType], "web")
	if err := env.srv.Set(step2); err != nil {
		t.Fatal(err)
	}
	resp := c.recv()
	if resp.GetTypeUrl() != resource.ClusterType || len(resp.GetResources()) != 0 || !slices.Equal(resp.GetRemovedResources(), []string{"web"}) {
		t.Fatalf("got %v, want the removal of cluster web", resp)
	}
}

func TestServerRefusesClientsWithoutCertificate(t *testing.T) {
	env := startServer(t)
	if err := env.srv.Set(cfpResources(t)); err != nil {
		t.Fatal(err)
	}
	for name, creds := range map[string]credentials.TransportCredentials{
		"tls without client certificate": credentials.NewTLS(env.clientTLS(t, false)),
		"plaintext":                      insecure.NewCredentials(),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			stream, err := env.dial(t, creds).StreamAggregatedResources(ctx)
			if err == nil {
				err = stream.Send(&discovery.DiscoveryRequest{Node: testNode, TypeUrl: resource.ClusterType})
			}
			if err == nil {
				var resp *discovery.DiscoveryResponse
				resp, err = stream.Recv()
				if err == nil {
					t.Fatalf("served %v", resp)
				}
			}
			if ctx.Err() != nil {
				t.Fatalf("no refusal before the timeout: %v", err)
			}
		})
	}
}

func TestServerLogsNACK(t *testing.T) {
	env := startServer(t)
	if err := env.srv.Set(cfpResources(t)); err != nil {
		t.Fatal(err)
	}
	c := env.sotw(t, map[string][]string{resource.ClusterType: nil})
	resp, err := c.stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	c.send(&discovery.DiscoveryRequest{
		TypeUrl: resource.ClusterType, ResponseNonce: resp.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: `cluster "my-database-service": io.cilium.l4lb.port: 70000 is out of range 1..65535`},
	})
	want := []string{"level=WARN", "NACK", "node=node-1", "io.cilium.l4lb.port: 70000 is out of range"}
	deadline := time.Now().Add(testTimeout)
	for {
		logs := env.logs.String()
		for _, line := range strings.Split(logs, "\n") {
			if containsAll(line, want) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q in:\n%s", want, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// Clients may ask for a type the file does not have yet; they are answered
// when it appears instead of losing their stream.
func TestServerServesTypesAddedLater(t *testing.T) {
	env := startServer(t)
	const listenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
	c := env.sotw(t, map[string][]string{listenerType: nil})
	res, err := ParseResources([]byte("'@type': type.googleapis.com/envoy.config.listener.v3.Listener\nname: l1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := env.srv.Set(res); err != nil {
		t.Fatal(err)
	}
	for {
		resp, msgs := c.recv()
		if resp.GetTypeUrl() != listenerType {
			t.Fatalf("got %s", resp.GetTypeUrl())
		}
		if len(msgs) == 1 {
			return
		}
		if len(msgs) > 1 {
			t.Fatalf("got %v", msgs)
		}
	}
}

// A resource that cannot be marshalled fails Set, but the served set is what
// the caches hold: removing the resource again removes it from the cache, and
// later updates reach clients.
func TestServerSetAfterACacheError(t *testing.T) {
	env := startServer(t)
	cfp := cfpResources(t)
	if err := env.srv.Set(cfp); err != nil {
		t.Fatal(err)
	}
	c := env.delta(t, map[string][]string{resource.ClusterType: {"*"}})
	if resp := c.recv(); len(resp.GetResources()) != 1 {
		t.Fatalf("first response: %v", resp)
	}
	clusters, err := env.srv.caches.get(resource.ClusterType)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ACK to open a new watch", func() bool { return clusters.delta.NumWildcardWatches() == 1 })

	bad := cloneResources(cfp)
	// Invalid UTF-8 in a string field: proto.Marshal refuses it.
	if err := bad.Add(&clusterv3.Cluster{Name: "bad", AltStatName: "\xff"}); err != nil {
		t.Fatal(err)
	}
	if err := env.srv.Set(bad); err == nil || !strings.Contains(err.Error(), resource.ClusterType) {
		t.Fatalf("Set with an unmarshallable cluster: %v", err)
	}

	if err := env.srv.Set(cfp); err != nil {
		t.Fatalf("Set without it: %v", err)
	}
	next := cloneResources(cfp)
	if err := next.Add(&clusterv3.Cluster{Name: "web"}); err != nil {
		t.Fatal(err)
	}
	if err := env.srv.Set(next); err != nil {
		t.Fatalf("Set with a new cluster: %v", err)
	}
	resp := c.recv()
	if v := versions(resp); len(v) != 1 || v["web"] == "" {
		t.Fatalf("got %v, want the new cluster web", resp)
	}
}

// Run serves the file until its context ends, and closes the listener
// whether it served or refused an invalid file.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	writeFile(t, good, readTestdata(t, "cfp.yaml"))
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, "resource: {name: db}\n")

	t.Run("invalid file", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		err = NewServer(Options{}).Run(context.Background(), lis, bad)
		if want := bad + `: document 1 (line 1): resource has no "@type"`; err == nil || err.Error() != want {
			t.Fatalf("Run error:\n got %v\nwant %s", err, want)
		}
		if !listenerClosed(lis) {
			t.Fatal("listener still open")
		}
	})

	t.Run("serves until cancelled", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- NewServer(Options{}).Run(ctx, lis, good) }()

		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(testContext(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&discovery.DiscoveryRequest{Node: testNode, TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil || len(resp.GetResources()) != 1 {
			t.Fatalf("response %v, error %v", resp, err)
		}

		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
		case <-time.After(testTimeout):
			t.Fatal("Run did not return after cancel")
		}
		if !listenerClosed(lis) {
			t.Fatal("listener still open")
		}
	})
}

func listenerClosed(lis net.Listener) bool {
	lis.(*net.TCPListener).SetDeadline(time.Now()) // Accept must not block if it is open
	_, err := lis.Accept()
	return errors.Is(err, net.ErrClosed)
}

// A restarted server serves the same resources under another version, so
// that no client mistakes its state for the one it holds.
func TestServerVersionsDifferAfterRestart(t *testing.T) {
	var versions []string
	for range 2 {
		env := startServer(t)
		if err := env.srv.Set(cfpResources(t)); err != nil {
			t.Fatal(err)
		}
		resp, _ := env.sotw(t, map[string][]string{resource.ClusterType: nil}).recv()
		versions = append(versions, resp.GetVersionInfo())
		env.srv.Stop()
	}
	if versions[0] == "" || versions[0] == versions[1] {
		t.Fatalf("versions of two servers: %q", versions)
	}
}

// waitForLogs waits until the server's log has n lines with msg.
func (e *testEnv) waitForLogs(t *testing.T, msg string, n int) {
	t.Helper()
	ctx := testContext(t)
	for strings.Count(e.logs.String(), msg) < n {
		select {
		case <-ctx.Done():
			t.Fatalf("not %d %q in the log:\n%s", n, msg, e.logs.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A client that subscribes before the server has its first state gets no
// response until it has: an empty first response would make it remove
// everything it holds (the first response of a stream is the full state).
func TestServerAnswersOnlyWithItsFirstState(t *testing.T) {
	env := startServer(t)
	cfp := cfpResources(t)
	sotw := env.sotw(t, map[string][]string{resource.ClusterType: nil})
	delta := env.delta(t, map[string][]string{resource.ClusterType: {"*"}})
	env.waitForLogs(t, "xDS stream waits for the first state", 2)
	if env.srv.Serving() {
		t.Fatal("serving before the first Set")
	}
	if err := env.srv.Set(cfp); err != nil {
		t.Fatal(err)
	}
	if !env.srv.Serving() {
		t.Fatal("not serving after the first Set")
	}
	if resp, msgs := sotw.recv(); len(msgs) != 1 {
		t.Errorf("SotW: first response (version %q) has %d clusters, want the first state's 1", resp.GetVersionInfo(), len(msgs))
	}
	if resp := delta.recv(); len(resp.GetResources()) != 1 {
		t.Errorf("Delta: first response has %d clusters, want the first state's 1", len(resp.GetResources()))
	}
}

// MaxConnectionAge ends a client's connection, its stream with it, so that
// clients spread over the replicas again; without it the stream stays.
func TestServerMaxConnectionAge(t *testing.T) {
	for _, age := range []time.Duration{200 * time.Millisecond, 0} {
		t.Run(age.String(), func(t *testing.T) {
			env := startServerWith(t, Options{MaxConnectionAge: age})
			if err := env.srv.Set(cfpResources(t)); err != nil {
				t.Fatal(err)
			}
			c := env.sotw(t, map[string][]string{resource.ClusterType: nil})
			c.recv()
			ended := make(chan error, 1)
			go func() {
				_, err := c.stream.Recv()
				ended <- err
			}()
			if age == 0 {
				select {
				case err := <-ended:
					t.Fatalf("stream ended without a maximum age: %v", err)
				case <-time.After(2 * time.Second):
				}
				return
			}
			select {
			case <-ended:
			case <-time.After(maxConnectionAgeGrace(age) + 20*time.Second):
				t.Fatal("stream still open well after the connection's maximum age and grace")
			}
		})
	}
}
