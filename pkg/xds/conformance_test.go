// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestConformance states, one subtest each, the rules of Envoy's
// xds_protocol and of gRFCs A46, A53, A57 and A71 that apply to a client
// like ours, for SotW and Delta. Each rule drives a real Client by hand:
// requests go to a recording stream, responses are handed to
// handleResponse, timers are fired by calling expire with a chosen time.
// Nothing waits on a clock.
//
// Where we deliberately differ from the rule, the rule says so (differs)
// and Documentation/architecture.md ("xDS conformance") says why.
//
// Rules not in this table, and where they are tested:
//   - Reconnect with backoff, reset once a response arrived (A57):
//     TestStreamClosedAfterEveryResponse, TestBackoffSequence.
//   - A repeated identical NACK is paced, never a loop:
//     TestRepeatedNackPacedWithoutBlocking.
//   - A71's return to a higher server once it delivers again, with real
//     servers: TestFallbackAndReturn (the rules here drive the switch by
//     hand).
func TestConformance(t *testing.T) {
	for _, r := range conformanceRules {
		t.Run(r.name, func(t *testing.T) {
			if r.differs != "" {
				t.Logf("%s; we differ: %s", r.ref, r.differs)
			}
			for _, p := range r.protocols() {
				t.Run(p, func(t *testing.T) { r.test(t, newRuleClient(t, p)) })
			}
		})
	}
}

type conformanceRule struct {
	name string
	// ref is where the rule is stated.
	ref string
	// only limits the rule to one protocol; both when empty.
	only string
	// differs says how we deliberately differ from the rule, if we do.
	differs string
	test    func(t *testing.T, rc *ruleClient)
}

func (r conformanceRule) protocols() []string {
	if r.only != "" {
		return []string{r.only}
	}
	return []string{ProtocolSotW, ProtocolDelta}
}

