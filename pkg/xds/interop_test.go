// SPDX-License-Identifier: Apache-2.0

package xds_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/l4xds/l4xds/pkg/l4lb"
	"github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
)

// interopServer is one of go-control-plane's own caches behind its own ADS
// server, as a real management server builds it.
type interopServer struct {
	name string
	new  func() interopCache
}

// interopCache serves exactly the clusters and CLAs given to set.
type interopCache interface {
	cache() cache.Cache
	set(t *testing.T, clusters []*clusterv3.Cluster, clas []*endpointv3.ClusterLoadAssignment)
}

var interopServers = []interopServer{
	{"SnapshotCache-ADS", func() interopCache { return newSnapshotServer(true) }},
	{"SnapshotCache-non-ADS", func() interopCache { return newSnapshotServer(false) }},
	// A LinearCache serves one type: the thinnest MuxCache routes each type
	// to its own.
	{"LinearCache", func() interopCache { return newLinearServer() }},
	// A MuxCache of different caches: clusters from a SnapshotCache in ADS
	// mode, endpoints from a LinearCache.
	{"MuxCache", func() interopCache { return newMuxServer() }},
}

// TestInterop runs the real client and the l4lb translation against
// go-control-plane's caches, in SotW and Delta: the CFP example applies, a
// weight change follows, a restarted server (a new cache, its versions
// counting from the start again) replaces the state, a removed cluster goes.
func TestInterop(t *testing.T) {
	cfp := loadCFP(t, "../../examples/cfp.yaml")
	for _, s := range interopServers {
		t.Run(s.name, func(t *testing.T) {
			for _, protocol := range []string{xds.ProtocolSotW, xds.ProtocolDelta} {
				t.Run(protocol, func(t *testing.T) { runInterop(t, s, protocol, cfp) })
			}
		})
	}
}

func runInterop(t *testing.T, s interopServer, protocol string, cfp resources) {
	srv := s.new()
	addr, stop := serve(t, "127.0.0.1:0", srv)
	lb := startAgent(t, addr, protocol)

	srv.set(t, cfp.clusters, cfp.clas)
	lb.wait(t, "the CFP example", `
frontend 10.1.2.3:3306/TCP my-database-service -> [192.168.1.10:3306 192.168.1.11:3306]
backend my-database-service 192.168.1.10:3306 weight=1
backend my-database-service 192.168.1.11:3306 weight=1
`)
	lb.acked(t, "my-database-service")

	heavier := proto.Clone(cfp.clas[0]).(*endpointv3.ClusterLoadAssignment)
	heavier.GetEndpoints()[0].GetLbEndpoints()[0].LoadBalancingWeight = wrapperspb.UInt32(3)
	srv.set(t, cfp.clusters, []*endpointv3.ClusterLoadAssignment{heavier})
	lb.wait(t, "the weight change", `
frontend 10.1.2.3:3306/TCP my-database-service -> [192.168.1.10:3306 192.168.1.11:3306]
backend my-database-service 192.168.1.10:3306 weight=3
backend my-database-service 192.168.1.11:3306 weight=1
`)
	lb.acked(t, "my-database-service")

	// A new server on the same address, with the CFP example as it was.
	stop()
	srv = s.new()
	srv.set(t, cfp.clusters, cfp.clas)
	_, stop = serve(t, addr, srv)
	lb.wait(t, "the restarted server's state", `
frontend 10.1.2.3:3306/TCP my-database-service -> [192.168.1.10:3306 192.168.1.11:3306]
backend my-database-service 192.168.1.10:3306 weight=1
backend my-database-service 192.168.1.11:3306 weight=1
`)
	lb.acked(t, "my-database-service")

	srv.set(t, nil, nil)
	lb.wait(t, "the cluster removed", "")
	waitFor(t, "no cluster in xds-resources", func() bool {
		r, _, _ := lb.client.Resources().Get(lb.db.ReadTxn(), xds.ResourceByName(xds.ClusterType, "my-database-service"))
		return r == nil
	})
}

// agent is the client and the l4lb controller, wired as the agent's cells
// wire them, without a datapath.
type agent struct {
	db     *statedb.DB
	client *xds.Client
	writer *loadbalancer.Writer
}

func startAgent(t *testing.T, addr, protocol string) *agent {
	db := statedb.New()
	w, err := loadbalancer.NewWriter(db)
	if err != nil {
		t.Fatal(err)
	}
	cfg := xds.DefaultConfig
	cfg.EnableXDSControlPlane = true
	cfg.XDSServerAddress = addr
	cfg.XDSInsecure = true
	cfg.XDSNodeID = "node-1"
	cfg.XDSProtocol = protocol
	c, err := xds.NewClient(cfg, hivetest.Logger(t, hivetest.LogLevel(slog.LevelDebug)), db,
		xds.WithBackoff(xds.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2}))
	if err != nil {
		t.Fatal(err)
	}
	ctrl := l4lb.NewController(l4lb.NewTablesSink(w), c)
	c.Watch(xds.ClusterType, true, ctrl.ClusterHandler())
	c.Watch(xds.EndpointType, false, ctrl.EndpointHandler())

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
	return &agent{db: db, client: c, writer: w}
}

// dump prints the frontends and backends, one a line.
func (a *agent) dump() string {
	txn := a.writer.ReadTxn()
	var b strings.Builder
	for fe := range a.writer.Frontends().All(txn) {
		var bes []string
		for _, be := range fe.Backends {
			bes = append(bes, be.Address.String())
		}
		fmt.Fprintf(&b, "frontend %s %s -> [%s]\n", fe.Address, fe.ServiceName, strings.Join(bes, " "))
	}
	for be := range a.writer.Backends().All(txn) {
		fmt.Fprintf(&b, "backend %s %s weight=%d\n", be.ServiceName, be.Address, be.Weight)
	}
	return b.String()
}

