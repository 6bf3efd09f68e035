// SPDX-License-Identifier: Apache-2.0

package l4lb

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/l4xds/l4xds/pkg/loadbalancer"
)

// specString prints a spec one line per row, so that tests read like the
// tables an operator sees.
func specString(s *ServiceSpec) string {
	if s == nil {
		return "<not ours>"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "service %s source=%s", s.Service.Name, s.Service.Source)
	if len(s.Service.SourceRanges) > 0 {
		fmt.Fprintf(&b, " ranges=%v", s.Service.SourceRanges)
	}
	if s.Service.SessionAffinity {
		fmt.Fprintf(&b, " affinity=%s", s.Service.SessionAffinityTimeout)
	}
	if s.Service.RejectWeight > 0 {
		fmt.Fprintf(&b, " reject=%d", s.Service.RejectWeight)
	}
	if s.Service.Namespace != "" || s.Service.Cluster != "" {
		fmt.Fprintf(&b, " cluster=%q namespace=%q", s.Service.Cluster, s.Service.Namespace)
	}
	if len(s.Service.PortNames) > 0 {
		fmt.Fprintf(&b, " portNames=%v", s.Service.PortNames)
	}
	if len(s.Service.Labels) > 0 {
		fmt.Fprintf(&b, " labels=%v", s.Service.Labels)
	}
	b.WriteString("\n")
	for _, fe := range s.Frontends {
		fmt.Fprintf(&b, "frontend %s %s svc=%s", fe.Address, fe.Type, fe.ServiceName)
		if fe.ServicePort != 0 {
			fmt.Fprintf(&b, " target=%d", fe.ServicePort)
		}
		if fe.PortName != "" {
			fmt.Fprintf(&b, " portName=%s", fe.PortName)
		}
		b.WriteString("\n")
	}
	if s.EDSName != "" {
		fmt.Fprintf(&b, "eds %s\n", s.EDSName)
	}
	b.WriteString(backendsString(s.Backends))
	return b.String()
}