var conformanceRules = []conformanceRule{
	{
		name: "node is sent in the first request of a stream only",
		ref:  "xds_protocol: Aggregated Discovery Service; only the first request of a stream needs the node",
		test: func(t *testing.T, rc *ruleClient) {
			reqs := rc.sentRequests()
			if len(reqs) == 0 || reqs[0].node.GetId() != "node-1" {
				t.Fatalf("first requests = %+v, want the node in the first", reqs)
			}
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"))
			rc.setNames("a")
			for _, r := range rc.sentRequests()[1:] {
				if r.node != nil {
					t.Errorf("request %+v carries the node again", r)
				}
			}
			// A new stream sends it again.
			rc.reconnect()
			if r := rc.lastRequest(ClusterType); r.node.GetId() != "node-1" {
				t.Errorf("first request of the new stream = %+v, want the node", r)
			}
		},
	},
	{
		name: "a wildcard subscription is the legacy empty list in SotW and an explicit wildcard in Delta",
		ref:  `xds_protocol: "How the client specifies what resources to return"`,
		differs: `SotW sends the legacy empty list, not the explicit "*" xds_protocol also defines: ` +
			`go-control-plane's SnapshotCache takes "*" for a resource name`,
		test: func(t *testing.T, rc *ruleClient) {
			r := rc.lastRequest(ClusterType)
			if rc.delta {
				if !slices.Equal(r.subscribe, []string{"*"}) {
					t.Errorf("Delta wildcard subscribes to %q, want [*]", r.subscribe)
				}
				return
			}
			// go-control-plane's SnapshotCache in ADS mode answers nothing
			// to an explicit "*" (TestInterop holds it to that).
			if r.names != nil {
				t.Errorf("SotW wildcard asks for %q, want the legacy empty list", r.names)
			}
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"))
			if r := rc.lastRequest(ClusterType); r.names != nil {
				t.Errorf("the ACK asks for %q: a name would end the wildcard", r.names)
			}
		},
	},
	{
		name: "a type of names is not requested before it has names",
		ref:  "xds_protocol: an empty first request is a wildcard subscription",
		test: func(t *testing.T, rc *ruleClient) {
			if r := rc.lastRequest(EndpointType); r != nil {
				t.Fatalf("request %+v for a type without names", r)
			}
			rc.setNames("a")
			r := rc.lastRequest(EndpointType)
			if got := slices.Concat(r.names, r.subscribe); !slices.Equal(got, []string{"a"}) {
				t.Errorf("request names %q, want [a]", got)
			}
		},
	},
	{
		name: "unsubscribing from every name is not a wildcard",
		ref:  "xds_protocol: an empty resource_names after the first request unsubscribes from all",
		test: func(t *testing.T, rc *ruleClient) {
			rc.setNames("a")
			rc.respond(EndpointType, "1", nil, rc.cla("a", 0))
			rc.setNames()
			r := rc.lastRequest(EndpointType)
			if rc.delta {
				if len(r.subscribe) != 0 || !slices.Equal(r.unsubscribe, []string{"a"}) {
					t.Errorf("request = %+v, want a unsubscribed", r)
				}
				return
			}
			if len(r.names) != 0 || r.nonce == "" {
				t.Errorf("request = %+v, want no names, with the nonce", r)
			}
		},
	},
	{
		name: "an ACK carries the version and nonce of the response",
		ref:  "xds_protocol: ACK/NACK and resource type instance version",
		test: func(t *testing.T, rc *ruleClient) {
			rc.respond(ClusterType, "v1", nil, rc.cluster("a", "1"))
			r := rc.lastRequest(ClusterType)
			if r.nonce != rc.lastNonce || r.errorDetail != nil {
				t.Errorf("ACK = %+v, want nonce %q, no error_detail", r, rc.lastNonce)
			}
			if !rc.delta && r.version != "v1" {
				t.Errorf("SotW ACK version_info = %q, want v1", r.version)
			}
			if rc.delta && r.version != "" {
				t.Errorf("Delta ACK has a version_info %q", r.version)
			}
		},
	},
	{
		name: "a NACK carries the last accepted version and the nonce and names every rejected resource",
		ref:  "xds_protocol: ACK/NACK; gRFC A46",
		test: func(t *testing.T, rc *ruleClient) {
			rc.respond(ClusterType, "v1", nil, rc.cluster("a", "bad"))
			r := rc.lastRequest(ClusterType)
			if r.errorDetail == nil || r.nonce != rc.lastNonce || r.version != "" {
				t.Errorf("first NACK = %+v, want no version (none accepted) and the nonce", r)
			}
			rc.respond(ClusterType, "v2", nil, rc.cluster("a", "1"), rc.cluster("b", "1"))
			rc.respond(ClusterType, "v3", nil, rc.cluster("a", "bad"), rc.cluster("b", "bad"))
			r = rc.lastRequest(ClusterType)
			want := `cluster "a": ` + badPortError + `; cluster "b": ` + badPortError
			if r.errorDetail.GetMessage() != want || r.nonce != rc.lastNonce {
				t.Errorf("NACK = %+v, want %q", r, want)
			}
			if !rc.delta && r.version != "v2" {
				t.Errorf("SotW NACK version_info = %q, want v2, the last accepted", r.version)
			}
		},
	},
	{
		name: "every SotW request after a response carries its nonce and the accepted version",
		ref:  "xds_protocol: when to send an update; a request without the last nonce is ignored",
		only: ProtocolSotW,
		test: func(t *testing.T, rc *ruleClient) {
			rc.setNames("a")
			rc.respond(EndpointType, "v1", nil, rc.cla("a", 0))
			rc.setNames("a", "b")
			r := rc.lastRequest(EndpointType)
			if r.nonce != rc.lastNonce || r.version != "v1" || !slices.Equal(r.names, []string{"a", "b"}) {
				t.Errorf("names change = %+v, want nonce %q, version v1, names [a b]", r, rc.lastNonce)
			}
		},
	},
	{
		name: "a Delta request sends only the change of names",
		ref:  "xds_protocol: incremental xDS, resource_names_subscribe/unsubscribe",
		only: ProtocolDelta,
		test: func(t *testing.T, rc *ruleClient) {
			rc.setNames("a", "b")
			rc.setNames("b", "c")
			r := rc.lastRequest(EndpointType)
			if !slices.Equal(r.subscribe, []string{"c"}) || !slices.Equal(r.unsubscribe, []string{"a"}) {
				t.Errorf("request = %+v, want c subscribed and a unsubscribed", r)
			}
		},
	},
	{
		name: "a response of a type not subscribed to is ignored",
		ref:  "xds_protocol: ADS; the client answers the types it asked for",
		test: func(t *testing.T, rc *ruleClient) {
			n := len(rc.sentRequests())
			const other = "type.googleapis.com/envoy.config.listener.v3.Listener"
			rc.respond(other, "1", nil, rc.cluster("a", "1"))
			if got := rc.sentRequests()[n:]; len(got) != 0 {
				t.Errorf("answered with %+v", got)
			}
		},
	},
	{
		name: "a resource not subscribed to is ignored",
		ref:  "xds_protocol: the server may send more than asked; the client ignores it",
		test: func(t *testing.T, rc *ruleClient) {
			rc.setNames("a")
			rc.respond(EndpointType, "1", nil, rc.cla("a", 0), rc.cla("z", 9))
			if r := rc.lastRequest(EndpointType); r.errorDetail != nil {
				t.Errorf("NACK %q for a resource not asked for", r.errorDetail.GetMessage())
			}
			if got := rc.eps.state(); len(got) != 1 || got["a"] != "p0" {
				t.Errorf("endpoints = %v, want a only", got)
			}
			if r := rc.resource(EndpointType, "z"); r.State != stateAbsent {
				t.Errorf("z cached: %+v", r)
			}
		},
	},
	{
		name: "in SotW a resource absent from the full state of a wildcard type is deleted",
		ref:  "xds_protocol: SotW, LDS and CDS; gRFC A53",
		only: ProtocolSotW,
		differs: "A53's ignore_resource_deletion server feature is not supported: " +
			"a cluster absent from a full state is deleted (DESIGN.md)",
		test: func(t *testing.T, rc *ruleClient) {
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"), rc.cluster("b", "1"))
			rc.respond(ClusterType, "2", nil, rc.cluster("a", "1"))
			if got := rc.clusters.removedNames(); !slices.Equal(got, []string{"b"}) {
				t.Errorf("removed = %q, want [b]", got)
			}
		},
	},
	{
		name: "in SotW a resource of names absent from a response is not deleted",
		ref:  "xds_protocol: SotW, EDS and RDS",
		only: ProtocolSotW,
		test: func(t *testing.T, rc *ruleClient) {
			rc.setNames("a", "b")
			rc.respond(EndpointType, "1", nil, rc.cla("a", 0), rc.cla("b", 0))
			rc.respond(EndpointType, "2", nil, rc.cla("a", 1))
			if got := rc.eps.removedNames(); len(got) != 0 {
				t.Errorf("removed = %q", got)
			}
			if r := rc.resource(EndpointType, "b"); r.State != StateAcked {
				t.Errorf("b = %+v, want acked", r)
			}
		},
	},
	{
		name: "Delta removed_resources removes a wildcard resource and settles a named one as not existing",
		ref:  "xds_protocol: incremental xDS, removed_resources",
		only: ProtocolDelta,
		test: func(t *testing.T, rc *ruleClient) {
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"), rc.cluster("b", "1"))
			rc.respond(ClusterType, "2", []string{"b"})
			if got := rc.clusters.removedNames(); !slices.Equal(got, []string{"b"}) {
				t.Errorf("removed clusters = %q", got)
			}
			rc.setNames("e1")
			rc.respond(EndpointType, "1", nil, rc.cla("e1", 0))
			rc.respond(EndpointType, "2", []string{"e1"})
			if r := rc.resource(EndpointType, "e1"); r.State != StateDoesNotExist {
				t.Errorf("e1 = %+v, want does-not-exist", r)
			}
			if got := rc.eps.removedNames(); !slices.Equal(got, []string{"e1"}) {
				t.Errorf("removed endpoints = %q", got)
			}
		},
	},
	{
		name: "Delta resources carry their own version",
		ref:  "xds_protocol: incremental xDS, Resource.version",
		only: ProtocolDelta,
		test: func(t *testing.T, rc *ruleClient) {
			rc.respond(ClusterType, "sys-1", nil, rc.cluster("a", "1"))
			if r := rc.resource(ClusterType, "a"); r.Version != "a-1" {
				t.Errorf("a = %+v, want its own version a-1", r)
			}
		},
	},
	{
		name: "a requested resource that never comes does not exist after a timeout",
		ref:  `xds_protocol: "Knowing When a Requested Resource Does Not Exist"; gRFC A57`,
		test: func(t *testing.T, rc *ruleClient) {
			rc.setNames("a", "b")
			sent := time.Now()
			rc.respond(EndpointType, "1", nil, rc.cla("a", 0))
			rc.expire(sent.Add(rc.cfg.XDSResourceDoesNotExistTimeout / 2))
			if r := rc.resource(EndpointType, "b"); r.State != StateRequested {
				t.Fatalf("b before the timeout = %+v", r)
			}
			rc.expire(sent.Add(2 * rc.cfg.XDSResourceDoesNotExistTimeout))
			if r := rc.resource(EndpointType, "b"); r.State != StateDoesNotExist {
				t.Errorf("b after the timeout = %+v, want does-not-exist", r)
			}
			if got := rc.eps.removedNames(); !slices.Equal(got, []string{"b"}) {
				t.Errorf("removed = %q, want [b]", got)
			}
		},
	},
	{
		name: "the does-not-exist timer runs only while a request is on a connected stream",
		ref:  "gRFC A57: the timer starts when the request is sent, and stops while disconnected",
		test: func(t *testing.T, rc *ruleClient) {
			rc.disconnect()
			rc.SetNames(EndpointType, []string{"a"})
			rc.applyWatches() // as the run loop does while it waits to retry
			rc.writeBehind()
			rc.expire(time.Now().Add(time.Hour))
			if r := rc.resource(EndpointType, "a"); r.State != StateRequested {
				t.Fatalf("a while disconnected = %+v, want requested", r)
			}
			rc.connect()
			rc.expire(time.Now().Add(time.Hour))
			if r := rc.resource(EndpointType, "a"); r.State != StateDoesNotExist {
				t.Errorf("a once asked for = %+v, want does-not-exist", r)
			}
		},
	},
	{
		name: "a rejected resource exists and stops the does-not-exist timer",
		ref:  "gRFC A46: the server sent it",
		test: func(t *testing.T, rc *ruleClient) {
			rc.setNames("a")
			rc.respond(EndpointType, "1", nil, rc.cla("a", 9))
			rc.expire(time.Now().Add(time.Hour))
			if r := rc.resource(EndpointType, "a"); r.State != StateNacked || r.Error != badPriorityError {
				t.Errorf("a = %+v, want nacked with its error", r)
			}
		},
	},
	{
		name: "an invalid resource is rejected alone and the others are applied",
		ref:  "gRFC A46",
		test: func(t *testing.T, rc *ruleClient) {
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"), rc.cluster("b", "1"))
			rc.respond(ClusterType, "2", nil, rc.cluster("a", "2"), rc.cluster("b", "bad"), rc.cluster("c", "bad"))
			if got := rc.clusters.state(); !maps.Equal(got, map[string]string{"a": "2", "b": "1"}) {
				t.Errorf("clusters = %v, want a changed, b kept", got)
			}
			if r := rc.resource(ClusterType, "b"); r.State != StateNackedButCached || r.Error != badPortError {
				t.Errorf("b = %+v, want nacked-but-cached", r)
			}
			if r := rc.resource(ClusterType, "c"); r.State != StateNacked {
				t.Errorf("c = %+v, want nacked", r)
			}
		},
	},
	{
		name: "a response naming one resource twice is NACKed and its first instance applied",
		ref:  `Envoy: "duplicate cluster ... found"; gRFC A46 for the rest of the response`,
		differs: `Envoy's Delta subscription rejects such a response whole ("duplicate name ... found ` +
			`among added/updated resources"); we apply the first instance in Delta too, as Envoy's CDS ` +
			"does in SotW, so that one bad resource costs that resource only (A46)",
		test: func(t *testing.T, rc *ruleClient) {
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"), rc.cluster("b", "1"))
			n := rc.clusters.count()
			rc.respond(ClusterType, "2", nil,
				rc.cluster("a", "2"), rc.cluster("c", "1"), rc.cluster("a", "3"), rc.cluster("b", "1"))
			r := rc.lastRequest(ClusterType)
			want := `cluster "a": resources[2]: duplicate of resources[0], the one applied`
			if r.errorDetail.GetMessage() != want {
				t.Errorf("NACK = %q, want %q", r.errorDetail.GetMessage(), want)
			}
			if !rc.delta && r.version != "1" {
				t.Errorf("NACK version_info = %q, want 1, the last accepted", r.version)
			}
			// The rest of the response is applied as a response with one bad
			// resource is: a's first instance and c. The handler sees a once.
			if got := rc.clusters.state(); !maps.Equal(got, map[string]string{"a": "2", "b": "1", "c": "1"}) {
				t.Errorf("clusters = %v, want a=2 (the first instance), b, c", got)
			}
			if u := rc.clusters.all()[n:]; len(u) != 1 || !slices.Equal(names(u[0].Upserted), []string{"a", "c"}) {
				t.Errorf("updates = %+v, want one with a and c", u)
			}
			if r := rc.resource(ClusterType, "a"); r.State != StateAcked {
				t.Errorf("a = %+v, want acked: its first instance is valid", r)
			}
			// The same response again changes nothing and NACKs again (held
			// back as every repeated NACK is).
			rc.respond(ClusterType, "2", nil,
				rc.cluster("a", "2"), rc.cluster("c", "1"), rc.cluster("a", "3"), rc.cluster("b", "1"))
			if got := rc.clusters.count(); got != n+1 {
				t.Errorf("%d updates, want no new one", got-n-1)
			}
		},
	},
	{
		name: "a Delta response that sends and removes one name is NACKed and the name sent applied",
		ref:  "xds_protocol: incremental xDS; the same model as a duplicate resource",
		only: ProtocolDelta,
		differs: `Envoy's Delta subscription rejects such a response whole ("duplicate name ... ` +
			`found in the union of added+removed resources"); we apply the name sent, as with a duplicate`,
		test: func(t *testing.T, rc *ruleClient) {
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"), rc.cluster("b", "1"))
			rc.respond(ClusterType, "2", []string{"b", "a", "b"}, rc.cluster("a", "2"))
			r := rc.lastRequest(ClusterType)
			want := `cluster "a": removed_resources[1]: also in resources[0], the one applied`
			if r.errorDetail.GetMessage() != want {
				t.Errorf("NACK = %q, want %q", r.errorDetail.GetMessage(), want)
			}
			// b removed twice is removed once.
			if got := rc.clusters.state(); !maps.Equal(got, map[string]string{"a": "2"}) {
				t.Errorf("clusters = %v, want a=2 only", got)
			}
			if got := rc.clusters.removedNames(); !slices.Equal(got, []string{"b"}) {
				t.Errorf("removed = %q, want [b]", got)
			}
			if r := rc.resource(ClusterType, "a"); r.State != StateAcked || r.Version != "a-2" {
				t.Errorf("a = %+v, want acked at a-2", r)
			}
		},
	},
	{
		name: "a resource without a name is NACKed and stops the deletion of absent resources",
		ref:  "gRFC A46: when a name cannot be known, nothing is deleted",
		only: ProtocolSotW,
		test: func(t *testing.T, rc *ruleClient) {
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"), rc.cluster("b", "1"))
			rc.respond(ClusterType, "2", nil, rc.cluster("a", "2"), rawResource{any: &anypb.Any{TypeUrl: ClusterType, Value: []byte{0xff}}})
			r := rc.lastRequest(ClusterType)
			if msg := r.errorDetail.GetMessage(); !strings.HasPrefix(msg, "cluster #1: cannot decode ") {
				t.Errorf("NACK = %q", msg)
			}
			if got := rc.clusters.state(); !maps.Equal(got, map[string]string{"a": "2", "b": "1"}) {
				t.Errorf("clusters = %v, want a changed and b kept", got)
			}
		},
	},
	{
		name: "a resource of another type than the response is NACKed",
		ref:  "xds_protocol: every resource of a response is of its type_url",
		test: func(t *testing.T, rc *ruleClient) {
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"), rc.raw("b", rc.claMsg("b", 0)))
			r := rc.lastRequest(ClusterType)
			want := `cluster "b": resource of type ` + EndpointType + " in a response of type " + ClusterType
			if r.errorDetail.GetMessage() != want {
				t.Errorf("NACK = %q, want %q", r.errorDetail.GetMessage(), want)
			}
			if got := rc.clusters.state(); !maps.Equal(got, map[string]string{"a": "1"}) {
				t.Errorf("clusters = %v", got)
			}
		},
	},
	{
		name: "a stream failure keeps every cached resource",
		ref:  "gRFC A57: data already received stays in use",
		test: func(t *testing.T, rc *ruleClient) {
			rc.setNames("e1")
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"))
			rc.respond(EndpointType, "1", nil, rc.cla("e1", 0))
			nc, ne := rc.clusters.count(), rc.eps.count()
			rc.disconnect()
			rc.expire(time.Now().Add(time.Hour))
			if rc.clusters.count() != nc || rc.eps.count() != ne {
				t.Errorf("handlers called after the stream failed")
			}
			for _, r := range []*ResourceStatus{rc.resource(ClusterType, "a"), rc.resource(EndpointType, "e1")} {
				if r.State != StateAcked {
					t.Errorf("%s = %+v, want acked", r.Name, r)
				}
			}
		},
	},
	{
		name: "a new stream says what the cache holds and the server's first state replaces the cache",
		ref:  "xds_protocol: reconnect; version_info and initial_resource_versions",
		differs: "the first SotW request of a stream carries no version_info, so that every server " +
			"sends its full state, which is swept against the cache (mark and sweep)",
		test: func(t *testing.T, rc *ruleClient) {
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"), rc.cluster("b", "1"))
			rc.reconnect()
			r := rc.lastRequest(ClusterType)
			if r.version != "" || r.nonce != "" {
				t.Errorf("first request of the new stream = %+v, want no version nor nonce", r)
			}
			// Delta: the versions this server gave; it removes what it
			// no longer has, and nothing is swept.
			if want := map[string]string{"a": "a-1", "b": "b-1"}; rc.delta && !maps.Equal(r.initialVersions, want) {
				t.Errorf("initial_resource_versions = %v, want %v", r.initialVersions, want)
			}
			n := rc.clusters.count()
			rc.respondFull(ClusterType, "1", rc.cluster("b", "1"), rc.cluster("c", "1"))
			u := rc.clusters.all()[n:]
			if len(u) != 1 || !slices.Equal(u[0].Removed, []string{"a"}) || !slices.Equal(names(u[0].Upserted), []string{"c"}) {
				t.Errorf("updates after reconnect = %+v, want one: c upserted, a removed", u)
			}
			if rc.delta {
				// Later Delta responses are changes, not full states.
				rc.respond(ClusterType, "2", nil, rc.cluster("d", "1"))
				if got := rc.clusters.state(); !maps.Equal(got, map[string]string{"b": "1", "c": "1", "d": "1"}) {
					t.Errorf("clusters = %v", got)
				}
			}
		},
	},
	{
		name: "servers are tried in order and one that fails before a response hands over to the next at once",
		ref:  "gRFC A71: servers in the order of the bootstrap; fallback on A57's failures (connection, stream without a response)",
		test: func(t *testing.T, rc *ruleClient) {
			if rc.current.address != ruleServerA || rc.server(ruleServerA).State != ConnConnected || !rc.server(ruleServerA).InUse {
				t.Fatalf("first server = %s %+v, want %s connected and in use", rc.current.address, rc.server(ruleServerA), ruleServerA)
			}
			if s := rc.server(ruleServerB); s.State != ConnStandby || s.InUse || s.Attempts != 0 {
				t.Errorf("second server before any failure = %+v, want standby, untried", s)
			}
			next, backoff := rc.end(errors.New("connection refused"))
			if next != 1 || backoff {
				t.Fatalf("after the first server failed: next %d, backoff %t; want the second at once", next+1, backoff)
			}
			if s := rc.server(ruleServerA); s.State != ConnBackoff || s.Failures != 1 || s.Error != "connection refused" {
				t.Errorf("failed first server = %+v, want backoff, 1 failure, its error", s)
			}
			rc.connectTo(next)
			if r := rc.lastRequest(ClusterType); r.node.GetId() != "node-1" || r.nonce != "" || r.version != "" {
				t.Errorf("first request to the second server = %+v, want the node, no nonce nor version", r)
			}
			if s := rc.server(ruleServerB); s.State != ConnConnected || !s.InUse || s.Attempts != 1 {
				t.Errorf("second server = %+v, want connected, in use, 1 attempt", s)
			}
			if rc.server(ruleServerA).InUse {
				t.Error("the failed first server is still in use")
			}
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"))
			if !rc.health.ok || !strings.Contains(rc.health.reason, "connected to "+ruleServerB) ||
				!strings.Contains(rc.health.reason, ruleServerA+": connection refused") {
				t.Errorf("health = %+v, want OK, on the second server, naming why not the first", rc.health)
			}
		},
	},
	{
		name: "when every server fails, the next round starts at the first after the backoff, and health names every server",
		ref:  "gRFC A71: the client reports a failure when the last server is unavailable",
		test: func(t *testing.T, rc *ruleClient) {
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"))
			rc.end(errors.New("stream closed by the server"))
			rc.connectTo(0)
			if next, backoff := rc.end(errors.New("connection refused")); next != 1 || backoff {
				t.Fatalf("next %d, backoff %t; want the second server at once", next+1, backoff)
			}
			rc.connectTo(1)
			next, backoff := rc.end(errors.New("tls: certificate signed by unknown authority"))
			if next != 0 || !backoff {
				t.Fatalf("after the last server failed: next %d, backoff %t; want the first after the backoff", next+1, backoff)
			}
			want := "disconnected from " + ruleServerA + ": connection refused; " +
				ruleServerB + ": tls: certificate signed by unknown authority"
			if rc.health.ok || rc.health.reason != want {
				t.Errorf("health = %+v, want degraded: %q", rc.health, want)
			}
			// Last-known-good: nothing was removed.
			if r := rc.resource(ClusterType, "a"); r.State != StateAcked {
				t.Errorf("a with every server down = %+v, want acked", r)
			}
		},
	},
	{
		name: "a stream that had a response and ends is no failure: the next round starts at the first server after the backoff",
		ref:  "gRFC A57: a stream closed after a response is not a failure; A71: the first server that delivers is used",
		test: func(t *testing.T, rc *ruleClient) {
			rc.end(errors.New("connection refused"))
			rc.connectTo(1)
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"))
			next, backoff := rc.end(errors.New("stream closed by the server"))
			if next != 0 || !backoff {
				t.Fatalf("next %d, backoff %t; want the first server after the backoff", next+1, backoff)
			}
			if s := rc.server(ruleServerB); s.Failures != 0 {
				t.Errorf("second server = %+v, want no failure: its stream had a response", s)
			}
		},
	},
	{
		name: "the cache is kept across a switch of server and swept only against the new server's first full state",
		ref:  "gRFC A71: cached resources are used until the fallback server sends its own; xds_protocol: a new stream's first response is the full state",
		test: func(t *testing.T, rc *ruleClient) {
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"), rc.cluster("b", "1"))
			rc.setNames("a")
			rc.respond(EndpointType, "1", nil, rc.cla("a", 0))
			n, ne := rc.clusters.count(), rc.eps.count()
			rc.end(errors.New("connection refused"))
			rc.connectTo(1)
			// Connected to the second server, which sent nothing yet:
			// nothing is gone.
			for _, r := range []struct{ typ, name string }{{ClusterType, "a"}, {ClusterType, "b"}, {EndpointType, "a"}} {
				if got := rc.resource(r.typ, r.name); got.State != StateAcked {
					t.Errorf("%s %s before the new server's first response = %+v, want acked", ShortTypeName(r.typ), r.name, got)
				}
			}
			if rc.clusters.count() != n || rc.eps.count() != ne {
				t.Fatalf("handlers called before the new server's first response: %+v %+v", rc.clusters.all()[n:], rc.eps.all()[ne:])
			}
			// Delta: versions of another server mean nothing: the
			// clusters go with none (it sends all it has and removes the
			// rest), the endpoints asked by name not at all (as in SotW,
			// what it lacks stays).
			if r := rc.lastRequest(ClusterType); rc.delta && !maps.Equal(r.initialVersions, map[string]string{"a": "", "b": ""}) {
				t.Errorf("clusters' initial_resource_versions on the new server = %v, want a and b without versions", r.initialVersions)
			}
			if r := rc.lastRequest(EndpointType); r.initialVersions != nil {
				t.Errorf("endpoints' initial_resource_versions on the new server = %v, want none", r.initialVersions)
			}
			// Its first full state: b unchanged (no update for it), c new, a swept.
			rc.respondFull(ClusterType, "7", rc.cluster("b", "1"), rc.cluster("c", "1"))
			u := rc.clusters.all()[n:]
			if len(u) != 1 || !slices.Equal(u[0].Removed, []string{"a"}) || !slices.Equal(names(u[0].Upserted), []string{"c"}) {
				t.Errorf("updates from the new server = %+v, want one: c upserted, a removed", u)
			}
			// A type of names is not swept: the endpoints stay until the
			// server answers or the does-not-exist timer says.
			if got := rc.resource(EndpointType, "a"); got.State != StateAcked {
				t.Errorf("endpoints a after the switch = %+v, want acked", got)
			}
		},
	},
	{
		name: "leaving a lower server for a higher one that delivers again is no failure",
		ref:  "gRFC A71: once the higher-priority server is reachable again, the lower one is closed",
		test: func(t *testing.T, rc *ruleClient) {
			rc.end(errors.New("connection refused"))
			rc.connectTo(1)
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"))
			next, backoff := rc.end(&switchServer{to: rc.servers[0]})
			if next != 0 || backoff {
				t.Fatalf("next %d, backoff %t; want the first server at once", next+1, backoff)
			}
			if s := rc.server(ruleServerB); s.State != ConnStandby || s.Failures != 0 || s.Error != "" {
				t.Errorf("second server after leaving it = %+v, want standby, no failure, no error", s)
			}
			rc.connectTo(0)
			if s := rc.server(ruleServerB); s.InUse {
				t.Errorf("second server still in use: %+v", s)
			}
			n := rc.clusters.count()
			rc.respond(ClusterType, "2", nil, rc.cluster("a", "1"))
			if rc.clusters.count() != n {
				t.Errorf("the same state from the first server reached the handler: %+v", rc.clusters.all()[n:])
			}
			if !rc.health.ok || rc.health.reason != "connected to "+ruleServerA+", 1 types synced" {
				t.Errorf("health = %+v, want OK on the first server", rc.health)
			}
		},
	},
	{
		name: "the check that a higher server delivers asks for the stream's subscription",
		ref:  "gRFC A71: a server is used again once it delivers, not merely once it accepts connections",
		test: func(t *testing.T, rc *ruleClient) {
			rc.setNames("e1", "e2")
			reqs := rc.probeRequests()
			if len(reqs) != 2 || reqs[0].typeURL != ClusterType || reqs[0].node.GetId() != "node-1" || reqs[1].node != nil {
				t.Fatalf("probe requests = %+v, want clusters with the node, then endpoints", reqs)
			}
			got := slices.Concat(reqs[1].names, reqs[1].subscribe)
			if !slices.Equal(got, []string{"e1", "e2"}) {
				t.Errorf("probe asks for endpoints %q, want [e1 e2]", got)
			}
			if rc.delta && !slices.Equal(reqs[0].subscribe, []string{"*"}) || !rc.delta && reqs[0].names != nil {
				t.Errorf("probe's wildcard = %+v, want the stream's wildcard", reqs[0])
			}
		},
	},
	{
		name: "an unchanged resource does not reach the handler",
		ref:  "xds_protocol: SotW resends everything; a client applies only changes",
		test: func(t *testing.T, rc *ruleClient) {
			rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"))
			n := rc.clusters.count()
			rc.respond(ClusterType, "2", nil, rc.cluster("a", "1"))
			if rc.clusters.count() != n {
				t.Errorf("handler called for an unchanged resource: %+v", rc.clusters.all()[n:])
			}
			if r := rc.lastRequest(ClusterType); r.errorDetail != nil || r.nonce != rc.lastNonce {
				t.Errorf("answer = %+v, want an ACK", r)
			}
		},
	},
}

