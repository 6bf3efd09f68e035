// SPDX-License-Identifier: Apache-2.0

package xds_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/l4xds/l4xds/pkg/l4lb"
	"github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
)

// FuzzClientSotW and FuzzClientDelta feed the client a stream of responses
// that the input spells (see fuzzStream): clusters and endpoints drawn from
// a few names, VIPs and variants (valid, invalid, conflicting, duplicated,
// EDS or inline), bytes that do not decode, Delta removals. After every
// response the xDS client's cache must hold exactly the resources the
// handlers accepted; after the last, the tables must be the translation of
// the resources last accepted, as a fresh controller makes it from them
// alone.
func FuzzClientSotW(f *testing.F)  { fuzzClient(f, xds.ProtocolSotW) }
func FuzzClientDelta(f *testing.F) { fuzzClient(f, xds.ProtocolDelta) }

func fuzzClient(f *testing.F, protocol string) {
	f.Fuzz(func(t *testing.T, input []byte) {
		s := newFuzzStream(t, protocol)
		in := &fuzzInput{b: input}
		step := 0
		for step < 32 && !in.done() {
			step++
			s.step(t, in, step)
			s.checkCache(t, step)
		}
		// The translation is compared once, after the last response:
		// every shorter stream is an input of its own.
		s.checkTables(t, step)
	})
}

// fuzzStream is a client wired to the l4lb controller and the tables, as the
// agent wires them, driven by hand.
type fuzzStream struct {
	delta    bool
	db       *statedb.DB
	w        *loadbalancer.Writer
	client   *xds.Client
	driver   *xds.Driver
	clusters *acceptedBy
	clas     *acceptedBy
	// requested are the endpoint names the controller asks for.
	requested *requested
}

// requested passes the names the controller sets on to the client, and
// keeps them: a ClusterLoadAssignment no longer requested is dropped from
// the client's cache and the controller's, and a new request waits for
// the server to send it again.
type requested struct {
	client *xds.Client
	names  map[string]bool
}

func (r *requested) SetNames(typeURL string, names []string) {
	r.client.SetNames(typeURL, names)
	clear(r.names)
	for _, n := range names {
		r.names[n] = true
	}
}

// newDrivenClient is a client of protocol, for a driver, over new tables.
func newDrivenClient(t *testing.T, protocol string) (*statedb.DB, *loadbalancer.Writer, *xds.Client) {
	t.Helper()
	db := statedb.New()
	w, err := loadbalancer.NewWriter(db)
	if err != nil {
		t.Fatal(err)
	}
	cfg := xds.DefaultConfig
	cfg.EnableXDSControlPlane = true
	cfg.XDSServerAddress = "xds.example.internal:9000"
	cfg.XDSInsecure = true
	cfg.XDSProtocol = protocol
	c, err := xds.NewClient(cfg, slog.New(slog.DiscardHandler), db)
	if err != nil {
		t.Fatal(err)
	}
	return db, w, c
}

