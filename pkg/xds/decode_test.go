// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"fmt"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// A server resending every resource of a type with one changed costs the
// client the changed one: the others' bytes are those it accepted, and are
// not decoded (about one allocation per resource for the whole response,
// its name; a decode makes several), nor given to the handler.
func TestUnchangedResourcesAreNotDecoded(t *testing.T) {
	const n = 1000
	for _, p := range []string{ProtocolSotW, ProtocolDelta} {
		t.Run(p, func(t *testing.T) {
			rc := newRuleClient(t, p)
			all := make([]rawResource, n)
			for i := range all {
				all[i] = rc.cluster(fmt.Sprintf("c%d", i), "1")
			}
			rc.respond(ClusterType, "1", nil, all...)

			allocs := testing.AllocsPerRun(5, func() { rc.respond(ClusterType, "1", nil, all...) })
			if allocs > 1.5*n {
				t.Errorf("an unchanged resend of %d clusters: %.0f allocations, want at most one and a half per cluster", n, allocs)
			}

			before := len(rc.clusters.updates)
			resend := append([]rawResource(nil), all...)
			resend[7] = rc.cluster("c7", "2")
			rc.respond(ClusterType, "2", nil, resend...)
			if got := rc.clusters.updates[before:]; len(got) != 1 || len(got[0].Upserted) != 1 || got[0].Upserted[0].Name != "c7" {
				t.Errorf("handler got %+v, want c7 alone", got)
			}
			if r := rc.resource(ClusterType, "c8"); r.State != StateAcked {
				t.Errorf("c8: %+v", r)
			}
		})
	}
}

// encodedNames are encodings whose name peekName must read as a decoder
// does, or find unreadable.
func encodedNames(t testing.TB) [][]byte {
	must := func(b []byte, err error) []byte {
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cla := must(proto.Marshal(endpoints("db", 1)))
	cl := must(proto.Marshal(cluster("web", "x")))
	// A second name field: the last one wins.
	twice := protowire.AppendString(protowire.AppendTag(append([]byte(nil), cl...), 1, protowire.BytesType), "web2")
	// Field 1 as a varint: an unknown field to a decoder.
	varint := protowire.AppendVarint(protowire.AppendTag(append([]byte(nil), cl...), 1, protowire.VarintType), 7)
	return [][]byte{cla, cl, twice, varint, nil, {0xff}, cl[:len(cl)-1]}
}

func TestPeekName(t *testing.T) {
	enc := encodedNames(t)
	for _, tc := range []struct {
		typeURL string
		in      []byte
		want    string
	}{
		{EndpointType, enc[0], "db"},
		{ClusterType, enc[1], "web"},
		{ClusterType, enc[2], "web2"},
		{ClusterType, enc[3], "web"},
		{ClusterType, enc[4], ""},
		{ClusterType, enc[5], ""},
		{ClusterType, enc[6], ""},
		{"type.googleapis.com/envoy.config.listener.v3.Listener", enc[1], ""},
	} {
		if got := string(peekName(tc.typeURL, tc.in)); got != tc.want {
			t.Errorf("peekName(%s, %x) = %q, want %q", tc.typeURL, tc.in, got, tc.want)
		}
	}
}

// peekName agrees with a full decode of any bytes that decode.
func FuzzPeekName(f *testing.F) {
	for _, b := range encodedNames(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var cl clusterv3.Cluster
		if proto.Unmarshal(b, &cl) == nil {
			if got := string(peekName(ClusterType, b)); got != cl.GetName() {
				t.Errorf("Cluster %x: peekName %q, decoded %q", b, got, cl.GetName())
			}
		}
		var cla endpointv3.ClusterLoadAssignment
		if proto.Unmarshal(b, &cla) == nil {
			if got := string(peekName(EndpointType, b)); got != cla.GetClusterName() {
				t.Errorf("ClusterLoadAssignment %x: peekName %q, decoded %q", b, got, cla.GetClusterName())
			}
		}
	})
}
