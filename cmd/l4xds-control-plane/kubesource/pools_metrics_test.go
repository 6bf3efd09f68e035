// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Build counts, per pool and family, the addresses the pool has and those
// objects hold: an address shared by two Services once, an address held
// outside every pool not at all, a family the pool has no range of not.
func TestPoolUsage(t *testing.T) {
	at := metav1.NewTime(time.Unix(1000, 0))
	svc := func(name, sharing string, family corev1.IPFamily, port int32, held string) *corev1.Service {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", CreationTimestamp: at, Annotations: map[string]string{}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: new(DefaultLoadBalancerClass),
				IPFamilies: []corev1.IPFamily{family},
				Ports:      []corev1.ServicePort{{Port: port, Protocol: corev1.ProtocolTCP}}},
		}
		if sharing != "" {
			s.Annotations[AnnotationSharingKey] = sharing
		}
		if held != "" {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: held}}
		}
		return s
	}
	lan, _ := ParsePool("lan=10.0.0.1-10.0.0.3,10.0.1.0/24")
	v6, _ := ParsePool("v6=2001:db8::/64")
	out := Build(Config{Pools: Pools{lan, v6}, KeepHeldAddresses: true}, State{Services: []*corev1.Service{
		svc("web", "front", corev1.IPv4Protocol, 80, ""),
		svc("web-tls", "front", corev1.IPv4Protocol, 443, ""), // shares web's address
		svc("db", "", corev1.IPv4Protocol, 5432, ""),
		svc("legacy", "", corev1.IPv4Protocol, 22, "192.0.2.1"), // held, in no pool
		svc("dns", "", corev1.IPv6Protocol, 53, ""),
	}})
	want := []PoolUsage{
		{Pool: "lan", Family: "ipv4", Addresses: 3 + 256, Allocated: 2},
		{Pool: "v6", Family: "ipv6", Addresses: 1 << 64, Allocated: 1},
	}
	if len(out.Pools) != len(want) {
		t.Fatalf("pools %+v, want %+v", out.Pools, want)
	}
	for i := range want {
		if out.Pools[i] != want[i] {
			t.Errorf("pool %d: %+v, want %+v", i, out.Pools[i], want[i])
		}
	}

	m := newPoolMetrics()
	if n := testutil.CollectAndCount(m); n != 0 {
		t.Errorf("%d series before the first state", n)
	}
	m.set(out.Pools)
	exp := `# HELP l4xds_control_plane_pool_addresses Addresses of each address pool, by family
# TYPE l4xds_control_plane_pool_addresses gauge
l4xds_control_plane_pool_addresses{family="ipv4",pool="lan"} 259
l4xds_control_plane_pool_addresses{family="ipv6",pool="v6"} 1.8446744073709552e+19
# HELP l4xds_control_plane_pool_addresses_allocated Addresses of each address pool held by Services and Gateways, by family
# TYPE l4xds_control_plane_pool_addresses_allocated gauge
l4xds_control_plane_pool_addresses_allocated{family="ipv4",pool="lan"} 2
l4xds_control_plane_pool_addresses_allocated{family="ipv6",pool="v6"} 1
`
	if err := testutil.CollectAndCompare(m, strings.NewReader(exp)); err != nil {
		t.Error(err)
	}
	// A pool removed from the ConfigMap loses its series.
	m.set(out.Pools[:1])
	if n := testutil.CollectAndCount(m); n != 2 {
		t.Errorf("%d series after v6 was removed, want lan's 2", n)
	}
}
