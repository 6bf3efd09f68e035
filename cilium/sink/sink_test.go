// SPDX-License-Identifier: Apache-2.0

package sink

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	clb "github.com/cilium/cilium/pkg/loadbalancer"

	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// TestServiceName: our service names become Cilium's in Cilium's parts,
// from the parts the translation gives, never by splitting at slashes (an
// xDS cluster's name may hold some).
func TestServiceName(t *testing.T) {
	for _, tc := range []struct {
		svc                      lb.Service
		cluster, namespace, name string
	}{
		{lb.Service{Name: "db"}, "", "xds", "db"},
		{lb.Service{Name: "xds/db", Namespace: "xds"}, "", "xds", "db"},
		{lb.Service{Name: "xds/outbound|80||web/v1", Namespace: "xds"}, "", "xds", "outbound|80||web/v1"},
		{lb.Service{Name: "platform/cassandra", Namespace: "platform"}, "", "platform", "cassandra"},
		{lb.Service{Name: "prod/platform/cassandra", Namespace: "platform", Cluster: "prod"}, "prod", "platform", "cassandra"},
	} {
		n := serviceName(&tc.svc)
		if n.Cluster() != tc.cluster || n.Namespace() != tc.namespace || n.Name() != tc.name {
			t.Errorf("%q: cluster %q namespace %q name %q, want %q %q %q", tc.svc.Name, n.Cluster(), n.Namespace(), n.Name(), tc.cluster, tc.namespace, tc.name)
		}
	}
}

// TestBackendRowsLarge: past linearRows rows, backendRows finds an address's
// row in a map, and makes the same rows, and the same errors, as the search
// one by one: a target port merging a service's endpoints, a second port
// name on a row, a conflict between two.
func TestBackendRowsLarge(t *testing.T) {
	const n = 60
	// n backends on hosts of three ports each, at port base+i%3.
	backends := func(base uint16) []lb.BackendParams {
		var bes []lb.BackendParams
		for i := range n {
			addr := netip.AddrFrom4([4]byte{10, 1, byte(i / 3), 1})
			bes = append(bes, lb.BackendParams{
				Address:  lb.NewL3n4Addr(addr, base+uint16(i%3), lb.TCP),
				Weight:   uint16(1 + i%4),
				Priority: uint32(i % 2),
				Zone:     fmt.Sprintf("zone-%d", i%2),
			})
		}
		return bes
	}
	tcp, tcp8080, udp := portName{clb.TCP, 0}, portName{clb.TCP, 8080}, portName{clb.UDP, 0}
	for _, tc := range []struct {
		name     string
		backends []lb.BackendParams
		ports    []portName
		rows     int // 0: an error
	}{
		{"distinct", backends(8080), []portName{tcp, udp}, 2 * n},
		{"target port merges a host's endpoints", backends(8080), []portName{tcp8080}, n / 3},
		{"a second port name on a row", backends(8080)[:1:1], []portName{tcp, tcp8080}, 1},
		{"a second port name on many rows", everyThird(backends(8080)), []portName{tcp, tcp8080}, n / 3},
		{"a conflict", backends(8080), []portName{tcp, tcp8080}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := lb.ServiceName("svc")
			mapped, mappedErr := backendRows(name, tc.backends, tc.ports)
			old := linearRows
			linearRows = 1 << 30
			t.Cleanup(func() { linearRows = old })
			searched, searchedErr := backendRows(name, tc.backends, tc.ports)
			if fmt.Sprint(mappedErr) != fmt.Sprint(searchedErr) {
				t.Fatalf("error %v, searched one by one %v", mappedErr, searchedErr)
			}
			if !reflect.DeepEqual(mapped, searched) {
				t.Fatalf("rows differ from those searched one by one:\n%v\n%v", mapped, searched)
			}
			switch {
			case tc.rows == 0 && mappedErr == nil:
				t.Fatalf("%d rows, want an error", len(mapped))
			case tc.rows > 0 && (mappedErr != nil || len(mapped) != tc.rows):
				t.Fatalf("%d rows, %v; want %d rows", len(mapped), mappedErr, tc.rows)
			}
		})
	}
}

// everyThird are bes[0], bes[3], ...: of backends(8080), each host's at
// port 8080.
func everyThird(bes []lb.BackendParams) []lb.BackendParams {
	var out []lb.BackendParams
	for i := 0; i < len(bes); i += 3 {
		out = append(out, bes[i])
	}
	return out
}

// BenchmarkBackendRows: a service's rows, by its number of backends.
func BenchmarkBackendRows(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var bes []lb.BackendParams
			for i := range n {
				addr := netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)})
				bes = append(bes, lb.BackendParams{Address: lb.NewL3n4Addr(addr, 8080, lb.TCP), Weight: 1})
			}
			ports := []portName{{clb.TCP, 0}}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := backendRows("svc", bes, ports); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
