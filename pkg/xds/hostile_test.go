// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"fmt"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestHostileResources: what a broken or hostile server sends gets a NACK
// that names the resource when its name can be known, and whose size is
// bounded whatever the server sent; the rest of the response is applied,
// and the resource keeps its last accepted version. Each case starts with
// cluster "db" accepted, and its response also carries a good cluster "ok".
func TestHostileResources(t *testing.T) {
	longName := "db" + strings.Repeat("x", 64<<10-2)
	for _, c := range []struct {
		name string
		// resources are the hostile ones, sent before "ok".
		resources func(rc *ruleClient) []rawResource
		// setup runs before the response.
		setup func(rc *ruleClient)
		// want is in the NACK's error_detail; dbState is db's state after.
		want    string
		dbState ResourceState
	}{
		{
			name: "an Any of another type",
			resources: func(rc *ruleClient) []rawResource {
				return []rawResource{rc.raw("db", endpoints("db", 0))}
			},
			want:    `cluster "db": resource of type type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment in a response of type ` + ClusterType,
			dbState: StateNackedButCached,
		},
		{
			name: "bytes that do not decode after the name",
			resources: func(rc *ruleClient) []rawResource {
				r := rc.cluster("db", "2")
				r.any.Value = append(r.any.Value, 0xff)
				return []rawResource{r}
			},
			want:    `cluster "db": cannot decode ` + ClusterType + `: `,
			dbState: StateNackedButCached,
		},
		{
			name: "a name of 64 KiB",
			resources: func(rc *ruleClient) []rawResource {
				return []rawResource{rc.cluster("db", "1"), rc.cluster(longName, "1")}
			},
			want:    `cluster "` + longName[:maxQuotedName] + `"... (65536 bytes): resources[1]: the name of 65536 bytes is longer than 4096`,
			dbState: StateAcked,
		},
		{
			name: "metadata nested 200 deep",
			resources: func(rc *ruleClient) []rawResource {
				c := cluster("db", "2")
				c.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"io.cilium.l4lb": nestedStruct(200)}}
				return []rawResource{rc.raw("db", c)}
			},
			want:    `cluster "db": cannot decode ` + ClusterType + `: `,
			dbState: StateNackedButCached,
		},
		{
			name: "a type URL of 64 KiB",
			resources: func(rc *ruleClient) []rawResource {
				r := rc.cluster("db", "2")
				r.any.TypeUrl = "type.googleapis.com/" + strings.Repeat("x", 64<<10)
				return []rawResource{r}
			},
			// In SotW the name is not known: the type is not.
			want: "cannot decode \"type.googleapis.com/xxxxxxxx",
		},
		{
			name: "a handler's error of 3 KiB",
			setup: func(rc *ruleClient) {
				other := "held" + strings.Repeat("y", 3000)
				rc.clusters.conflicts = map[string]string{"db": other}
				rc.respond(ClusterType, "1a", nil, rc.cluster("db", "1"), rc.cluster(other, "1"))
			},
			resources: func(rc *ruleClient) []rawResource {
				return []rawResource{rc.cluster("db", "2"), rc.cluster("held"+strings.Repeat("y", 3000), "1")}
			},
			want:    `cluster "db": ` + vipConflictPrefix + "heldyyy",
			dbState: StateNackedButCached,
		},
		{
			name: "thousands of bad resources",
			resources: func(rc *ruleClient) []rawResource {
				var rs []rawResource
				for i := range 5000 {
					rs = append(rs, rc.cluster(fmt.Sprintf("bad-%04d", i), "bad"))
				}
				return append(rs, rc.cluster("db", "1"))
			},
			want:    "; and ",
			dbState: StateAcked,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, p := range []string{ProtocolSotW, ProtocolDelta} {
				t.Run(p, func(t *testing.T) {
					rc := newRuleClient(t, p)
					rc.respond(ClusterType, "1", nil, rc.cluster("db", "1"))
					if c.setup != nil {
						c.setup(rc)
					}
					rc.respond(ClusterType, "2", nil, append(c.resources(rc), rc.cluster("ok", "1"))...)

					nack := rc.lastRequest(ClusterType).errorDetail.GetMessage()
					if !strings.Contains(nack, c.want) {
						t.Errorf("NACK %.300q..., want it to contain %.300q", nack, c.want)
					}
					if len(nack) > MaxNackMessage+100 {
						t.Errorf("NACK of %d bytes, want at most about %d", len(nack), MaxNackMessage)
					}
					if got := rc.resource(ClusterType, "ok").State; got != StateAcked {
						t.Errorf("cluster ok: %s, want acked: the rest of the response is applied", got)
					}
					if c.dbState != "" {
						if got := rc.resource(ClusterType, "db").State; got != c.dbState {
							t.Errorf("cluster db: %s, want %s", got, c.dbState)
						}
					}
					for r := range rc.resources.All(rc.db.ReadTxn()) {
						if len(r.Name) > MaxNameLength || len(r.Error) > MaxErrorLength+32 {
							t.Errorf("row %.100q of a %d-byte name holds an error of %d bytes", r.Name, len(r.Name), len(r.Error))
						}
					}
				})
			}
		})
	}
}

// nestedStruct is a Struct depth levels deep.
func nestedStruct(depth int) *structpb.Struct {
	s := &structpb.Struct{}
	for range depth {
		s = &structpb.Struct{Fields: map[string]*structpb.Value{"x": structpb.NewStructValue(s)}}
	}
	return s
}

// The name of a resource that does not decode is read from its encoding
// when it can be: the last instance at the top level, as a decoder takes it.
func TestEncodedName(t *testing.T) {
	b, err := proto.Marshal(&clusterv3.Cluster{Name: "db", AltStatName: "x"})
	if err != nil {
		t.Fatal(err)
	}
	twice := append(append([]byte{}, b...), 0x0a, 2, 'w', 'b') // field 1 again: "wb"
	for _, c := range []struct {
		name string
		any  *anypb.Any
		want string
	}{
		{"whole", &anypb.Any{TypeUrl: ClusterType, Value: b}, "db"},
		{"trailing garbage", &anypb.Any{TypeUrl: ClusterType, Value: append(append([]byte{}, b...), 0xff)}, "db"},
		{"the last instance", &anypb.Any{TypeUrl: ClusterType, Value: twice}, "wb"},
		{"cluster_name", &anypb.Any{TypeUrl: EndpointType, Value: b}, "db"},
		{"an unknown type", &anypb.Any{TypeUrl: "type.googleapis.com/hostile.Thing", Value: b}, ""},
		{"no bytes", &anypb.Any{TypeUrl: ClusterType}, ""},
		{"invalid UTF-8", &anypb.Any{TypeUrl: ClusterType, Value: []byte{0x0a, 1, 0xff}}, ""},
	} {
		if got := encodedName(c.any); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
