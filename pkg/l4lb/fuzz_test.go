// SPDX-License-Identifier: Apache-2.0

package l4lb

import (
	"errors"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/l4xds/l4xds/pkg/loadbalancer"
)

// FuzzTranslateCluster feeds arbitrary clusters (proto bytes) with arbitrary
// io.cilium.l4lb metadata (JSON) to TranslateCluster. It must never panic,
// every error must name the cluster, and whatever it accepts must be
// something the datapath can program.
func FuzzTranslateCluster(f *testing.F) {
	for _, m := range loadResources(f, "testdata/cfp.yaml") {
		if c, ok := m.(*clusterv3.Cluster); ok {
			meta, err := protojson.Marshal(c.GetMetadata().GetFilterMetadata()[MetadataKey])
			if err != nil {
				f.Fatal(err)
			}
			c = proto.Clone(c).(*clusterv3.Cluster)
			c.Metadata = nil
			b, err := proto.Marshal(c)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(meta, b)
		}
	}
	static, err := proto.Marshal(clusterYAML(f, `
name: dns
type: STATIC
load_assignment:
  cluster_name: dns
  endpoints:
  - locality: {zone: a}
    priority: 1
    lb_endpoints:
    - endpoint: {address: {socket_address: {address: 10.0.1.1, port_value: 53}}}
      load_balancing_weight: 3
      health_status: DRAINING
    - endpoint: {address: {socket_address: {address: "fd00::1", port_value: 53}}}
`))
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(`{"frontends": [{"vip": "10.0.0.53", "port": 53, "protocol": "udp"}, {"vip": "2001:db8::53", "port": 53, "target_port": 5353}], "source_ranges": ["10.0.0.0/8"], "session_affinity_timeout": "3h", "labels": {"announce": "bgp", "example.com/tier": ""}}`), static)
	// More seeds, and every crasher found, are in testdata/fuzz/FuzzTranslateCluster.

	f.Fuzz(func(t *testing.T, meta, clusterBytes []byte) {
		c := &clusterv3.Cluster{}
		if err := proto.Unmarshal(clusterBytes, c); err != nil {
			c = &clusterv3.Cluster{Name: "db", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}}
		}
		md := &structpb.Struct{}
		if err := protojson.Unmarshal(meta, md); err == nil {
			if c.Metadata == nil {
				c.Metadata = &corev3.Metadata{}
			}
			if c.Metadata.FilterMetadata == nil {
				c.Metadata.FilterMetadata = map[string]*structpb.Struct{}
			}
			c.Metadata.FilterMetadata[MetadataKey] = md
		}

		spec, err := TranslateCluster(c)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Kind != "cluster" || e.Name != c.GetName() {
				t.Fatalf("error %q does not name cluster %q", err, c.GetName())
			}
			if spec != nil {
				t.Fatalf("error %q with a spec", err)
			}
			return
		}
		if spec == nil {
			if _, ours := c.GetMetadata().GetFilterMetadata()[MetadataKey]; ours {
				t.Fatal("cluster with io.cilium.l4lb metadata neither accepted nor rejected")
			}
			return
		}
		want := c.GetName()
		if s := c.GetMetadata().GetFilterMetadata()[MetadataKey].GetFields()["service"].GetStringValue(); s != "" {
			want = s
		}
		checkSpec(t, want, spec)
	})
}

// checkSpec asserts what every accepted spec must satisfy; name is the
// service's own name (the cluster's, or the metadata's service).
func checkSpec(t *testing.T, name string, spec *ServiceSpec) {
	t.Helper()
	svc := spec.Service
	qualified := name
	if svc != nil && svc.Namespace != "" {
		qualified = svc.Namespace + "/" + name
		if svc.Cluster != "" {
			qualified = svc.Cluster + "/" + qualified
		}
	}
	if svc == nil || svc.Name != loadbalancer.ServiceName(qualified) || name == "" || svc.Source != loadbalancer.SourceXDS {
		t.Fatalf("service %+v for cluster %q", svc, name)
	}
	for _, p := range svc.SourceRanges {
		if !p.IsValid() || p != p.Masked() {
			t.Fatalf("source range %s", p)
		}
	}
	if svc.SessionAffinity != (svc.SessionAffinityTimeout > 0) {
		t.Fatalf("affinity %v with timeout %s", svc.SessionAffinity, svc.SessionAffinityTimeout)
	}
	if len(spec.Frontends) == 0 {
		t.Fatal("no frontends")
	}
	seen := map[loadbalancer.L3n4Addr]bool{}
	for _, fe := range spec.Frontends {
		a := fe.Address
		if !usableIP(a) || a.Port == 0 || (a.Protocol != loadbalancer.TCP && a.Protocol != loadbalancer.UDP) {
			t.Fatalf("frontend %s", a)
		}
		if fe.ServiceName != svc.Name || fe.Type != loadbalancer.SVCTypeLoadBalancer {
			t.Fatalf("frontend %s: service %q type %q", a, fe.ServiceName, fe.Type)
		}
		if seen[a] {
			t.Fatalf("frontend %s twice", a)
		}
		seen[a] = true
	}
	if spec.EDSName != "" && len(spec.Backends) > 0 {
		t.Fatal("EDS cluster with inline backends")
	}
	checkBackends(t, spec.Backends)
}

func checkBackends(t *testing.T, bes []loadbalancer.BackendParams) {
	t.Helper()
	seen := map[loadbalancer.L3n4Addr]bool{}
	for _, be := range bes {
		a := be.Address
		if !usableIP(a) || a.Port == 0 || a.Protocol != loadbalancer.ANY {
			t.Fatalf("backend %s", a)
		}
		if be.Weight == 0 || be.State > loadbalancer.BackendStateQuarantined {
			t.Fatalf("backend %s: weight %d state %s", a, be.Weight, be.State)
		}
		if seen[a] {
			t.Fatalf("backend %s twice", a)
		}
		seen[a] = true
	}
}

func usableIP(a loadbalancer.L3n4Addr) bool {
	ip := a.Addr
	return ip.IsValid() && !ip.Is4In6() && ip.Zone() == "" && !ip.IsUnspecified() && !ip.IsMulticast()
}