// anyOf is m as a resource.
func anyOf(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func newFuzzStream(t *testing.T, protocol string) *fuzzStream {
	db, w, c := newDrivenClient(t, protocol)
	names := &requested{client: c, names: map[string]bool{}}
	ctrl := l4lb.NewController(l4lb.NewTablesSink(w), names)
	s := &fuzzStream{
		delta: protocol == xds.ProtocolDelta, db: db, w: w, client: c, requested: names,
		clusters: &acceptedBy{h: ctrl.ClusterHandler(), msgs: map[string]proto.Message{}},
		clas:     &acceptedBy{h: ctrl.EndpointHandler(), msgs: map[string]proto.Message{}},
	}
	c.Watch(xds.ClusterType, true, s.clusters)
	// EDS in slices of one resource, growing to a few: whatever the
	// slicing, the cache and the tables must be those of the accepted
	// resources.
	xds.SetSliceBytes(t, 32, 256)
	c.Watch(xds.EndpointType, false, xds.InGrowingSlices(s.clas))
	var err error
	if s.driver, err = xds.NewDriver(c); err != nil {
		t.Fatal(err)
	}
	return s
}

// acceptedBy is a handler's view of what it accepted: the last version of
// each resource it did not reject.
type acceptedBy struct {
	h    xds.Handler
	msgs map[string]proto.Message
}

func (a *acceptedBy) HandleUpdate(ctx context.Context, u xds.Update) map[string]error {
	rej := a.h.HandleUpdate(ctx, u)
	for _, n := range u.Removed {
		if rej[n] == nil {
			delete(a.msgs, n)
		}
	}
	for _, r := range u.Upserted {
		if rej[r.Name] == nil {
			a.msgs[r.Name] = r.Message
		}
	}
	return rej
}

// fuzzInput reads the input a byte at a time; past its end, zeros.
type fuzzInput struct{ b []byte }

func (in *fuzzInput) done() bool { return len(in.b) == 0 }

func (in *fuzzInput) next() byte {
	if len(in.b) == 0 {
		return 0
	}
	v := in.b[0]
	in.b = in.b[1:]
	return v
}

func (in *fuzzInput) bytes(n int) []byte {
	n = min(n, len(in.b))
	v := in.b[:n]
	in.b = in.b[n:]
	return v
}

var clusterNames = []string{"c0", "c1", "c2", "c3"}

// step reads one response from the input and hands it to the client.
func (s *fuzzStream) step(t *testing.T, in *fuzzInput, step int) {
	version := fmt.Sprint(step)
	var (
		typeURL string
		names   []string
		rs      []*anypb.Any
		removed []string
	)
	add := func(name string, m proto.Message) {
		names, rs = append(names, name), append(rs, anyOf(t, m))
	}
	switch op := in.next(); op % 4 {
	case 0, 1:
		typeURL = xds.ClusterType
		for range in.next() % 5 {
			name := clusterNames[in.next()%4]
			add(name, fuzzCluster(name, in.next()))
		}
	case 2:
		typeURL = xds.EndpointType
		for range in.next() % 4 {
			name := append(clusterNames, "shared")[in.next()%5]
			add(name, fuzzEndpoints(name, in.next()))
		}
	case 3:
		// Bytes that may not decode, in place of a cluster; in Delta, a
		// removal besides.
		typeURL = xds.ClusterType
		name := clusterNames[in.next()%4]
		names = append(names, name)
		rs = append(rs, &anypb.Any{TypeUrl: xds.ClusterType, Value: in.bytes(int(in.next() % 24))})
		if s.delta {
			removed = append(removed, clusterNames[in.next()%4])
		}
	}
	if _, err := s.driver.Respond(typeURL, version, names, rs, removed); err != nil {
		t.Fatalf("step %d: %v", step, err)
	}
}

// fuzzCluster is cluster name in one of its variants: the VIP among four,
// the port valid or not, TCP or UDP, endpoints inline or by EDS (its own
// name or one shared), an l4lb cluster or not.
func fuzzCluster(name string, v byte) *clusterv3.Cluster {
	port := 80.0
	if v&4 != 0 {
		port = 0
	}
	md := map[string]*structpb.Value{
		"vip":  structpb.NewStringValue(fmt.Sprintf("10.0.0.%d", v&3)),
		"port": structpb.NewNumberValue(port),
	}
	if v&16 != 0 {
		md["protocol"] = structpb.NewStringValue("UDP")
	}
	c := &clusterv3.Cluster{Name: name, AltStatName: fmt.Sprint(v)}
	if v&32 == 0 {
		c.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{l4lb.MetadataKey: {Fields: md}}}
	}
	if v&8 != 0 {
		service := name
		if v&64 != 0 {
			service = "shared"
		}
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}
		c.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{ServiceName: service}
	} else {
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}
		c.LoadAssignment = fuzzEndpoints(name, v>>1)
	}
	return c
}