func backendsString(bes []loadbalancer.BackendParams) string {
	var b strings.Builder
	for _, be := range bes {
		fmt.Fprintf(&b, "backend %s weight=%d %s", be.Address, be.Weight, be.State)
		if be.Priority != 0 {
			fmt.Fprintf(&b, " priority=%d", be.Priority)
		}
		if be.Zone != "" {
			fmt.Fprintf(&b, " zone=%s", be.Zone)
		}
		if be.NodeName != "" {
			fmt.Fprintf(&b, " node=%s", be.NodeName)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func TestTranslateCFPExample(t *testing.T) {
	msgs := loadResources(t, "testdata/cfp.yaml")
	if len(msgs) != 2 {
		t.Fatalf("want 2 resources, got %d", len(msgs))
	}
	spec, err := TranslateCluster(msgs[0].(*clusterv3.Cluster))
	if err != nil {
		t.Fatal(err)
	}
	want := "service my-database-service source=xds\n" +
		"frontend 10.1.2.3:3306/TCP LoadBalancer svc=my-database-service\n" +
		"eds my-database-service\n"
	if got := specString(spec); got != want {
		t.Errorf("cluster:\ngot:\n%s\nwant:\n%s", got, want)
	}

	bes, err := TranslateEndpoints(msgs[1].(*endpointv3.ClusterLoadAssignment))
	if err != nil {
		t.Fatal(err)
	}
	want = "backend 192.168.1.10:3306 weight=1 active\n" +
		"backend 192.168.1.11:3306 weight=1 active\n"
	if got := backendsString(bes); got != want {
		t.Errorf("endpoints:\ngot:\n%s\nwant:\n%s", got, want)
	}
}

// l4lbCluster is an EDS cluster "db" whose io.cilium.l4lb metadata is meta,
// a YAML flow mapping.
func l4lbCluster(meta string) string {
	return "name: db\ntype: EDS\nmetadata:\n  filter_metadata:\n    io.cilium.l4lb: " + meta + "\n"
}

func TestTranslateCluster(t *testing.T) {
	const known = "(known: vip, port, protocol, frontends, source_ranges, session_affinity_timeout, reject_weight, service, namespace, cluster, portName, labels)"
	tests := []struct {
		name    string
		cluster string // YAML
		want    string // specString, when no error
		wantErr string
	}{
		// Not ours.
		{
			name:    "no metadata",
			cluster: "name: envoy-only\ntype: EDS",
			want:    "<not ours>",
		},
		{
			name:    "other filter metadata",
			cluster: "name: envoy-only\ntype: STRICT_DNS\nmetadata: {filter_metadata: {envoy.lb: {canary: true}}}",
			want:    "<not ours>",
		},

		// Single frontend.
		{
			name:    "vip and port, protocol defaults to TCP",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 3306}`),
			want:    "service db source=xds\nfrontend 10.1.2.3:3306/TCP LoadBalancer svc=db\neds db\n",
		},
		{
			name:    "protocol is case-insensitive",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 53, protocol: udp}`),
			want:    "service db source=xds\nfrontend 10.1.2.3:53/UDP LoadBalancer svc=db\neds db\n",
		},
		{
			name:    "IPv6 vip",
			cluster: l4lbCluster(`{vip: "2001:db8::1", port: 443, protocol: Tcp}`),
			want:    "service db source=xds\nfrontend [2001:db8::1]:443/TCP LoadBalancer svc=db\neds db\n",
		},
		{
			name:    "IPv4-mapped IPv6 vip is the IPv4 address",
			cluster: l4lbCluster(`{vip: "::ffff:10.1.2.3", port: 80}`),
			want:    "service db source=xds\nfrontend 10.1.2.3:80/TCP LoadBalancer svc=db\neds db\n",
		},
		{
			name:    "port bounds",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 65535}`),
			want:    "service db source=xds\nfrontend 10.1.2.3:65535/TCP LoadBalancer svc=db\neds db\n",
		},

		// Several frontends.
		{
			name:    "DNS on TCP and UDP",
			cluster: l4lbCluster(`{frontends: [{vip: "10.0.0.53", port: 53, protocol: UDP}, {vip: "10.0.0.53", port: 53, protocol: TCP}]}`),
			want: "service db source=xds\n" +
				"frontend 10.0.0.53:53/UDP LoadBalancer svc=db\n" +
				"frontend 10.0.0.53:53/TCP LoadBalancer svc=db\n" +
				"eds db\n",
		},
		{
			name:    "dual-stack with target_port",
			cluster: l4lbCluster(`{frontends: [{vip: "10.1.2.3", port: 80, target_port: 8080}, {vip: "2001:db8::3", port: 80, target_port: 8080}]}`),
			want: "service db source=xds\n" +
				"frontend 10.1.2.3:80/TCP LoadBalancer svc=db target=8080\n" +
				"frontend [2001:db8::3]:80/TCP LoadBalancer svc=db target=8080\n" +
				"eds db\n",
		},

		// Service options.
		{
			name:    "source_ranges are masked and deduplicated",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, source_ranges: ["10.0.0.0/8", "192.168.1.7/24", "10.0.0.0/8", "2001:db8::/32"]}`),
			want:    "service db source=xds ranges=[10.0.0.0/8 192.168.1.0/24 2001:db8::/32]\nfrontend 10.1.2.3:80/TCP LoadBalancer svc=db\neds db\n",
		},
		{
			name:    "empty source_ranges allow everyone",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, source_ranges: []}`),
			want:    "service db source=xds\nfrontend 10.1.2.3:80/TCP LoadBalancer svc=db\neds db\n",
		},
		{
			name:    "session_affinity_timeout in hours",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, session_affinity_timeout: "3h"}`),
			want:    "service db source=xds affinity=3h0m0s\nfrontend 10.1.2.3:80/TCP LoadBalancer svc=db\neds db\n",
		},
		{
			name:    "session_affinity_timeout in seconds",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, session_affinity_timeout: "10800s"}`),
			want:    "service db source=xds affinity=3h0m0s\nfrontend 10.1.2.3:80/TCP LoadBalancer svc=db\neds db\n",
		},
		{
			name:    "reject_weight",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, reject_weight: 30}`),
			want:    "service db source=xds reject=30\nfrontend 10.1.2.3:80/TCP LoadBalancer svc=db\neds db\n",
		},
		{
			name:    "labels, for Cilium's BGP and L2 announcement selectors",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, labels: {announce: bgp, "example.com/tier": "", app.kubernetes.io_name: db}}`),
			want:    "service db source=xds labels=map[announce:bgp app.kubernetes.io_name:db example.com/tier:]\nfrontend 10.1.2.3:80/TCP LoadBalancer svc=db\neds db\n",
		},
		{
			name:    "empty labels are none",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, labels: {}}`),
			want:    "service db source=xds\nfrontend 10.1.2.3:80/TCP LoadBalancer svc=db\neds db\n",
		},
		{
			name:    "labels: a list",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, labels: [bgp]}`),
			wantErr: `cluster "db": io.cilium.l4lb.labels: want a struct of strings, got a list`,
		},
		{
			name:    "labels: a number value",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, labels: {tier: 1}}`),
			wantErr: `cluster "db": io.cilium.l4lb.labels.tier: want a string, got number 1`,
		},
		{
			name:    "labels: a key Kubernetes would refuse",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, labels: {"Example.com/tier": a}}`),
			wantErr: `cluster "db": io.cilium.l4lb.labels.Example.com/tier: key: prefix "Example.com" is not a DNS subdomain (lower case letters, digits, '-' and '.', at most 253)`,
		},
		{
			name:    "labels: a value Kubernetes would refuse",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, labels: {tier: "-front"}}`),
			wantErr: `cluster "db": io.cilium.l4lb.labels.tier: value "-front": want at most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit`,
		},
		{
			name:    "reject_weight 0 is none",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, reject_weight: 0}`),
			want:    "service db source=xds\nfrontend 10.1.2.3:80/TCP LoadBalancer svc=db\neds db\n",
		},

		// The keys of the CFP author's prototype.
		{
			name:    "the prototype's documented cluster",
			cluster: l4lbCluster(`{vip: "10.0.20.15", port: 9042, protocol: tcp, service: cassandra}`),
			want:    "service cassandra source=xds\nfrontend 10.0.20.15:9042/TCP LoadBalancer svc=cassandra\neds db\n",
		},
		{
			name:    "service, namespace and cluster name the service as Cilium does",
			cluster: l4lbCluster(`{vip: "10.0.0.6", port: 80, protocol: UDP, namespace: override, cluster: edge, service: frontend}`),
			want:    "service edge/override/frontend source=xds cluster=\"edge\" namespace=\"override\"\nfrontend 10.0.0.6:80/UDP LoadBalancer svc=edge/override/frontend\neds db\n",
		},
		{
			name:    "a namespace alone qualifies the cluster's name",
			cluster: l4lbCluster(`{vip: "10.0.0.6", port: 80, namespace: platform}`),
			want:    "service platform/db source=xds cluster=\"\" namespace=\"platform\"\nfrontend 10.0.0.6:80/TCP LoadBalancer svc=platform/db\neds db\n",
		},
		{
			name:    "empty naming keys are the defaults",
			cluster: l4lbCluster(`{vip: "10.0.0.6", port: 80, service: "", namespace: "", cluster: ""}`),
			want:    "service db source=xds\nfrontend 10.0.0.6:80/TCP LoadBalancer svc=db\neds db\n",
		},
		{
			name:    "portName names the frontend's port",
			cluster: l4lbCluster(`{vip: "10.0.0.5", port: 5432, protocol: tcp, service: postgres, portName: sql}`),
			want:    "service postgres source=xds portNames=map[sql:5432]\nfrontend 10.0.0.5:5432/TCP LoadBalancer svc=postgres portName=sql\neds db\n",
		},
		{
			name:    "portName in frontends: TCP and UDP may share one",
			cluster: l4lbCluster(`{frontends: [{vip: "10.0.0.53", port: 53, protocol: UDP, portName: dns}, {vip: "10.0.0.53", port: 53, portName: dns}, {vip: "10.0.0.53", port: 853, portName: dot}]}`),
			want: "service db source=xds portNames=map[dns:53 dot:853]\n" +
				"frontend 10.0.0.53:53/UDP LoadBalancer svc=db portName=dns\n" +
				"frontend 10.0.0.53:53/TCP LoadBalancer svc=db portName=dns\n" +
				"frontend 10.0.0.53:853/TCP LoadBalancer svc=db portName=dot\n" +
				"eds db\n",
		},
		{
			name:    "numbers given as strings",
			cluster: l4lbCluster(`{frontends: [{vip: "10.1.2.3", port: "8080", target_port: "80"}], reject_weight: "30"}`),
			want:    "service db source=xds reject=30\nfrontend 10.1.2.3:8080/TCP LoadBalancer svc=db target=80\neds db\n",
		},
		{
			name:    "port given as a string",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: "3306"}`),
			want:    "service db source=xds\nfrontend 10.1.2.3:3306/TCP LoadBalancer svc=db\neds db\n",
		},
		{
			name:    "cluster without a namespace",
			cluster: l4lbCluster(`{vip: "10.0.0.6", port: 80, cluster: edge}`),
			wantErr: `cluster "db": io.cilium.l4lb.cluster: "edge" needs a namespace (the namespace key or --xds-namespace)`,
		},
		{
			name:    "service with a slash",
			cluster: l4lbCluster(`{vip: "10.0.0.6", port: 80, service: "a/b"}`),
			wantErr: `cluster "db": io.cilium.l4lb.service: "a/b" contains a slash or a NUL byte`,
		},
		{
			name:    "namespace not a string",
			cluster: l4lbCluster(`{vip: "10.0.0.6", port: 80, namespace: 5}`),
			wantErr: `cluster "db": io.cilium.l4lb.namespace: want a string, got number 5`,
		},
		{
			name:    "portName with frontends",
			cluster: l4lbCluster(`{frontends: [{vip: "10.0.0.53", port: 53}], portName: dns}`),
			wantErr: `cluster "db": io.cilium.l4lb.portName: cannot be combined with frontends (give either vip and port, or frontends)`,
		},
		{
			name:    "one portName for two ports",
			cluster: l4lbCluster(`{frontends: [{vip: "10.0.0.53", port: 53, portName: dns}, {vip: "10.0.0.53", port: 5353, portName: dns}]}`),
			wantErr: `cluster "db": io.cilium.l4lb.frontends[1].portName: "dns" already names port 53 (frontends[0])`,
		},
		{
			name:    "portName not a string",
			cluster: l4lbCluster(`{vip: "10.0.0.5", port: 5432, portName: 1}`),
			wantErr: `cluster "db": io.cilium.l4lb.portName: want a string, got number 1`,
		},

		// Discovery.
		{
			name:    "EDS service_name names the CLA",
			cluster: "name: db\ntype: EDS\neds_cluster_config: {service_name: db-endpoints}\nmetadata: {filter_metadata: {io.cilium.l4lb: {vip: 10.1.2.3, port: 5432}}}",
			want:    "service db source=xds\nfrontend 10.1.2.3:5432/TCP LoadBalancer svc=db\neds db-endpoints\n",
		},
		{
			name: "STATIC with inline load_assignment",
			cluster: `
name: db
type: STATIC
metadata: {filter_metadata: {io.cilium.l4lb: {vip: 10.1.2.3, port: 5432}}}
load_assignment:
  cluster_name: ignored
  endpoints:
  - locality: {zone: zone-a}
    lb_endpoints:
    - endpoint: {address: {socket_address: {address: 10.0.1.1, port_value: 5432}}}
      load_balancing_weight: 70
    - endpoint: {address: {socket_address: {address: 10.0.1.2, port_value: 5432}}}
      health_status: DRAINING
  - priority: 1
    lb_endpoints:
    - endpoint: {address: {socket_address: {address: "fd00::1", port_value: 5432}}}
`,
			want: "service db source=xds\nfrontend 10.1.2.3:5432/TCP LoadBalancer svc=db\n" +
				"backend 10.0.1.1:5432 weight=70 active zone=zone-a\n" +
				"backend 10.0.1.2:5432 weight=1 terminating zone=zone-a\n" +
				"backend [fd00::1]:5432 weight=1 active priority=1\n",
		},
		{
			name:    "STATIC with an empty load_assignment has no backends",
			cluster: "name: db\ntype: STATIC\nload_assignment: {cluster_name: db}\nmetadata: {filter_metadata: {io.cilium.l4lb: {vip: 10.1.2.3, port: 5432}}}",
			want:    "service db source=xds\nfrontend 10.1.2.3:5432/TCP LoadBalancer svc=db\n",
		},

		// Errors: schema.
		{
			name:    "empty metadata",
			cluster: l4lbCluster(`{}`),
			wantErr: `cluster "db": io.cilium.l4lb: neither vip nor frontends is set`,
		},
		{
			name:    "unknown key",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 3306, prot: UDP}`),
			wantErr: `cluster "db": io.cilium.l4lb.prot: unknown key ` + known,
		},
		{
			name:    "frontends and vip",
			cluster: l4lbCluster(`{vip: "10.1.2.3", frontends: [{vip: "10.1.2.3", port: 1}]}`),
			wantErr: `cluster "db": io.cilium.l4lb.vip: cannot be combined with frontends (give either vip and port, or frontends)`,
		},
		{
			name:    "frontends and protocol",
			cluster: l4lbCluster(`{protocol: UDP, frontends: [{vip: "10.1.2.3", port: 1}]}`),
			wantErr: `cluster "db": io.cilium.l4lb.protocol: cannot be combined with frontends (give either vip and port, or frontends)`,
		},
		{
			name:    "empty name",
			cluster: "type: EDS\nmetadata: {filter_metadata: {io.cilium.l4lb: {vip: 10.1.2.3, port: 1}}}",
			wantErr: `cluster "": name: must not be empty`,
		},

		// Errors: vip.
		{
			name:    "vip missing",
			cluster: l4lbCluster(`{port: 3306}`),
			wantErr: `cluster "db": io.cilium.l4lb.vip: required (or use frontends)`,
		},
		{
			name:    "vip truncated",
			cluster: l4lbCluster(`{vip: "10.1.2", port: 3306}`),
			wantErr: `cluster "db": io.cilium.l4lb.vip: "10.1.2" is not an IP address`,
		},
		{
			name:    "vip hostname",
			cluster: l4lbCluster(`{vip: "db.example.com", port: 3306}`),
			wantErr: `cluster "db": io.cilium.l4lb.vip: "db.example.com" is not an IP address`,
		},
		{
			name:    "vip with CIDR",
			cluster: l4lbCluster(`{vip: "10.1.2.3/32", port: 3306}`),
			wantErr: `cluster "db": io.cilium.l4lb.vip: "10.1.2.3/32" is not an IP address`,
		},
		{
			name:    "vip unspecified",
			cluster: l4lbCluster(`{vip: "0.0.0.0", port: 3306}`),
			wantErr: `cluster "db": io.cilium.l4lb.vip: "0.0.0.0" is the unspecified address`,
		},
		{
			name:    "vip multicast",
			cluster: l4lbCluster(`{vip: "ff02::1", port: 3306}`),
			wantErr: `cluster "db": io.cilium.l4lb.vip: "ff02::1" is a multicast address`,
		},
		{
			name:    "vip with zone",
			cluster: l4lbCluster(`{vip: "fe80::1%eth0", port: 3306}`),
			wantErr: `cluster "db": io.cilium.l4lb.vip: "fe80::1%eth0" has a zone, which is not supported`,
		},
		{
			name:    "vip not a string",
			cluster: l4lbCluster(`{vip: 10, port: 3306}`),
			wantErr: `cluster "db": io.cilium.l4lb.vip: want a string, got number 10`,
		},

		// Errors: port.
		{
			name:    "port missing",
			cluster: l4lbCluster(`{vip: "10.1.2.3"}`),
			wantErr: `cluster "db": io.cilium.l4lb.port: required`,
		},
		{
			name:    "reject_weight not a number",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, reject_weight: "thirty"}`),
			wantErr: `cluster "db": io.cilium.l4lb.reject_weight: want a number, got string "thirty"`,
		},
		{
			name:    "reject_weight out of range",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, reject_weight: 70000}`),
			wantErr: `cluster "db": io.cilium.l4lb.reject_weight: 70000 is out of range 0..65535`,
		},
		{
			name:    "reject_weight not an integer",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 80, reject_weight: 2.5}`),
			wantErr: `cluster "db": io.cilium.l4lb.reject_weight: 2.5 is not an integer`,
		},
		{
			name:    "port too large",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 70000}`),
			wantErr: `cluster "db": io.cilium.l4lb.port: 70000 is out of range 1..65535`,
		},
		{
			name:    "port zero",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 0}`),
			wantErr: `cluster "db": io.cilium.l4lb.port: 0 is out of range 1..65535`,
		},
		{
			name:    "port negative",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: -80}`),
			wantErr: `cluster "db": io.cilium.l4lb.port: -80 is out of range 1..65535`,
		},
		{
			name:    "port not an integer",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 3306.5}`),
			wantErr: `cluster "db": io.cilium.l4lb.port: 3306.5 is not an integer`,
		},
		{
			name:    "port a word",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: "mysql"}`),
			wantErr: `cluster "db": io.cilium.l4lb.port: want a number, got string "mysql"`,
		},
		{
			name:    "port a string out of range",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: "70000"}`),
			wantErr: `cluster "db": io.cilium.l4lb.port: 70000 is out of range 1..65535`,
		},
		{
			name:    "port a string with a sign",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: "+80"}`),
			wantErr: `cluster "db": io.cilium.l4lb.port: want a number, got string "+80"`,
		},
		{
			name:    "port null",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: null}`),
			wantErr: `cluster "db": io.cilium.l4lb.port: want a number, got null`,
		},

		// Errors: protocol.
		{
			name:    "protocol SCTP",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 3306, protocol: SCTP}`),
			wantErr: `cluster "db": io.cilium.l4lb.protocol: "SCTP" is not a protocol (want TCP or UDP)`,
		},
		{
			name:    "protocol not a string",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 3306, protocol: 6}`),
			wantErr: `cluster "db": io.cilium.l4lb.protocol: want a string, got number 6`,
		},

		// Errors: frontends.
		{
			name:    "frontends not a list",
			cluster: l4lbCluster(`{frontends: {vip: "10.1.2.3", port: 1}}`),
			wantErr: `cluster "db": io.cilium.l4lb.frontends: want a list, got a struct`,
		},
		{
			name:    "frontends empty",
			cluster: l4lbCluster(`{frontends: []}`),
			wantErr: `cluster "db": io.cilium.l4lb.frontends: must not be empty`,
		},
		{
			name:    "frontends entry not a struct",
			cluster: l4lbCluster(`{frontends: [{vip: "10.1.2.3", port: 1}, "10.1.2.4:1"]}`),
			wantErr: `cluster "db": io.cilium.l4lb.frontends[1]: want a struct of vip, port, protocol, target_port, got string "10.1.2.4:1"`,
		},
		{
			name:    "frontends entry bad vip",
			cluster: l4lbCluster(`{frontends: [{vip: "10.1.2.3", port: 1}, {vip: "10.1.2", port: 1}]}`),
			wantErr: `cluster "db": io.cilium.l4lb.frontends[1].vip: "10.1.2" is not an IP address`,
		},
		{
			name:    "frontends entry without vip",
			cluster: l4lbCluster(`{frontends: [{port: 1}]}`),
			wantErr: `cluster "db": io.cilium.l4lb.frontends[0].vip: required`,
		},
		{
			name:    "frontends entry without port",
			cluster: l4lbCluster(`{frontends: [{vip: "10.1.2.3"}]}`),
			wantErr: `cluster "db": io.cilium.l4lb.frontends[0].port: required`,
		},
		{
			name:    "frontends entry unknown key",
			cluster: l4lbCluster(`{frontends: [{vip: "10.1.2.3", port: 1, targetPort: 2}]}`),
			wantErr: `cluster "db": io.cilium.l4lb.frontends[0].targetPort: unknown key (known: vip, port, protocol, target_port, portName)`,
		},
		{
			name:    "frontends entry bad protocol",
			cluster: l4lbCluster(`{frontends: [{vip: "10.1.2.3", port: 1, protocol: ICMP}]}`),
			wantErr: `cluster "db": io.cilium.l4lb.frontends[0].protocol: "ICMP" is not a protocol (want TCP or UDP)`,
		},
		{
			name:    "frontends entry target_port out of range",
			cluster: l4lbCluster(`{frontends: [{vip: "10.1.2.3", port: 1}, {vip: "10.1.2.3", port: 2, target_port: 65536}]}`),
			wantErr: `cluster "db": io.cilium.l4lb.frontends[1].target_port: 65536 is out of range 1..65535`,
		},
		{
			name:    "target_port outside frontends",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 1, target_port: 2}`),
			wantErr: `cluster "db": io.cilium.l4lb.target_port: unknown key ` + known,
		},
		{
			name:    "duplicate frontends",
			cluster: l4lbCluster(`{frontends: [{vip: "10.1.2.3", port: 53, protocol: UDP}, {vip: "10.1.2.3", port: 53}, {vip: "10.1.2.3", port: 53, protocol: udp}]}`),
			wantErr: `cluster "db": io.cilium.l4lb.frontends[2]: 10.1.2.3:53/UDP duplicates frontends[0]`,
		},
		{
			name:    "duplicate frontends through an IPv4-mapped address",
			cluster: l4lbCluster(`{frontends: [{vip: "10.1.2.3", port: 80}, {vip: "::ffff:10.1.2.3", port: 80, protocol: TCP}]}`),
			wantErr: `cluster "db": io.cilium.l4lb.frontends[1]: 10.1.2.3:80/TCP duplicates frontends[0]`,
		},

		// Errors: source_ranges.
		{
			name:    "source_ranges not a list",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 1, source_ranges: "10.0.0.0/8"}`),
			wantErr: `cluster "db": io.cilium.l4lb.source_ranges: want a list of CIDR strings, got string "10.0.0.0/8"`,
		},
		{
			name:    "source_ranges bad CIDR",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 1, source_ranges: ["10.0.0.0/8", "10.0.0.0/33"]}`),
			wantErr: `cluster "db": io.cilium.l4lb.source_ranges[1]: "10.0.0.0/33" is not a CIDR`,
		},
		{
			name:    "source_ranges bare address",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 1, source_ranges: ["10.0.0.1"]}`),
			wantErr: `cluster "db": io.cilium.l4lb.source_ranges[0]: "10.0.0.1" is not a CIDR`,
		},
		{
			name:    "source_ranges entry not a string",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 1, source_ranges: [8]}`),
			wantErr: `cluster "db": io.cilium.l4lb.source_ranges[0]: want a string, got number 8`,
		},

		// Errors: session_affinity_timeout.
		{
			name:    "session_affinity_timeout not a duration",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 1, session_affinity_timeout: "3 hours"}`),
			wantErr: `cluster "db": io.cilium.l4lb.session_affinity_timeout: "3 hours" is not a duration (like "3h" or "10800s")`,
		},
		{
			name:    "session_affinity_timeout zero",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 1, session_affinity_timeout: "0s"}`),
			wantErr: `cluster "db": io.cilium.l4lb.session_affinity_timeout: "0s" must be positive`,
		},
		{
			name:    "session_affinity_timeout negative",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 1, session_affinity_timeout: "-1h"}`),
			wantErr: `cluster "db": io.cilium.l4lb.session_affinity_timeout: "-1h" must be positive`,
		},
		{
			name:    "session_affinity_timeout too long",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 1, session_affinity_timeout: "2000000h"}`),
			wantErr: `cluster "db": io.cilium.l4lb.session_affinity_timeout: "2000000h" is too long (at most 1193046h28m15s)`,
		},
		{
			name:    "session_affinity_timeout as a number",
			cluster: l4lbCluster(`{vip: "10.1.2.3", port: 1, session_affinity_timeout: 10800}`),
			wantErr: `cluster "db": io.cilium.l4lb.session_affinity_timeout: want a string, got number 10800`,
		},

		// Errors: cluster type.
		{
			name:    "LOGICAL_DNS",
			cluster: strings.Replace(l4lbCluster(`{vip: "10.1.2.3", port: 1}`), "EDS", "LOGICAL_DNS", 1),
			wantErr: `cluster "db": type: LOGICAL_DNS is not supported (want EDS or STATIC)`,
		},
		{
			name:    "STRICT_DNS",
			cluster: strings.Replace(l4lbCluster(`{vip: "10.1.2.3", port: 1}`), "EDS", "STRICT_DNS", 1),
			wantErr: `cluster "db": type: STRICT_DNS is not supported (want EDS or STATIC)`,
		},
		{
			name:    "ORIGINAL_DST",
			cluster: strings.Replace(l4lbCluster(`{vip: "10.1.2.3", port: 1}`), "EDS", "ORIGINAL_DST", 1),
			wantErr: `cluster "db": type: ORIGINAL_DST is not supported (want EDS or STATIC)`,
		},
		{
			name:    "cluster_type extension",
			cluster: "name: db\ncluster_type: {name: envoy.clusters.aggregate}\nmetadata: {filter_metadata: {io.cilium.l4lb: {vip: 10.1.2.3, port: 1}}}",
			wantErr: `cluster "db": type: cluster_type extension "envoy.clusters.aggregate" is not supported (want EDS or STATIC)`,
		},
		{
			name:    "EDS service name longer than the client takes",
			cluster: "name: db\ntype: EDS\neds_cluster_config: {service_name: " + strings.Repeat("x", 4097) + "}\nmetadata: {filter_metadata: {io.cilium.l4lb: {vip: 10.1.2.3, port: 1}}}",
			wantErr: `cluster "db": eds_cluster_config.service_name: 4097 bytes is longer than 4096`,
		},
		{
			name:    "STATIC without load_assignment (type: EDS forgotten)",
			cluster: "name: db\neds_cluster_config: {service_name: db}\nmetadata: {filter_metadata: {io.cilium.l4lb: {vip: 10.1.2.3, port: 1}}}",
			wantErr: `cluster "db": load_assignment: required for a STATIC cluster (or set type: EDS)`,
		},
		{
			name: "STATIC with a bad inline endpoint",
			cluster: `
