// SPDX-License-Identifier: Apache-2.0

package l4lb

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"

	"github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
)

// fakeNames records the EDS names the controller requests.
type fakeNames struct {
	calls int
	names []string
}

func (f *fakeNames) SetNames(typeURL string, names []string) {
	if typeURL != xds.EndpointType {
		panic("SetNames for " + typeURL)
	}
	f.calls++
	f.names = slices.Clone(names)
}

type fixture struct {
	t     *testing.T
	w     *loadbalancer.Writer
	names *fakeNames
	ctrl  *Controller
}

func newFixture(t *testing.T) *fixture {
	return newFixtureWith(t, func(s Sink) Sink { return s })
}

// newFixtureWith is newFixture with the tables' sink wrapped.
func newFixtureWith(t *testing.T, wrap func(Sink) Sink) *fixture {
	db := statedb.New()
	w, err := loadbalancer.NewWriter(db)
	if err != nil {
		t.Fatal(err)
	}
	names := &fakeNames{}
	return &fixture{t: t, w: w, names: names, ctrl: NewController(wrap(NewTablesSink(w)), names)}
}

func resource(m proto.Message) xds.Resource {
	switch m := m.(type) {
	case *clusterv3.Cluster:
		return xds.Resource{Name: m.GetName(), Version: "1", Message: m}
	case *endpointv3.ClusterLoadAssignment:
		return xds.Resource{Name: m.GetClusterName(), Version: "1", Message: m}
	}
	panic(fmt.Sprintf("%T", m))
}

// cds applies a CDS update of clusters (YAML) and returns the rejections.
func (f *fixture) cds(removed []string, clusters ...string) map[string]error {
	f.t.Helper()
	u := xds.Update{TypeURL: xds.ClusterType, Removed: removed}
	for _, c := range clusters {
		u.Upserted = append(u.Upserted, resource(clusterYAML(f.t, c)))
	}
	return f.ctrl.HandleClusters(context.Background(), u)
}

// eds applies an EDS update of CLAs (YAML) and returns the rejections.
func (f *fixture) eds(removed []string, clas ...string) map[string]error {
	f.t.Helper()
	u := xds.Update{TypeURL: xds.EndpointType, Removed: removed}
	for _, c := range clas {
		u.Upserted = append(u.Upserted, resource(claYAML(f.t, c)))
	}
	return f.ctrl.HandleEndpoints(context.Background(), u)
}