// stateAbsent is the state ruleClient.resource gives a name without a row.
const stateAbsent ResourceState = "absent"

// The servers of a ruleClient, in order of priority.
const (
	ruleServerA = "xds-a.example.internal:9000"
	ruleServerB = "xds-b.example.internal:9000"
)

// ruleClient is a Client driven by hand, for TestConformance.
type ruleClient struct {
	*Client
	t         *testing.T
	delta     bool
	db        *statedb.DB
	st        *recordingStream
	clusters  *recorder
	eps       *recorder
	health    *recordedHealth
	lastNonce string
	nonces    int
}

func newRuleClient(t *testing.T, protocol string) *ruleClient {
	cfg := DefaultConfig
	cfg.EnableXDSControlPlane = true
	// Two servers, as A71 allows: every rule runs on the first, the
	// fallback rules on both.
	cfg.XDSServerAddress = ruleServerA + "," + ruleServerB
	cfg.XDSInsecure = true
	cfg.XDSNodeID = "node-1"
	cfg.XDSProtocol = protocol
	db := statedb.New()
	health := &recordedHealth{}
	c, err := NewClient(cfg, slog.New(slog.DiscardHandler), db, WithHealth(health))
	if err != nil {
		t.Fatal(err)
	}
	rc := &ruleClient{Client: c, t: t, delta: protocol == ProtocolDelta, db: db, clusters: &recorder{}, eps: &recorder{}, health: health}
	c.Watch(ClusterType, true, rc.clusters)
	c.Watch(EndpointType, false, rc.eps)
	c.applyWatches()
	c.writeBehind()
	rc.connect()
	return rc
}