name: db
type: STATIC
metadata: {filter_metadata: {io.cilium.l4lb: {vip: 10.1.2.3, port: 5432}}}
load_assignment:
  cluster_name: db
  endpoints:
  - lb_endpoints:
    - endpoint: {address: {socket_address: {address: 10.0.1.1, port_value: 5432}}}
    - endpoint: {address: {socket_address: {address: db-2.example.com, port_value: 5432}}}
`,
			wantErr: `cluster "db": load_assignment.endpoints[0].lb_endpoints[1].endpoint.address.socket_address.address: "db-2.example.com" is not an IP address`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := TranslateCluster(clusterYAML(t, tt.cluster))
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("no error, want %q; got:\n%s", tt.wantErr, specString(spec))
				}
				if err.Error() != tt.wantErr {
					t.Fatalf("error:\ngot:  %s\nwant: %s", err, tt.wantErr)
				}
				var e *Error
				if !errors.As(err, &e) || e.Kind != "cluster" {
					t.Fatalf("error %v is not a cluster *Error", err)
				}
				if spec != nil {
					t.Fatalf("error with a spec: %s", specString(spec))
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got := specString(spec); got != tt.want {
				t.Fatalf("got:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

func TestTranslateClusterNil(t *testing.T) {
	spec, err := TranslateCluster(nil)
	if spec != nil || err != nil {
		t.Fatalf("nil cluster: got %v, %v", spec, err)
	}
}

// cla is a ClusterLoadAssignment "db" with one locality whose lb_endpoints
// are eps (YAML flow sequence entries).
func cla(eps ...string) string {
	return "cluster_name: db\nendpoints:\n- lb_endpoints: [" + strings.Join(eps, ", ") + "]\n"
}

func ep(addr string, port int, extra string) string {
	s := fmt.Sprintf("{endpoint: {address: {socket_address: {address: %q, port_value: %d}}}", addr, port)
	if extra != "" {
		s += ", " + extra
	}
	return s + "}"
}

func TestTranslateEndpoints(t *testing.T) {
	const path = `cluster_load_assignment "db": endpoints[0].lb_endpoints[1]`
	tests := []struct {
		name    string
		cla     string // YAML
		want    string // backendsString
		wantErr string
	}{
		{
			name: "no endpoints",
			cla:  "cluster_name: db",
			want: "",
		},
		{
			name: "weights",
			cla:  cla(ep("10.0.0.1", 80, "load_balancing_weight: 70"), ep("10.0.0.2", 80, "load_balancing_weight: 30"), ep("10.0.0.3", 80, "load_balancing_weight: 65535")),
			want: "backend 10.0.0.1:80 weight=70 active\nbackend 10.0.0.2:80 weight=30 active\nbackend 10.0.0.3:80 weight=65535 active\n",
		},
		{
			name: "health status",
			cla: cla(
				ep("10.0.0.1", 80, "health_status: UNKNOWN"),
				ep("10.0.0.2", 80, "health_status: HEALTHY"),
				ep("10.0.0.3", 80, "health_status: DEGRADED"),
				ep("10.0.0.4", 80, "health_status: DRAINING"),
				ep("10.0.0.5", 80, "health_status: UNHEALTHY"),
				ep("10.0.0.6", 80, "health_status: TIMEOUT"),
			),
			// DEGRADED beside healthy endpoints: Envoy's fallback, not used.
			want: "backend 10.0.0.1:80 weight=1 active\n" +
				"backend 10.0.0.2:80 weight=1 active\n" +
				"backend 10.0.0.3:80 weight=1 maintenance\n" +
				"backend 10.0.0.4:80 weight=1 terminating\n" +
				"backend 10.0.0.5:80 weight=1 quarantined\n" +
				"backend 10.0.0.6:80 weight=1 quarantined\n",
		},
		{
			name: "localities: priority and zone",
			cla: `
