// SPDX-License-Identifier: Apache-2.0

package l4lb

import (
	"net/netip"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
)

// BenchmarkTranslateEndpoints translates a ClusterLoadAssignment of 1000
// endpoints in two localities; ns/op and allocs/op are per CLA.
func BenchmarkTranslateEndpoints(b *testing.B) {
	const n = 1000
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: "db"}
	for l := range 2 {
		lle := &endpointv3.LocalityLbEndpoints{Priority: uint32(l), Locality: &corev3.Locality{Zone: "zone"}}
		for i := range n / 2 {
			ip := netip.AddrFrom4([4]byte{10, byte(l), byte(i >> 8), byte(i)})
			lle.LbEndpoints = append(lle.LbEndpoints, &endpointv3.LbEndpoint{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
						Address:       ip.String(),
						PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 3306},
					}}},
				}},
			})
		}
		cla.Endpoints = append(cla.Endpoints, lle)
	}
	b.ReportAllocs()
	for b.Loop() {
		bes, err := TranslateEndpoints(cla)
		if err != nil || len(bes) != n {
			b.Fatalf("%d backends, error %v", len(bes), err)
		}
	}
}