// connect starts a stream to the server in use and sends the first
// requests, as run and session do.
func (rc *ruleClient) connect() { rc.connectTo(rc.current.index) }

// connectTo starts a stream to servers[i], as run and session do.
func (rc *ruleClient) connectTo(i int) {
	srv := rc.servers[i]
	rc.Client.connect(srv)
	rc.st = &recordingStream{}
	rc.startStream()
	rc.updateServer(srv, func(s *managementServer) {
		s.err = nil
		s.setState(ConnConnected)
	})
	rc.setConn(ConnConnected, nil)
	rc.metrics.streamOpened(srv.address)
	if err := rc.sendAll(rc.st); err != nil {
		rc.t.Fatal(err)
	}
}

// end ends the stream with err, as run does, and returns the server run
// would try next and whether it would wait the backoff first.
func (rc *ruleClient) end(err error) (next int, backoff bool) {
	srv := rc.current
	responded := rc.streamEnded(srv, err)
	next, backoff = nextServer(srv.index, len(rc.servers), responded, err)
	if backoff {
		rc.waitRetry(err, time.Second)
	}
	return next, backoff
}

func (rc *ruleClient) disconnect() { rc.end(errors.New("stream broken by the test")) }

// reconnect starts a new stream to the same server.
func (rc *ruleClient) reconnect() {
	srv := rc.current.index
	rc.disconnect()
	rc.connectTo(srv)
}