cluster_name: db
endpoints:
- locality: {region: eu, zone: eu-a}
  lb_endpoints: [` + ep("10.0.0.1", 80, "") + `]
- locality: {zone: eu-b}
  priority: 1
  lb_endpoints: [` + ep("10.0.0.2", 80, "") + `]
`,
			want: "backend 10.0.0.1:80 weight=1 active zone=eu-a\nbackend 10.0.0.2:80 weight=1 active priority=1 zone=eu-b\n",
		},
		{
			name: "endpoint metadata: zone overrides the locality's, nodeName is kept",
			cla: `
cluster_name: db
endpoints:
- locality: {zone: zone-a}
  lb_endpoints:
  - endpoint: {address: {socket_address: {address: 192.168.1.10, port_value: 5432}}}
    metadata: {filter_metadata: {io.cilium.l4lb: {zone: zone-b, nodeName: node-a}}}
  - endpoint: {address: {socket_address: {address: 192.168.1.11, port_value: 5433}}}
    metadata: {filter_metadata: {envoy.lb: {canary: true}}}
  - endpoint: {address: {socket_address: {address: 192.168.1.12, port_value: 5433}}}
    metadata: {filter_metadata: {io.cilium.l4lb: {nodeName: node-c}}}
`,
			want: "backend 192.168.1.10:5432 weight=1 active zone=zone-b node=node-a\n" +
				"backend 192.168.1.11:5433 weight=1 active zone=zone-a\n" +
				"backend 192.168.1.12:5433 weight=1 active zone=zone-a node=node-c\n",
		},
		{
			name: "endpoint metadata: an empty zone is the locality's",
			cla: `