func (a *agent) wait(t *testing.T, what, want string) {
	t.Helper()
	want = strings.TrimPrefix(want, "\n")
	var got string
	deadline := time.Now().Add(20 * time.Second)
	for got = a.dump(); got != want; got = a.dump() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; tables:\n%s\nwant:\n%s", what, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// acked checks that the cluster and its CLA are ACKed, the type status has
// no error, and nothing was NACKed.
// acked waits until the cluster and the endpoints of name are acked: the
// client writes their rows once the handler, which wrote the tables
// lb.wait saw, has returned.
func (a *agent) acked(t *testing.T, name string) {
	t.Helper()
	for _, typ := range []string{xds.ClusterType, xds.EndpointType} {
		waitFor(t, xds.ShortTypeName(typ)+" "+name+" acked", func() bool {
			r, _, _ := a.client.Resources().Get(a.db.ReadTxn(), xds.ResourceByName(typ, name))
			return r != nil && r.State == xds.StateAcked && r.Error == ""
		})
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serve runs go-control-plane's ADS server over the cache, plaintext, on
// addr ("127.0.0.1:0" for any port). It returns the address and how to
// stop the server.
func serve(t *testing.T, addr string, c interopCache) (string, func()) {
	var lis net.Listener
	var err error
	// The port of a stopped server may take a moment to be free again.
	for range 100 {
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g,
		server.NewServer(context.Background(), c.cache(), server.CallbackFuncs{}))
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String(), g.Stop
}

type snapshotServer struct {
	c       cache.SnapshotCache
	version int
}

func newSnapshotServer(ads bool) *snapshotServer {
	return &snapshotServer{c: cache.NewSnapshotCache(ads, cache.IDHash{}, nil)}
}

func (s *snapshotServer) cache() cache.Cache { return s.c }

func (s *snapshotServer) set(t *testing.T, clusters []*clusterv3.Cluster, clas []*endpointv3.ClusterLoadAssignment) {
	t.Helper()
	s.version++
	snap, err := cache.NewSnapshot(fmt.Sprint(s.version), map[resource.Type][]types.Resource{
		resource.ClusterType:  asResources(clusters),
		resource.EndpointType: asResources(clas),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.c.SetSnapshot(context.Background(), "node-1", snap); err != nil {
		t.Fatal(err)
	}
}

type linearServer struct {
	clusters, endpoints *cache.LinearCache
}

func newLinearServer() *linearServer {
	return &linearServer{
		clusters:  cache.NewLinearCache(resource.ClusterType),
		endpoints: cache.NewLinearCache(resource.EndpointType),
	}
}

func (s *linearServer) cache() cache.Cache {
	return byType(map[string]cache.Cache{resource.ClusterType: s.clusters, resource.EndpointType: s.endpoints})
}

func (s *linearServer) set(t *testing.T, clusters []*clusterv3.Cluster, clas []*endpointv3.ClusterLoadAssignment) {
	s.clusters.SetResources(byName(clusters))
	s.endpoints.SetResources(byName(clas))
}

// muxServer serves clusters from a SnapshotCache in ADS mode (a snapshot of
// clusters only) and endpoints from a LinearCache, behind one MuxCache.
type muxServer struct {
	clusters  *snapshotServer
	endpoints *cache.LinearCache
}

func newMuxServer() *muxServer {
	return &muxServer{clusters: newSnapshotServer(true), endpoints: cache.NewLinearCache(resource.EndpointType)}
}

func (s *muxServer) cache() cache.Cache {
	return byType(map[string]cache.Cache{resource.ClusterType: s.clusters.c, resource.EndpointType: s.endpoints})
}

func (s *muxServer) set(t *testing.T, clusters []*clusterv3.Cluster, clas []*endpointv3.ClusterLoadAssignment) {
	s.clusters.set(t, clusters, nil)
	s.endpoints.SetResources(byName(clas))
}

func byType(caches map[string]cache.Cache) *cache.MuxCache {
	return &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return r.GetTypeUrl() },
		Caches:        caches,
	}
}

func asResources[T types.Resource](ms []T) []types.Resource {
	out := make([]types.Resource, 0, len(ms))
	for _, m := range ms {
		out = append(out, m)
	}
	return out
}

func byName[T types.Resource](ms []T) map[string]types.Resource {
	out := map[string]types.Resource{}
	for _, m := range ms {
		out[cache.GetResourceName(m)] = m
	}
	return out
}

// resources are the clusters and CLAs of a resources file.
type resources struct {
	clusters []*clusterv3.Cluster
	clas     []*endpointv3.ClusterLoadAssignment
}

// loadCFP reads a multi-document YAML file of {resource: {'@type': ...}}
// entries, the format of the CFP example.
func loadCFP(t *testing.T, path string) resources {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out resources
	dec := yaml.NewDecoder(f)
	for {
		var doc struct {
			Resource any `yaml:"resource"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if doc.Resource == nil {
			continue
		}
		b, err := json.Marshal(doc.Resource)
		if err != nil {
			t.Fatal(err)
		}
		a := &anypb.Any{}
		if err := protojson.Unmarshal(b, a); err != nil {
			t.Fatal(err)
		}
		m, err := a.UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *clusterv3.Cluster:
			out.clusters = append(out.clusters, m)
		case *endpointv3.ClusterLoadAssignment:
			out.clas = append(out.clas, m)
		default:
			t.Fatalf("%s: unexpected %T", path, m)
		}
	}
	if len(out.clusters) != 1 || len(out.clas) != 1 {
		t.Fatalf("%s: %d clusters and %d CLAs, want the CFP example's one each", path, len(out.clusters), len(out.clas))
	}
	return out
}