// setNames sets the requested endpoint names and sends the request.
func (rc *ruleClient) setNames(names ...string) {
	rc.SetNames(EndpointType, names)
	if err := rc.requestWatches(rc.st); err != nil {
		rc.t.Fatal(err)
	}
	rc.writeBehind()
}

// respond hands the client a response: version is the SotW version_info or
// the Delta system_version_info; removed is Delta's removed_resources.
func (rc *ruleClient) respond(typeURL, version string, removed []string, rs ...rawResource) {
	rc.t.Helper()
	rc.nonces++
	rc.lastNonce = "nonce-" + strconv.Itoa(rc.nonces)
	resp := &response{typeURL: typeURL, version: version, nonce: rc.lastNonce, removed: removed}
	for _, r := range rs {
		if !rc.delta {
			// SotW: no name up front; the version is the response's.
			r.name, r.version = "", version
		}
		resp.resources = append(resp.resources, r)
	}
	if err := rc.handleResponse(context.Background(), rc.st, resp); err != nil {
		rc.t.Fatal(err)
	}
	rc.writeBehind() // as the run loop does before it waits
}

// respondFull hands the client the server's whole state of a type, as the
// first response of a stream: in Delta, a conforming server removes what
// the stream's initial_resource_versions list and it lacks.
func (rc *ruleClient) respondFull(typeURL, version string, rs ...rawResource) {
	rc.t.Helper()
	var removed []string
	if rc.delta {
		has := map[string]bool{}
		for _, r := range rs {
			has[r.name] = true
		}
		for name := range rc.lastRequest(typeURL).initialVersions {
			if !has[name] {
				removed = append(removed, name)
			}
		}
		slices.Sort(removed)
	}
	rc.respond(typeURL, version, removed, rs...)
}