cluster_name: db
endpoints:
- locality: {zone: zone-a}
  lb_endpoints:
  - endpoint: {address: {socket_address: {address: 192.168.1.10, port_value: 5432}}}
    metadata: {filter_metadata: {io.cilium.l4lb: {zone: "", nodeName: ""}}}
`,
			want: "backend 192.168.1.10:5432 weight=1 active zone=zone-a\n",
		},
		{
			name:    "endpoint metadata: unknown key",
			cla:     cla(ep("10.0.0.1", 80, ""), ep("10.0.0.2", 80, "metadata: {filter_metadata: {io.cilium.l4lb: {node: n1}}}")),
			wantErr: path + `.metadata.filter_metadata.io.cilium.l4lb.node: unknown key (known: zone, nodeName)`,
		},
		{
			name:    "endpoint metadata: zone not a string",
			cla:     cla(ep("10.0.0.1", 80, ""), ep("10.0.0.2", 80, "metadata: {filter_metadata: {io.cilium.l4lb: {zone: 1}}}")),
			wantErr: path + `.metadata.filter_metadata.io.cilium.l4lb.zone: want a string, got number 1`,
		},
		{
			name: "DEGRADED takes new flows when no healthy endpoint is left",
			cla: `
cluster_name: db
endpoints:
- lb_endpoints:
  - ` + ep("10.0.0.1", 80, "health_status: UNHEALTHY") + `
  - ` + ep("10.0.0.2", 80, "health_status: DEGRADED") + `
