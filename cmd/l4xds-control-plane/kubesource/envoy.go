// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"net/netip"
	"strconv"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// MetadataKey is the filter metadata key of l4xds clusters.
const MetadataKey = "io.cilium.l4lb"

// frontend is one entry of a cluster's `frontends` metadata.
type frontend struct {
	VIP        netip.Addr
	Port       int32
	Protocol   string // TCP or UDP
	TargetPort int32  // 0: the endpoint's port
}

// backend is one endpoint of a cluster's ClusterLoadAssignment.
type backend struct {
	Addr   netip.Addr
	Port   int32
	Weight uint32 // 0: the default (1)
	Health corev3.HealthStatus
}

// l4Cluster is what one Service or Gateway listener publishes.
type l4Cluster struct {
	Name            string
	Frontends       []frontend
	SourceRanges    []string
	AffinityTimeout time.Duration
	Backends        []backend
	RejectWeight    uint32 // the share of new flows refused, against the backends' weights
}

// resources returns the EDS Cluster and its ClusterLoadAssignment.
func (c *l4Cluster) resources() (*clusterv3.Cluster, *endpointv3.ClusterLoadAssignment) {
	fes := make([]any, 0, len(c.Frontends))
	for _, f := range c.Frontends {
		fe := map[string]any{"vip": f.VIP.String(), "port": float64(f.Port), "protocol": f.Protocol}
		if f.TargetPort != 0 {
			fe["target_port"] = float64(f.TargetPort)
		}
		fes = append(fes, fe)
	}
	md := map[string]any{"frontends": fes}
	if len(c.SourceRanges) > 0 {
		ranges := make([]any, len(c.SourceRanges))
		for i, r := range c.SourceRanges {
			ranges[i] = r
		}
		md["source_ranges"] = ranges
	}
	if c.AffinityTimeout > 0 {
		md["session_affinity_timeout"] = strconv.FormatInt(int64(c.AffinityTimeout/time.Second), 10) + "s"
	}
	if c.RejectWeight > 0 {
		md["reject_weight"] = float64(c.RejectWeight)
	}
	st, err := structpb.NewStruct(md)
	if err != nil {
		panic(err) // only strings, numbers and lists of them above
	}
	cl := &clusterv3.Cluster{
		Name:                 c.Name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{ServiceName: c.Name},
		Metadata:             &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataKey: st}},
	}
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: c.Name}
	if len(c.Backends) > 0 {
		lbes := make([]*endpointv3.LbEndpoint, 0, len(c.Backends))
		for _, b := range c.Backends {
			lbe := &endpointv3.LbEndpoint{
				HealthStatus: b.Health,
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
						Address:       b.Addr.String(),
						PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(b.Port)},
					}}},
				}},
			}
			if b.Weight > 0 {
				lbe.LoadBalancingWeight = wrapperspb.UInt32(b.Weight)
			}
			lbes = append(lbes, lbe)
		}
		cla.Endpoints = []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbes}}
	}
	return cl, cla
}