// fuzzEndpoints is a ClusterLoadAssignment in one of its variants: one or
// two endpoints, a weight (0, invalid, in one variant), draining or not,
// priority 0 or 1.
func fuzzEndpoints(name string, v byte) *endpointv3.ClusterLoadAssignment {
	weight := uint32(1 + (v>>3)&3)
	if v&128 != 0 {
		weight = 0
	}
	var eps []*endpointv3.LbEndpoint
	for i := range 1 + int(v&1) {
		ep := &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
				Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address:       fmt.Sprintf("192.168.%d.%d", (v>>1)&3, i+1),
					PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 8080},
				}},
			}}},
			LoadBalancingWeight: wrapperspb.UInt32(weight),
		}
		if v&32 != 0 {
			ep.HealthStatus = corev3.HealthStatus_DRAINING
		}
		eps = append(eps, ep)
	}
	return &endpointv3.ClusterLoadAssignment{
		ClusterName: name,
		Endpoints:   []*endpointv3.LocalityLbEndpoints{{Priority: uint32(v>>6) & 1, LbEndpoints: eps}},
	}
}

// checkCache holds the client's cache to what the handlers accepted.
func (s *fuzzStream) checkCache(t *testing.T, step int) {
	t.Helper()
	// What is no longer requested is no longer accepted.
	maps.DeleteFunc(s.clas.msgs, func(name string, _ proto.Message) bool { return !s.requested.names[name] })

	// The client's cache holds the resources the handlers accepted, and
	// only those, in an accepted state.
	for _, typ := range []struct {
		url      string
		accepted *acceptedBy
	}{{xds.ClusterType, s.clusters}, {xds.EndpointType, s.clas}} {
		var cached []string
		for r := range s.client.Resources().All(s.db.ReadTxn()) {
			if r.TypeURL == typ.url && (r.State == xds.StateAcked || r.State == xds.StateNackedButCached) {
				cached = append(cached, r.Name)
			}
		}
		slices.Sort(cached)
		if accepted := slices.Sorted(maps.Keys(typ.accepted.msgs)); !slices.Equal(cached, accepted) {
			t.Fatalf("step %d: the client's cache has %q of %s accepted, the handler accepted %q", step, cached, xds.ShortTypeName(typ.url), accepted)
		}
	}

}

// checkTables holds the tables to what a fresh controller makes of the
// accepted resources alone.
func (s *fuzzStream) checkTables(t *testing.T, step int) {
	t.Helper()
	db := statedb.New()
	w, err := loadbalancer.NewWriter(db)
	if err != nil {
		t.Fatal(err)
	}
	ctrl := l4lb.NewController(l4lb.NewTablesSink(w), nopNames{})
	if rej := ctrl.HandleClusters(context.Background(), xds.Update{TypeURL: xds.ClusterType, Upserted: acceptedResources(s.clusters.msgs)}); len(rej) > 0 {
		t.Fatalf("step %d: the accepted clusters, applied alone, are rejected: %v", step, rej)
	}
	if rej := ctrl.HandleEndpoints(context.Background(), xds.Update{TypeURL: xds.EndpointType, Upserted: acceptedResources(s.clas.msgs)}); len(rej) > 0 {
		t.Fatalf("step %d: the accepted endpoints, applied alone, are rejected: %v", step, rej)
	}
	if got, want := dumpTables(s.db, s.w), dumpTables(db, w); got != want {
		t.Fatalf("step %d: the tables\n%s\nare not the translation of the accepted resources\n%s", step, got, want)
	}
}

func acceptedResources(msgs map[string]proto.Message) []xds.Resource {
	var rs []xds.Resource
	for _, name := range slices.Sorted(maps.Keys(msgs)) {
		rs = append(rs, xds.Resource{Name: name, Message: msgs[name]})
	}
	return rs
}

// dumpTables prints the rows of the three tables, sorted.
func dumpTables(db *statedb.DB, w *loadbalancer.Writer) string {
	txn := db.ReadTxn()
	var lines []string
	for svc := range w.Services().All(txn) {
		lines = append(lines, "service "+strings.Join(svc.TableRow(), " | "))
	}
	for fe := range w.Frontends().All(txn) {
		lines = append(lines, "frontend "+strings.Join(fe.TableRow(), " | "))
	}
	for be := range w.Backends().All(txn) {
		lines = append(lines, "backend "+strings.Join(be.TableRow(), " | "))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

type nopNames struct{}

func (nopNames) SetNames(string, []string) {}