- priority: 1
  lb_endpoints:
  - ` + ep("10.0.0.3", 80, "health_status: DRAINING") + `
  - ` + ep("10.0.0.4", 80, "health_status: DEGRADED") + `
`,
			want: "backend 10.0.0.1:80 weight=1 quarantined\n" +
				"backend 10.0.0.2:80 weight=1 active\n" +
				"backend 10.0.0.3:80 weight=1 terminating priority=1\n" +
				"backend 10.0.0.4:80 weight=1 active priority=1\n",
		},
		{
			name: "DEGRADED is a fallback after the healthy endpoints of every priority",
			cla: `
cluster_name: db
endpoints:
- lb_endpoints: [` + ep("10.0.0.1", 80, "health_status: DEGRADED") + `]
- priority: 1
  lb_endpoints: [` + ep("10.0.0.2", 80, "health_status: HEALTHY") + `]
`,
			want: "backend 10.0.0.1:80 weight=1 maintenance\nbackend 10.0.0.2:80 weight=1 active priority=1\n",
		},
		{
			name: "DEGRADED is decided per IP family",
			cla:  cla(ep("10.0.0.1", 80, ""), ep("10.0.0.2", 80, "health_status: DEGRADED"), ep("2001:db8::2", 80, "health_status: DEGRADED")),
			want: "backend 10.0.0.1:80 weight=1 active\nbackend 10.0.0.2:80 weight=1 maintenance\nbackend [2001:db8::2]:80 weight=1 active\n",
		},
		{
			name: "IPv6, and the same IP on two ports",
			cla:  cla(ep("2001:db8::10", 53, ""), ep("2001:db8::10", 5353, ""), ep("::ffff:10.0.0.1", 53, "")),
			want: "backend [2001:db8::10]:53 weight=1 active\nbackend [2001:db8::10]:5353 weight=1 active\nbackend 10.0.0.1:53 weight=1 active\n",
		},
		{
			name:    "empty cluster_name",
			cla:     "endpoints: []",
			wantErr: `cluster_load_assignment "": cluster_name: must not be empty`,
		},
		{
			name:    "hostname",
			cla:     cla(ep("10.0.0.1", 80, ""), ep("db-1", 80, "")),
			wantErr: path + `.endpoint.address.socket_address.address: "db-1" is not an IP address`,
		},
		{
			name:    "port missing",
			cla:     cla(ep("10.0.0.1", 80, ""), `{endpoint: {address: {socket_address: {address: 10.0.0.2}}}}`),
			wantErr: path + `.endpoint.address.socket_address.port_value: 0 is out of range 1..65535`,
		},
		{
			name:    "port too large",
			cla:     cla(ep("10.0.0.1", 80, ""), ep("10.0.0.2", 70000, "")),
			wantErr: path + `.endpoint.address.socket_address.port_value: 70000 is out of range 1..65535`,
		},
		{
			name:    "named port",
			cla:     cla(ep("10.0.0.1", 80, ""), `{endpoint: {address: {socket_address: {address: 10.0.0.2, named_port: http}}}}`),
			wantErr: path + `.endpoint.address.socket_address.named_port: named ports are not supported (use port_value)`,
		},
		{
			name:    "pipe",
			cla:     cla(ep("10.0.0.1", 80, ""), `{endpoint: {address: {pipe: {path: /run/db.sock}}}}`),
			wantErr: path + `.endpoint.address.pipe: pipe addresses are not supported (use socket_address)`,
		},
		{
			name:    "envoy internal address",
			cla:     cla(ep("10.0.0.1", 80, ""), `{endpoint: {address: {envoy_internal_address: {server_listener_name: x}}}}`),
			wantErr: path + `.endpoint.address.envoy_internal_address: internal addresses are not supported (use socket_address)`,
		},
		{
			name:    "no address",
			cla:     cla(ep("10.0.0.1", 80, ""), `{endpoint: {hostname: db-2}}`),
			wantErr: path + `.endpoint.address.socket_address: required`,
		},
		{
			name:    "named endpoint",
			cla:     cla(ep("10.0.0.1", 80, ""), `{endpoint_name: db-2}`),
			wantErr: path + `.endpoint_name: named endpoints are not supported (use endpoint)`,
		},
		{
			name:    "weight zero",
			cla:     cla(ep("10.0.0.1", 80, ""), ep("10.0.0.2", 80, "load_balancing_weight: 0")),
			wantErr: path + `.load_balancing_weight: 0 is out of range 1..65535`,
		},
		{
			name:    "weight too large",
			cla:     cla(ep("10.0.0.1", 80, ""), ep("10.0.0.2", 80, "load_balancing_weight: 65536")),
			wantErr: path + `.load_balancing_weight: 65536 is out of range 1..65535`,
		},
		{
			name:    "unknown health status",
			cla:     cla(ep("10.0.0.1", 80, ""), ep("10.0.0.2", 80, "health_status: 42")),
			wantErr: path + `.health_status: 42 is not a known health status`,
		},
		{
			name:    "unspecified address",
			cla:     cla(ep("10.0.0.1", 80, ""), ep("::", 80, "")),
			wantErr: path + `.endpoint.address.socket_address.address: "::" is the unspecified address`,
		},
		{
			name: "same address twice, across localities",
			cla: `
