// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// recordingStream keeps the requests the client sends.
type recordingStream struct{ sent []*request }

func (s *recordingStream) send(r *request) error    { s.sent = append(s.sent, r); return nil }
func (s *recordingStream) recv() (*response, error) { return nil, io.EOF }

// TestDocsNACKMessages: the NACKs the client itself sends for resources it
// cannot decode, before any handler sees them, are listed in
// troubleshooting.md as the client words them.
func TestDocsNACKMessages(t *testing.T) {
	data, err := os.ReadFile("../../Documentation/troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)

	named, err := anypb.New(&endpointv3.ClusterLoadAssignment{ClusterName: "db"})
	if err != nil {
		t.Fatal(err)
	}
	unnamed, err := anypb.New(&clusterv3.Cluster{})
	if err != nil {
		t.Fatal(err)
	}
	namedCluster, err := anypb.New(&clusterv3.Cluster{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	deep, err := anypb.New(&clusterv3.Cluster{Name: "db", Metadata: &corev3.Metadata{
		FilterMetadata: map[string]*structpb.Struct{"io.cilium.l4lb": nestedStruct(40)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	longNamed, err := anypb.New(&clusterv3.Cluster{Name: "db" + strings.Repeat("x", 64<<10-2)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		raw  rawResource
		// more are the resources after raw in the response.
		more []rawResource
		// removed is the response's removed_resources (Delta).
		removed []string
		// want is the NACK's error_detail, or its start when the rest is
		// protobuf's wording.
		want string
	}{
		{"no body", rawResource{name: "db"}, nil, nil, `cluster "db": resource has no body`},
		{"no name", rawResource{any: unnamed}, nil, nil, "cluster #0: resource has no name"},
		{"other type", rawResource{any: named}, nil, nil,
			`cluster "db": resource of type type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment in a response of type type.googleapis.com/envoy.config.cluster.v3.Cluster`},
		{"undecodable", rawResource{any: &anypb.Any{TypeUrl: ClusterType, Value: []byte{0xff}}}, nil, nil,
			"cluster #0: cannot decode type.googleapis.com/envoy.config.cluster.v3.Cluster: "},
		{"undecodable, named", rawResource{any: &anypb.Any{TypeUrl: ClusterType, Value: append(mustMarshal(t, &clusterv3.Cluster{Name: "db"}), 0xff)}}, nil, nil,
			`cluster "db": cannot decode type.googleapis.com/envoy.config.cluster.v3.Cluster: `},
		{"nested too deep", rawResource{any: deep}, nil, nil,
			`cluster "db": cannot decode type.googleapis.com/envoy.config.cluster.v3.Cluster: `},
		{"name too long", rawResource{any: longNamed}, nil, nil,
			`cluster "dbxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"... (65536 bytes): resources[0]: the name of 65536 bytes is longer than 4096`},
		{"duplicate", rawResource{any: namedCluster}, []rawResource{{any: namedCluster}}, nil,
			`cluster "db": resources[1]: duplicate of resources[0], the one applied`},
		{"sent and removed", rawResource{name: "db", any: namedCluster}, nil, []string{"db"},
			`cluster "db": removed_resources[0]: also in resources[0], the one applied`},
	} {
		t.Run(c.name, func(t *testing.T) {
			client, err := NewClient(Config{
				EnableXDSControlPlane:          true,
				XDSServerAddress:               "xds.example.internal:9000",
				XDSInsecure:                    true,
				XDSProtocol:                    ProtocolSotW,
				XDSMaxRecvMsgSize:              DefaultConfig.XDSMaxRecvMsgSize,
				XDSResourceDoesNotExistTimeout: DefaultConfig.XDSResourceDoesNotExistTimeout,
				XDSConnectTimeout:              DefaultConfig.XDSConnectTimeout,
			}, slog.New(slog.DiscardHandler), statedb.New(), WithHealth(nopHealth{}))
			if err != nil {
				t.Fatal(err)
			}
			client.Watch(ClusterType, true, HandlerFunc(func(context.Context, Update) map[string]error { return nil }))
			client.applyWatches()
			st := &recordingStream{}
			resp := &response{typeURL: ClusterType, version: "1", nonce: "1", resources: append([]rawResource{c.raw}, c.more...), removed: c.removed}
			if err := client.handleResponse(context.Background(), st, resp); err != nil {
				t.Fatal(err)
			}
			if len(st.sent) != 1 || st.sent[0].errorDetail == nil {
				t.Fatalf("want one NACK, sent %+v", st.sent)
			}
			got := st.sent[0].errorDetail.GetMessage()
			if !strings.HasPrefix(got, c.want) {
				t.Fatalf("NACK error_detail = %q, want %q", got, c.want)
			}
			if !strings.Contains(doc, "`"+c.want) {
				t.Errorf("troubleshooting.md does not list the NACK error\n\t%s", c.want)
			}
		})
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