// dump prints the three tables, one row a line.
func (f *fixture) dump() string {
	txn := f.w.ReadTxn()
	var b strings.Builder
	for svc := range f.w.Services().All(txn) {
		fmt.Fprintf(&b, "service %s source=%s", svc.Name, svc.Source)
		if len(svc.SourceRanges) > 0 {
			fmt.Fprintf(&b, " ranges=%v", svc.SourceRanges)
		}
		if svc.SessionAffinity {
			fmt.Fprintf(&b, " affinity=%s", svc.SessionAffinityTimeout)
		}
		b.WriteString("\n")
	}
	for fe := range f.w.Frontends().All(txn) {
		var bes []string
		for _, be := range fe.Backends {
			s := be.Address.String()
			if be.State != loadbalancer.BackendStateActive {
				s += "/" + be.State.String()
			}
			bes = append(bes, s)
		}
		fmt.Fprintf(&b, "frontend %s %s -> [%s]\n", fe.Address, fe.ServiceName, strings.Join(bes, " "))
	}
	for be := range f.w.Backends().All(txn) {
		fmt.Fprintf(&b, "backend %s %s weight=%d %s", be.ServiceName, be.Address, be.Weight, be.State)
		if be.Priority != 0 {
			fmt.Fprintf(&b, " priority=%d", be.Priority)
		}
		if be.Zone != "" {
			fmt.Fprintf(&b, " zone=%s", be.Zone)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func (f *fixture) expect(want string) {
	f.t.Helper()
	want = strings.TrimLeft(dedent(want), "\n")
	if got := f.dump(); got != want {
		f.t.Fatalf("tables:\n%s\nwant:\n%s", got, want)
	}
}

func dedent(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimLeft(l, "\t")
	}
	return strings.Join(lines, "\n")
}

func (f *fixture) expectNames(want ...string) {
	f.t.Helper()
	if want == nil {
		want = []string{}
	}
	if !slices.Equal(f.names.names, want) || f.names.calls == 0 {
		f.t.Fatalf("requested EDS names %q (%d calls), want %q", f.names.names, f.names.calls, want)
	}
}

func (f *fixture) initialized() bool {
	init, _ := f.w.Services().Initialized(f.w.ReadTxn())
	return init
}

func noRejections(t *testing.T, rejected map[string]error) {
	t.Helper()
	if len(rejected) > 0 {
		t.Fatalf("unexpected rejections: %v", rejected)
	}
}

func rejectedWith(t *testing.T, rejected map[string]error, want map[string]string) {
	t.Helper()
	if len(rejected) != len(want) {
		t.Fatalf("rejected %v, want %v", rejected, want)
	}
	for name, msg := range want {
		if err := rejected[name]; err == nil || err.Error() != msg {
			t.Fatalf("rejection of %q:\ngot:  %v\nwant: %s", name, err, msg)
		}
	}
}

// edsCluster is an EDS cluster with the given io.cilium.l4lb metadata
// (a YAML flow mapping) and CLA name.
func edsCluster(name, meta, claName string) string {
	s := fmt.Sprintf("name: %s\ntype: EDS\nmetadata: {filter_metadata: {io.cilium.l4lb: %s}}\n", name, meta)
	if claName != "" {
		s += "eds_cluster_config: {service_name: " + claName + "}\n"
	}
	return s
}

// claOf is a CLA named name with the endpoints eps (flow entries of ep()).
func claOf(name string, eps ...string) string {
	return "cluster_name: " + name + "\nendpoints:\n- lb_endpoints: [" + strings.Join(eps, ", ") + "]\n"
}

func TestControllerCFPExample(t *testing.T) {
	f := newFixture(t)
	msgs := loadResources(t, "testdata/cfp.yaml")

	noRejections(t, f.ctrl.HandleClusters(context.Background(), xds.Update{
		TypeURL: xds.ClusterType, Upserted: []xds.Resource{resource(msgs[0])},
	}))
	f.expectNames("my-database-service")
	f.expect(`
		service my-database-service source=xds
		frontend 10.1.2.3:3306/TCP my-database-service -> []
	`)
	if f.initialized() {
		t.Fatal("initialized before the requested CLA arrived")
	}

	noRejections(t, f.ctrl.HandleEndpoints(context.Background(), xds.Update{
		TypeURL: xds.EndpointType, Upserted: []xds.Resource{resource(msgs[1])},
	}))
	f.expect(`
		service my-database-service source=xds
		frontend 10.1.2.3:3306/TCP my-database-service -> [192.168.1.10:3306 192.168.1.11:3306]
		backend my-database-service 192.168.1.10:3306 weight=1 active
		backend my-database-service 192.168.1.11:3306 weight=1 active
	`)
	if !f.initialized() {
		t.Fatal("not initialized after the first full state")
	}
}

func TestControllerMixedDNS(t *testing.T) {
	f := newFixture(t)
	noRejections(t, f.cds(nil, edsCluster("dns",
		`{frontends: [{vip: 10.0.0.53, port: 53, protocol: UDP}, {vip: 10.0.0.53, port: 53, protocol: TCP}, {vip: "fd00::53", port: 53, protocol: UDP}]}`, "")))
	noRejections(t, f.eds(nil, claOf("dns", ep("10.1.0.1", 53, ""), ep("10.1.0.2", 53, ""))))
	f.expect(`
		service dns source=xds
		frontend 10.0.0.53:53/TCP dns -> [10.1.0.1:53 10.1.0.2:53]
		frontend 10.0.0.53:53/UDP dns -> [10.1.0.1:53 10.1.0.2:53]
		frontend [fd00::53]:53/UDP dns -> [10.1.0.1:53 10.1.0.2:53]
		backend dns 10.1.0.1:53 weight=1 active
		backend dns 10.1.0.2:53 weight=1 active
	`)
}

func TestControllerIPv6(t *testing.T) {
	f := newFixture(t)
	noRejections(t, f.cds(nil, edsCluster("web",
		`{frontends: [{vip: "2001:db8::80", port: 80, target_port: 8080}], source_ranges: ["2001:db8::/32"], session_affinity_timeout: 3h}`, "web-v6")))
	noRejections(t, f.eds(nil, claOf("web-v6", ep("fd00::1", 80, ""), ep("fd00::2", 80, "health_status: HEALTHY"))))
	f.expectNames("web-v6")
	f.expect(`
		service web source=xds ranges=[2001:db8::/32] affinity=3h0m0s
		frontend [2001:db8::80]:80/TCP web -> [[fd00::1]:8080 [fd00::2]:8080]
		backend web [fd00::1]:80 weight=1 active
		backend web [fd00::2]:80 weight=1 active
	`)
}

func TestControllerEndpointLifecycle(t *testing.T) {
	f := newFixture(t)
	noRejections(t, f.cds(nil, edsCluster("db", `{vip: 10.1.2.3, port: 3306}`, "")))

	// Added.
	noRejections(t, f.eds(nil, claOf("db", ep("10.0.0.1", 3306, ""))))
	noRejections(t, f.eds(nil, claOf("db", ep("10.0.0.1", 3306, ""), ep("10.0.0.2", 3306, ""))))
	f.expect(`
		service db source=xds
		frontend 10.1.2.3:3306/TCP db -> [10.0.0.1:3306 10.0.0.2:3306]
		backend db 10.0.0.1:3306 weight=1 active
		backend db 10.0.0.2:3306 weight=1 active
	`)

	// Weight changed, one draining, in another zone at priority 1.
	noRejections(t, f.eds(nil, `
cluster_name: db
endpoints:
- lb_endpoints: [`+ep("10.0.0.1", 3306, "load_balancing_weight: 70")+`, `+ep("10.0.0.2", 3306, "health_status: DRAINING")+`]
- {priority: 1, locality: {zone: b}, lb_endpoints: [`+ep("10.0.0.3", 3306, "health_status: UNHEALTHY")+`]}
`))
	f.expect(`
		service db source=xds
		frontend 10.1.2.3:3306/TCP db -> [10.0.0.1:3306 10.0.0.2:3306/terminating 10.0.0.3:3306/quarantined]
		backend db 10.0.0.1:3306 weight=70 active
		backend db 10.0.0.2:3306 weight=1 terminating
		backend db 10.0.0.3:3306 weight=1 quarantined priority=1 zone=b
	`)

	// One removed from the CLA.
	noRejections(t, f.eds(nil, claOf("db", ep("10.0.0.1", 3306, "load_balancing_weight: 70"))))
	f.expect(`
		service db source=xds
		frontend 10.1.2.3:3306/TCP db -> [10.0.0.1:3306]
		backend db 10.0.0.1:3306 weight=70 active
	`)

	// A malformed CLA keeps the previous backends.
	rejectedWith(t, f.eds(nil, claOf("db", ep("10.0.0.1", 3306, ""), ep("db-2", 3306, ""))), map[string]string{
		"db": `cluster_load_assignment "db": endpoints[0].lb_endpoints[1].endpoint.address.socket_address.address: "db-2" is not an IP address`,
	})
	f.expect(`
		service db source=xds
		frontend 10.1.2.3:3306/TCP db -> [10.0.0.1:3306]
		backend db 10.0.0.1:3306 weight=70 active
	`)

	// The CLA does not exist any more: no backends, the service stays.
	noRejections(t, f.eds([]string{"db"}))
	f.expect(`
		service db source=xds
		frontend 10.1.2.3:3306/TCP db -> []
	`)
}

func TestControllerClusterRemoved(t *testing.T) {
	f := newFixture(t)
	noRejections(t, f.cds(nil,
		edsCluster("db", `{vip: 10.1.2.3, port: 3306}`, ""),
		edsCluster("web", `{vip: 10.1.2.4, port: 80}`, ""),
	))
	noRejections(t, f.eds(nil, claOf("db", ep("10.0.0.1", 3306, "")), claOf("web", ep("10.0.0.2", 80, ""))))
	f.expectNames("db", "web")

	noRejections(t, f.cds([]string{"db"}))
	f.expectNames("web")
	f.expect(`
		service web source=xds
		frontend 10.1.2.4:80/TCP web -> [10.0.0.2:80]
		backend web 10.0.0.2:80 weight=1 active
	`)

	noRejections(t, f.cds([]string{"web", "never-seen"}))
	f.expectNames()
	f.expect(``)
}

func TestControllerVIPRenamed(t *testing.T) {
	f := newFixture(t)
	noRejections(t, f.cds(nil, edsCluster("db", `{vip: 10.1.2.3, port: 3306}`, "")))
	noRejections(t, f.eds(nil, claOf("db", ep("10.0.0.1", 3306, ""))))
	noRejections(t, f.cds(nil, edsCluster("db", `{vip: 10.1.2.99, port: 3307, protocol: UDP}`, "")))
	f.expect(`
		service db source=xds
		frontend 10.1.2.99:3307/UDP db -> [10.0.0.1:3306]
		backend db 10.0.0.1:3306 weight=1 active
	`)
	// The name did not change: no new request.
	if f.names.calls != 1 {
		t.Fatalf("SetNames called %d times, want 1", f.names.calls)
	}
}

func TestControllerOneMalformedAmongMany(t *testing.T) {
	f := newFixture(t)
	var clusters []string
	for i := range 100 {
		clusters = append(clusters, edsCluster(fmt.Sprintf("svc-%03d", i), fmt.Sprintf(`{vip: 10.1.0.%d, port: 80}`, i+1), ""))
	}
	bad := edsCluster("bad", `{vip: 10.1.1.1, port: 70000}`, "")
	rejectedWith(t, f.cds(nil, append(clusters, bad)...), map[string]string{
		"bad": `cluster "bad": io.cilium.l4lb.port: 70000 is out of range 1..65535`,
	})
	txn := f.w.ReadTxn()
	if n := f.w.Services().NumObjects(txn); n != 100 {
		t.Fatalf("%d services, want 100", n)
	}
	if n := f.w.Frontends().NumObjects(txn); n != 100 {
		t.Fatalf("%d frontends, want 100", n)
	}
	if len(f.names.names) != 100 || slices.Contains(f.names.names, "bad") {
		t.Fatalf("requested %d EDS names (bad among them: %v)", len(f.names.names), slices.Contains(f.names.names, "bad"))
	}

	// A good cluster turning bad keeps its previous version.
	rejectedWith(t, f.cds(nil, edsCluster("svc-007", `{vip: 10.1.0.8, port: 80, prot: UDP}`, "")), map[string]string{
		"svc-007": `cluster "svc-007": io.cilium.l4lb.prot: unknown key (known: vip, port, protocol, frontends, source_ranges, session_affinity_timeout, reject_weight, service, namespace, cluster, portName, labels)`,
	})
	fe, _, found := f.w.Frontends().Get(f.w.ReadTxn(), loadbalancer.FrontendByAddress.Query(
		loadbalancer.L3n4Addr{Addr: mustAddr("10.1.0.8"), Port: 80, Protocol: loadbalancer.TCP}))
	if !found || fe.ServiceName != "svc-007" {
		t.Fatalf("svc-007 lost its frontend: %v", fe)
	}
	if len(f.names.names) != 100 {
		t.Fatalf("requested %d EDS names, want 100", len(f.names.names))
	}
}

func TestControllerConflict(t *testing.T) {
	f := newFixture(t)
	// In one update: the first keeps the VIP.
	rejectedWith(t, f.cds(nil,
		edsCluster("a", `{vip: 10.1.2.3, port: 3306}`, ""),
		edsCluster("b", `{frontends: [{vip: 10.1.2.4, port: 3306}, {vip: 10.1.2.3, port: 3306}]}`, ""),
	), map[string]string{
		"b": `cluster "b": frontend 10.1.2.3:3306/TCP is owned by service "a": frontend already owned by another service`,
	})
	f.expectNames("a")
	f.expect(`
		service a source=xds
		frontend 10.1.2.3:3306/TCP a -> []
	`)

	// In a later update: the owner still keeps it, and the loser keeps its
	// previous version.
	noRejections(t, f.cds(nil, edsCluster("b", `{vip: 10.1.2.4, port: 3306}`, "")))
	noRejections(t, f.eds(nil, claOf("b", ep("10.0.0.2", 3306, ""))))
	rejectedWith(t, f.cds(nil, edsCluster("b", `{vip: 10.1.2.3, port: 3306}`, "")), map[string]string{
		"b": `cluster "b": frontend 10.1.2.3:3306/TCP is owned by service "a": frontend already owned by another service`,
	})
	f.expect(`
		service a source=xds
		service b source=xds
		frontend 10.1.2.3:3306/TCP a -> []
		frontend 10.1.2.4:3306/TCP b -> [10.0.0.2:3306]
		backend b 10.0.0.2:3306 weight=1 active
	`)

	// Once the owner lets go, the other may take it.
	noRejections(t, f.cds([]string{"a"}, edsCluster("b", `{vip: 10.1.2.3, port: 3306}`, "")))
	f.expect(`
		service b source=xds
		frontend 10.1.2.3:3306/TCP b -> [10.0.0.2:3306]
		backend b 10.0.0.2:3306 weight=1 active
	`)
}

func TestControllerNotOurs(t *testing.T) {
	f := newFixture(t)
	noRejections(t, f.cds(nil,
		"name: envoy-only\ntype: STRICT_DNS",
		"name: envoy-eds\ntype: EDS",
	))
	f.expect(``)
	f.expectNames()
	noRejections(t, f.cds([]string{"envoy-only"}))
}

func TestControllerLosingMetadata(t *testing.T) {
	f := newFixture(t)
	noRejections(t, f.cds(nil, edsCluster("db", `{vip: 10.1.2.3, port: 3306}`, "")))
	noRejections(t, f.eds(nil, claOf("db", ep("10.0.0.1", 3306, ""))))
	f.expectNames("db")

	noRejections(t, f.cds(nil, "name: db\ntype: EDS"))
	f.expect(``)
	f.expectNames()

	// And regaining it: the CLA is requested again, and its backends come
	// with the server's answer, not from a copy that may be stale.
	noRejections(t, f.cds(nil, edsCluster("db", `{vip: 10.1.2.3, port: 3306}`, "")))
	f.expectNames("db")
	f.expect(`
		service db source=xds
		frontend 10.1.2.3:3306/TCP db -> []
	`)
	noRejections(t, f.eds(nil, claOf("db", ep("10.0.0.1", 3306, ""))))
	f.expect(`
		service db source=xds
		frontend 10.1.2.3:3306/TCP db -> [10.0.0.1:3306]
		backend db 10.0.0.1:3306 weight=1 active
	`)
}

func TestControllerEDSNameChanges(t *testing.T) {
	f := newFixture(t)
	noRejections(t, f.cds(nil,
		edsCluster("db", `{vip: 10.1.2.3, port: 3306}`, "db-v1"),
		edsCluster("db-next", `{vip: 10.1.2.4, port: 3306}`, "db-v2"),
	))
	noRejections(t, f.eds(nil,
		claOf("db-v1", ep("10.0.1.1", 3306, "")),
		claOf("db-v2", ep("10.0.2.1", 3306, "")),
	))
	f.expectNames("db-v1", "db-v2")

	// To a CLA another cluster uses: its backends at once.
	noRejections(t, f.cds(nil,
		edsCluster("db", `{vip: 10.1.2.3, port: 3306}`, "db-v2"),
		edsCluster("db-next", `{vip: 10.1.2.4, port: 3306}`, "db-v2"),
	))
	f.expectNames("db-v2")
	f.expect(`
		service db source=xds
		service db-next source=xds
		frontend 10.1.2.3:3306/TCP db -> [10.0.2.1:3306]
		frontend 10.1.2.4:3306/TCP db-next -> [10.0.2.1:3306]
		backend db 10.0.2.1:3306 weight=1 active
		backend db-next 10.0.2.1:3306 weight=1 active
	`)

	// To one nobody requests any more (db-v1 was forgotten with its last
	// user): no backends until the server sends it again, never the stale
	// ones.
	noRejections(t, f.cds(nil,
		edsCluster("db", `{vip: 10.1.2.3, port: 3306}`, "db-v1"),
		edsCluster("db-next", `{vip: 10.1.2.4, port: 3306}`, "db-v2"),
	))
	f.expectNames("db-v1", "db-v2")
	f.expect(`
		service db source=xds
		service db-next source=xds
		frontend 10.1.2.3:3306/TCP db -> []
		frontend 10.1.2.4:3306/TCP db-next -> [10.0.2.1:3306]
		backend db-next 10.0.2.1:3306 weight=1 active
	`)
	noRejections(t, f.eds(nil, claOf("db-v1", ep("10.0.1.2", 3306, ""))))
	f.expect(`
		service db source=xds
		service db-next source=xds
		frontend 10.1.2.3:3306/TCP db -> [10.0.1.2:3306]
		frontend 10.1.2.4:3306/TCP db-next -> [10.0.2.1:3306]
		backend db 10.0.1.2:3306 weight=1 active
		backend db-next 10.0.2.1:3306 weight=1 active
	`)
}

func TestControllerSharedCLA(t *testing.T) {
	f := newFixture(t)
	noRejections(t, f.cds(nil,
		edsCluster("db-tcp", `{vip: 10.1.2.3, port: 3306}`, "db"),
		edsCluster("db-admin", `{vip: 10.1.2.4, port: 33062}`, "db"),
	))
	f.expectNames("db")
	noRejections(t, f.eds(nil, claOf("db", ep("10.0.0.1", 3306, ""))))
	f.expect(`
		service db-admin source=xds
		service db-tcp source=xds
		frontend 10.1.2.3:3306/TCP db-tcp -> [10.0.0.1:3306]
		frontend 10.1.2.4:33062/TCP db-admin -> [10.0.0.1:3306]
		backend db-admin 10.0.0.1:3306 weight=1 active
		backend db-tcp 10.0.0.1:3306 weight=1 active
	`)
	noRejections(t, f.cds([]string{"db-tcp"}))
	f.expectNames("db")
	noRejections(t, f.eds(nil, claOf("db", ep("10.0.0.9", 3306, ""))))
	f.expect(`
		service db-admin source=xds
		frontend 10.1.2.4:33062/TCP db-admin -> [10.0.0.9:3306]
		backend db-admin 10.0.0.9:3306 weight=1 active
	`)
}

func TestControllerStatic(t *testing.T) {
	f := newFixture(t)
	noRejections(t, f.cds(nil, `
name: db
type: STATIC
metadata: {filter_metadata: {io.cilium.l4lb: {vip: 10.1.2.3, port: 3306}}}
load_assignment:
  cluster_name: db
  endpoints:
  - lb_endpoints: [`+ep("10.0.0.1", 3306, "")+`]
`))
	f.expectNames()
	if !f.initialized() {
		t.Fatal("not initialized after a CDS update that needs no CLA")
	}
	f.expect(`
		service db source=xds
		frontend 10.1.2.3:3306/TCP db -> [10.0.0.1:3306]
		backend db 10.0.0.1:3306 weight=1 active
	`)

	// From STATIC to EDS: the inline backends go until the CLA comes.
	noRejections(t, f.cds(nil, edsCluster("db", `{vip: 10.1.2.3, port: 3306}`, "")))
	f.expectNames("db")
	f.expect(`
		service db source=xds
		frontend 10.1.2.3:3306/TCP db -> []
	`)
	noRejections(t, f.eds(nil, claOf("db", ep("10.0.0.2", 3306, ""))))
	f.expect(`
		service db source=xds
		frontend 10.1.2.3:3306/TCP db -> [10.0.0.2:3306]
		backend db 10.0.0.2:3306 weight=1 active
	`)
}

func TestControllerInitialization(t *testing.T) {
	t.Run("empty first CDS response", func(t *testing.T) {
		f := newFixture(t)
		if f.initialized() {
			t.Fatal("initialized before anything arrived")
		}
		f.ctrl.ClustersSynced()
		if !f.initialized() {
			t.Fatal("not initialized after an empty CDS response")
		}
		f.expectNames()
	})

	t.Run("waits for every requested CLA", func(t *testing.T) {
		f := newFixture(t)
		// A CLA before any cluster does not initialize.
		noRejections(t, f.eds(nil, claOf("a", ep("10.0.0.1", 80, ""))))
		if f.initialized() {
			t.Fatal("initialized before CDS")
		}
		noRejections(t, f.cds(nil,
			edsCluster("a", `{vip: 10.1.2.1, port: 80}`, ""),
			edsCluster("b", `{vip: 10.1.2.2, port: 80}`, ""),
			edsCluster("c", `{vip: 10.1.2.3, port: 80}`, ""),
		))
		f.ctrl.ClustersSynced()
		if f.initialized() {
			t.Fatal("initialized with b and c outstanding")
		}
		// A rejected CLA is an answer too.
		rejectedWith(t, f.eds(nil, claOf("b", ep("b-1", 80, ""))), map[string]string{
			"b": `cluster_load_assignment "b": endpoints[0].lb_endpoints[0].endpoint.address.socket_address.address: "b-1" is not an IP address`,
		})
		if f.initialized() {
			t.Fatal("initialized with c outstanding")
		}
		// So is one that does not exist.
		noRejections(t, f.eds([]string{"c"}))
		if !f.initialized() {
			t.Fatal("not initialized after every CLA was answered")
		}
	})

	t.Run("a CLA rejected for its cluster_name is an answer", func(t *testing.T) {
		f := newFixture(t)
		noRejections(t, f.cds(nil, edsCluster("a", `{vip: 10.1.2.1, port: 80}`, "")))
		rej := f.ctrl.HandleEndpoints(context.Background(), xds.Update{
			TypeURL:  xds.EndpointType,
			Upserted: []xds.Resource{{Name: "a", Message: claYAML(t, claOf("b", ep("10.0.0.1", 80, "")))}},
		})
		rejectedWith(t, rej, map[string]string{"a": `cluster_load_assignment "a": cluster_name: "b" differs from the resource name`})
		if !f.initialized() {
			t.Fatal("not initialized after the only requested CLA was answered")
		}
	})

	t.Run("a name dropped before it arrived", func(t *testing.T) {
		f := newFixture(t)
		noRejections(t, f.cds(nil, edsCluster("a", `{vip: 10.1.2.1, port: 80}`, "")))
		if f.initialized() {
			t.Fatal("initialized with a outstanding")
		}
		noRejections(t, f.cds([]string{"a"}))
		if !f.initialized() {
			t.Fatal("not initialized once no CLA is needed")
		}
	})
}

func TestControllerMismatchedResources(t *testing.T) {
	f := newFixture(t)
	cla := claYAML(t, claOf("db", ep("10.0.0.1", 80, "")))
	rej := f.ctrl.HandleClusters(context.Background(), xds.Update{
		TypeURL: xds.ClusterType, Upserted: []xds.Resource{{Name: "db", Message: cla}},
	})
	if rej["db"] == nil {
		t.Fatal("a ClusterLoadAssignment in a CDS update was accepted")
	}
	rej = f.ctrl.HandleClusters(context.Background(), xds.Update{
		TypeURL: xds.ClusterType, Upserted: []xds.Resource{{Name: "other", Message: clusterYAML(t, edsCluster("db", `{vip: 10.1.2.3, port: 80}`, ""))}},
	})
	rejectedWith(t, rej, map[string]string{"other": `cluster "other": name: "db" differs from the resource name`})
	rej = f.ctrl.HandleEndpoints(context.Background(), xds.Update{
		TypeURL: xds.EndpointType, Upserted: []xds.Resource{{Name: "other", Message: cla}},
	})
	rejectedWith(t, rej, map[string]string{"other": `cluster_load_assignment "other": cluster_name: "db" differs from the resource name`})
	f.expect(``)
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestControllerVIPHandedOverInOneUpdate(t *testing.T) {
	f := newFixture(t)
	noRejections(t, f.cds(nil,
		edsCluster("a", `{vip: 10.1.2.1, port: 80}`, ""),
		edsCluster("b", `{vip: 10.1.2.2, port: 80}`, ""),
	))
	// a takes b's VIP while b moves on, a listed first.
	noRejections(t, f.cds(nil,
		edsCluster("a", `{vip: 10.1.2.2, port: 80}`, ""),
		edsCluster("b", `{vip: 10.1.2.3, port: 80}`, ""),
	))
	f.expect(`
		service a source=xds
		service b source=xds
		frontend 10.1.2.2:80/TCP a -> []
		frontend 10.1.2.3:80/TCP b -> []
	`)
	// A rename: the old cluster is removed and the new one takes its VIP.
	noRejections(t, f.cds([]string{"a"}, edsCluster("a2", `{vip: 10.1.2.2, port: 80}`, "")))
	f.expect(`
		service a2 source=xds
		service b source=xds
		frontend 10.1.2.2:80/TCP a2 -> []
		frontend 10.1.2.3:80/TCP b -> []
	`)
}

// TestControllerServiceNamedTwice: two clusters that name one service
// (metadata service, namespace, cluster) are a conflict, as two clusters
// asking for one VIP are: the later is NACKed, naming both, and the first
// keeps the service. Never one overwriting the other.
func TestControllerServiceNamedTwice(t *testing.T) {
	f := newFixture(t)
	rejectedWith(t, f.cds(nil,
		edsCluster("cassandra-east", `{vip: 10.0.20.15, port: 9042, service: cassandra, namespace: platform}`, ""),
		edsCluster("cassandra-west", `{vip: 10.0.20.16, port: 9042, service: cassandra, namespace: platform}`, ""),
	), map[string]string{
		"cassandra-west": `cluster "cassandra-west": service "platform/cassandra" is already named by cluster "cassandra-east": service already named by another cluster`,
	})
	noRejections(t, f.eds(nil,
		claOf("cassandra-east", ep("192.168.100.10", 9042, "")),
		claOf("cassandra-west", ep("192.168.101.10", 9042, "")),
	))
	f.expectNames("cassandra-east")
	f.expect(`
		service platform/cassandra source=xds
		frontend 10.0.20.15:9042/TCP platform/cassandra -> [192.168.100.10:9042]
		backend platform/cassandra 192.168.100.10:9042 weight=1 active
	`)

	// Another namespace is another service.
	noRejections(t, f.cds(nil, edsCluster("cassandra-west", `{vip: 10.0.20.16, port: 9042, service: cassandra, namespace: platform, cluster: west}`, "")))
	noRejections(t, f.eds(nil, claOf("cassandra-west", ep("192.168.101.10", 9042, ""))))
	f.expect(`
		service platform/cassandra source=xds
		service west/platform/cassandra source=xds
		frontend 10.0.20.15:9042/TCP platform/cassandra -> [192.168.100.10:9042]
		frontend 10.0.20.16:9042/TCP west/platform/cassandra -> [192.168.101.10:9042]
		backend platform/cassandra 192.168.100.10:9042 weight=1 active
		backend west/platform/cassandra 192.168.101.10:9042 weight=1 active
	`)

	// A name the owner gives up in the same update may be taken.
	noRejections(t, f.cds([]string{"cassandra-east"}, edsCluster("cassandra-west", `{vip: 10.0.20.16, port: 9042, service: cassandra, namespace: platform}`, "")))
	f.expect(`
		service platform/cassandra source=xds
		frontend 10.0.20.16:9042/TCP platform/cassandra -> [192.168.101.10:9042]
		backend platform/cassandra 192.168.101.10:9042 weight=1 active
	`)
}

// TestControllerServiceRenamed: a cluster whose metadata names another
// service moves its frontends and backends to the new name; when the new
// name cannot be had, the old service stays as it was.
func TestControllerServiceRenamed(t *testing.T) {
	f := newFixture(t)
	noRejections(t, f.cds(nil,
		edsCluster("db", `{vip: 10.1.2.3, port: 3306, service: mysql}`, ""),
		"name: static\ntype: STATIC\nmetadata: {filter_metadata: {io.cilium.l4lb: {vip: 10.1.2.9, port: 80}}}\nload_assignment: {cluster_name: static, endpoints: [{lb_endpoints: ["+ep("10.0.0.9", 80, "")+"]}]}",
		edsCluster("other", `{vip: 10.1.2.4, port: 3306}`, ""),
	))
	noRejections(t, f.eds(nil, claOf("db", ep("10.0.0.1", 3306, ""))))

	noRejections(t, f.cds(nil,
		edsCluster("db", `{vip: 10.1.2.3, port: 3306, service: mysql, namespace: platform}`, ""),
		"name: static\ntype: STATIC\nmetadata: {filter_metadata: {io.cilium.l4lb: {vip: 10.1.2.9, port: 80, service: web}}}\nload_assignment: {cluster_name: static, endpoints: [{lb_endpoints: ["+ep("10.0.0.9", 80, "")+"]}]}",
	))
	want := `
		service other source=xds
		service platform/mysql source=xds
		service web source=xds
		frontend 10.1.2.3:3306/TCP platform/mysql -> [10.0.0.1:3306]
		frontend 10.1.2.4:3306/TCP other -> []
		frontend 10.1.2.9:80/TCP web -> [10.0.0.9:80]
		backend platform/mysql 10.0.0.1:3306 weight=1 active
		backend web 10.0.0.9:80 weight=1 active
	`
	f.expect(want)

	// The new name also asks for another service's VIP: rejected, and
	// the old name keeps its frontends and backends.
	rejectedWith(t, f.cds(nil, edsCluster("db", `{frontends: [{vip: 10.1.2.3, port: 3306}, {vip: 10.1.2.4, port: 3306}], service: mysql}`, "")), map[string]string{
		"db": `cluster "db": frontend 10.1.2.4:3306/TCP is owned by service "other": frontend already owned by another service`,
	})
	f.expect(want)

	// The CLA still reaches the service under its current name.
	noRejections(t, f.eds(nil, claOf("db", ep("10.0.0.2", 3306, ""))))
	f.expect(strings.ReplaceAll(want, "10.0.0.1:3306", "10.0.0.2:3306"))
}

// TestControllerWithConfig: the prototype's configuration (metadata key,
// namespace, cluster) names the services in the tables, and the endpoint
// metadata under that key sets the zone and the node.
func TestControllerWithConfig(t *testing.T) {
	w, err := loadbalancer.NewWriter(statedb.New())
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, w: w, names: &fakeNames{}}
	f.ctrl, err = NewControllerWith(Config{XDSMetadataKey: "custom", XDSNamespace: "platform", XDSCluster: "prod"}, NewTablesSink(w), f.names)
	if err != nil {
		t.Fatal(err)
	}
	noRejections(t, f.cds(nil,
		"name: inventory-write\ntype: EDS\nmetadata: {filter_metadata: {custom: {vip: 10.0.20.15, port: \"9042\", protocol: tcp, service: cassandra}}}",
		edsCluster("ignored", `{vip: 10.0.20.16, port: 9042}`, ""),
	))
	noRejections(t, f.eds(nil, `
cluster_name: inventory-write
endpoints:
- locality: {zone: zone-a}
  lb_endpoints:
  - endpoint: {address: {socket_address: {address: 192.168.100.10, port_value: 9042}}}
    metadata: {filter_metadata: {custom: {zone: zone-b, nodeName: node-a}}}
  - endpoint: {address: {socket_address: {address: 192.168.101.10, port_value: 9042}}}
`))
	f.expectNames("inventory-write")
	f.expect(`
		service prod/platform/cassandra source=xds
		frontend 10.0.20.15:9042/TCP prod/platform/cassandra -> [192.168.100.10:9042 192.168.101.10:9042]
		backend prod/platform/cassandra 192.168.100.10:9042 weight=1 active zone=zone-b
		backend prod/platform/cassandra 192.168.101.10:9042 weight=1 active zone=zone-a
	`)
	var nodes []string
	for be := range f.w.Backends().All(f.w.ReadTxn()) {
		nodes = append(nodes, be.NodeName)
	}
	if !slices.Equal(nodes, []string{"node-a", ""}) {
		t.Errorf("node names %q, want [node-a \"\"]", nodes)
	}
}