cluster_name: db
endpoints:
- lb_endpoints: [` + ep("10.0.0.1", 80, "") + `]
- priority: 1
  lb_endpoints: [` + ep("10.0.0.2", 80, "") + ", " + ep("10.0.0.1", 80, "") + `]
`,
			wantErr: `cluster_load_assignment "db": endpoints[1].lb_endpoints[1].endpoint.address.socket_address: 10.0.0.1:80 duplicates endpoints[0].lb_endpoints[0]`,
		},
		{
			name:    "LEDS",
			cla:     "cluster_name: db\nendpoints:\n- leds_cluster_locality_config: {leds_collection_name: x}",
			wantErr: `cluster_load_assignment "db": endpoints[0].leds_cluster_locality_config: LEDS is not supported (use lb_endpoints)`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bes, err := TranslateEndpoints(claYAML(t, tt.cla))
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("no error, want %q; got:\n%s", tt.wantErr, backendsString(bes))
				}
				if err.Error() != tt.wantErr {
					t.Fatalf("error:\ngot:  %s\nwant: %s", err, tt.wantErr)
				}
				var e *Error
				if !errors.As(err, &e) || e.Kind != "cluster_load_assignment" {
					t.Fatalf("error %v is not a cluster_load_assignment *Error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			for _, be := range bes {
				if be.Address.Protocol != loadbalancer.ANY {
					t.Errorf("backend %s: protocol %q, want ANY", be.Address, be.Address.Protocol)
				}
			}
			if got := backendsString(bes); got != tt.want {
				t.Fatalf("got:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

// TestTranslatorConfig: the metadata key, namespace and cluster of the
// agent's settings, as the prototype's configuration block sets them.
func TestTranslatorConfig(t *testing.T) {
	tr, err := NewTranslator(Config{XDSMetadataKey: "custom", XDSNamespace: "platform", XDSCluster: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	custom := func(md string) *clusterv3.Cluster {
		return clusterYAML(t, "name: inventory-write\ntype: EDS\nmetadata: {filter_metadata: {custom: "+md+"}}")
	}
	for _, tc := range []struct {
		name    string
		cluster *clusterv3.Cluster
		want    string
	}{{
		name:    "io.cilium.l4lb is no longer ours",
		cluster: clusterYAML(t, l4lbCluster(`{vip: "10.0.20.15", port: 9042}`)),
		want:    "<not ours>",
	}, {
		name:    "the configured namespace and cluster",
		cluster: custom(`{vip: "10.0.20.15", port: 9042, protocol: tcp, service: cassandra}`),
		want:    "service prod/platform/cassandra source=xds cluster=\"prod\" namespace=\"platform\"\nfrontend 10.0.20.15:9042/TCP LoadBalancer svc=prod/platform/cassandra\neds inventory-write\n",
	}, {
		name:    "the metadata's namespace and cluster win",
		cluster: custom(`{vip: "10.0.20.15", port: 9042, namespace: db, cluster: edge}`),
		want:    "service edge/db/inventory-write source=xds cluster=\"edge\" namespace=\"db\"\nfrontend 10.0.20.15:9042/TCP LoadBalancer svc=edge/db/inventory-write\neds inventory-write\n",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := tr.Cluster(tc.cluster)
			if err != nil {
				t.Fatal(err)
			}
			if got := specString(spec); got != tc.want {
				t.Fatalf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}

	bes, err := tr.Endpoints(claYAML(t, `