func (rc *ruleClient) expire(now time.Time) { rc.Client.expire(context.Background(), now) }

func (rc *ruleClient) sentRequests() []*request { return rc.st.sent }

func (rc *ruleClient) lastRequest(typeURL string) *request {
	for _, r := range slices.Backward(rc.st.sent) {
		if r.typeURL == typeURL {
			return r
		}
	}
	return nil
}

func (rc *ruleClient) resource(typeURL, name string) *ResourceStatus {
	r, _, _ := rc.resources.Get(rc.db.ReadTxn(), ResourceByName(typeURL, name))
	if r == nil {
		r = &ResourceStatus{Name: name, State: stateAbsent}
	}
	return r
}

// raw wraps m as a resource named name, of version name-tag in Delta.
func (rc *ruleClient) raw(name string, m proto.Message) rawResource {
	a, err := anypb.New(m)
	if err != nil {
		rc.t.Fatal(err)
	}
	version := name
	switch m := m.(type) {
	case *clusterv3.Cluster:
		version += "-" + m.GetAltStatName()
	case *endpointv3.ClusterLoadAssignment:
		version += "-" + strconv.Itoa(int(m.GetEndpoints()[0].GetPriority()))
	}
	return rawResource{name: name, version: version, any: a}
}

func (rc *ruleClient) cluster(name, tag string) rawResource { return rc.raw(name, cluster(name, tag)) }

func (rc *ruleClient) claMsg(name string, priority uint32) proto.Message {
	return endpoints(name, priority)
}

func (rc *ruleClient) cla(name string, priority uint32) rawResource {
	return rc.raw(name, endpoints(name, priority))
}

// server is the row of xds-servers of the server at addr.
func (rc *ruleClient) server(addr string) *ServerStatus {
	for s := range rc.serverRows.All(rc.db.ReadTxn()) {
		if s.Address == addr {
			return s
		}
	}
	rc.t.Fatalf("no row for server %s", addr)
	return nil
}

// recordedHealth keeps the last health report.
type recordedHealth struct {
	ok     bool
	reason string
}

func (h *recordedHealth) OK(reason string)                { h.ok, h.reason = true, reason }
func (h *recordedHealth) Degraded(reason string, _ error) { h.ok, h.reason = false, reason }
func (h *recordedHealth) Stopped(string)                  {}
func (h *recordedHealth) NewScope(string) cell.Health     { return h }
func (h *recordedHealth) Close()                          {}
