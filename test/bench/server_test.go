// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	xdsserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/l4xds/l4xds/pkg/controlplane"
	"github.com/l4xds/l4xds/pkg/devcerts"
	"github.com/l4xds/l4xds/pkg/l4lb"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
)

// shape is N clusters of M endpoints each.
type shape struct{ N, M int }

func (s shape) String() string { return fmt.Sprintf("%dx%d", s.N, s.M) }

// Addresses: cluster i has the VIP 10.0.0.0 + i + 1, port 80/TCP, and the
// endpoints 100.64.0.0 + i*M + j, port 8080: every backend is distinct
// (a million fit in 100.64.0.0/10).
const (
	vipBase     = 10 << 24
	backendBase = 100<<24 | 64<<16
	vipPort     = 80
	backendPort = 8080
)

func clusterName(i int) string { return "svc-" + strconv.Itoa(i) }

func vip(i int) lb.L3n4Addr {
	return lb.NewL3n4Addr(addr4(vipBase+uint32(i)+1), vipPort, lb.TCP)
}

func addr4(u uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(u >> 24), byte(u >> 16), byte(u >> 8), byte(u)})
}

// cluster is the l4lb cluster i, its endpoints from EDS.
func cluster(i int) *clusterv3.Cluster {
	name := clusterName(i)
	md, err := structpb.NewStruct(map[string]any{
		"vip":      vip(i).Addr.String(),
		"port":     vipPort,
		"protocol": "TCP",
	})
	if err != nil {
		panic(err)
	}
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{ServiceName: name},
		Metadata:             &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{l4lb.MetadataKey: md}},
	}
}

// cla is the ClusterLoadAssignment of cluster i: m endpoints, each of
// weight weights(j) (nil: all 1).
func cla(i, m int, weight func(j int) uint32) *endpointv3.ClusterLoadAssignment {
	eps := make([]*endpointv3.LbEndpoint, m)
	for j := range eps {
		w := uint32(1)
		if weight != nil {
			w = weight(j)
		}
		eps[j] = &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address:       addr4(backendBase + uint32(i*m+j)).String(),
					PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: backendPort},
				}}},
			}},
			LoadBalancingWeight: wrapperspb.UInt32(w),
		}
	}
	return &endpointv3.ClusterLoadAssignment{
		ClusterName: clusterName(i),
		Endpoints:   []*endpointv3.LocalityLbEndpoints{{LbEndpoints: eps}},
	}
}

// resources are a shape's clusters and ClusterLoadAssignments by name.
func resources(s shape) (clusters, clas map[string]types.Resource) {
	clusters = make(map[string]types.Resource, s.N)
	clas = make(map[string]types.Resource, s.N)
	for i := range s.N {
		clusters[clusterName(i)] = cluster(i)
		clas[clusterName(i)] = cla(i, s.M, nil)
	}
	return clusters, clas
}

// server is a go-control-plane ADS server with one LinearCache per type,
// serving mTLS with development certificates.
type server struct {
	addr      string
	certs     string
	clusters  *cache.LinearCache
	endpoints *cache.LinearCache
	grpc      *grpc.Server
}

func startServer(tb testing.TB) *server {
	tb.Helper()
	s := &server{
		certs:     tb.TempDir(),
		clusters:  cache.NewLinearCache(xds.ClusterType),
		endpoints: cache.NewLinearCache(xds.EndpointType),
	}
	if err := devcerts.Write(s.certs, devcerts.Options{}); err != nil {
		tb.Fatal(err)
	}
	tlsConfig, err := controlplane.ServerTLSConfig(
		filepath.Join(s.certs, devcerts.ServerCert), filepath.Join(s.certs, devcerts.ServerKey),
		filepath.Join(s.certs, devcerts.CACert))
	if err != nil {
		tb.Fatal(err)
	}
	mux := &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return r.GetTypeUrl() },
		Caches:        map[string]cache.Cache{xds.ClusterType: s.clusters, xds.EndpointType: s.endpoints},
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.grpc = grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsConfig)))
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(s.grpc, xdsserver.NewServer(ctx, mux, nil))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s.addr = lis.Addr().String()
	go s.grpc.Serve(lis)
	tb.Cleanup(func() {
		s.grpc.Stop()
		cancel()
	})
	return s
}

// set serves the resources: the endpoints first, so that every name the
// clusters make the agent ask for is there.
func (s *server) set(clusters, clas map[string]types.Resource) {
	s.endpoints.SetResources(clas)
	s.clusters.SetResources(clusters)
}