cluster_name: inventory-write
endpoints:
- locality: {zone: zone-a}
  lb_endpoints:
  - endpoint: {address: {socket_address: {address: 192.168.100.10, port_value: 9042}}}
    metadata: {filter_metadata: {custom: {zone: zone-b, nodeName: node-a}, io.cilium.l4lb: {ignored: true}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := backendsString(bes), "backend 192.168.100.10:9042 weight=1 active zone=zone-b node=node-a\n"; got != want {
		t.Fatalf("endpoints: got %q, want %q", got, want)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{DefaultConfig, ""},
		{Config{XDSMetadataKey: "k", XDSNamespace: "platform", XDSCluster: "prod"}, ""},
		{Config{}, "--xds-metadata-key: must not be empty"},
		{Config{XDSMetadataKey: "k", XDSCluster: "prod"}, `--xds-cluster: "prod" needs a namespace (--xds-namespace)`},
		{Config{XDSMetadataKey: "k", XDSNamespace: "a/b"}, `--xds-namespace: "a/b" contains a slash or a NUL byte`},
	} {
		err := tc.cfg.Validate()
		if got := fmt.Sprint(err); (tc.want == "" && err != nil) || (tc.want != "" && got != tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.cfg, err, tc.want)
		}
		if _, err := NewTranslator(tc.cfg); (err == nil) != (tc.want == "") {
			t.Errorf("%+v: NewTranslator error %v", tc.cfg, err)
		}
	}
}
