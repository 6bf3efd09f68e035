// SPDX-License-Identifier: Apache-2.0

package l4lb

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// yamlToJSON converts one YAML document to JSON, as an xDS server reading
// resource files would.
func yamlToJSON(t testing.TB, doc string) []byte {
	t.Helper()
	var v any
	if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
		t.Fatalf("yaml: %v\n%s", err, doc)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("json: %v", err)
	}
	return b
}

func fromYAML(t testing.TB, doc string, m proto.Message) {
	t.Helper()
	if err := protojson.Unmarshal(yamlToJSON(t, doc), m); err != nil {
		t.Fatalf("protojson: %v\n%s", err, doc)
	}
}

func clusterYAML(t testing.TB, doc string) *clusterv3.Cluster {
	t.Helper()
	c := &clusterv3.Cluster{}
	fromYAML(t, doc, c)
	return c
}

func claYAML(t testing.TB, doc string) *endpointv3.ClusterLoadAssignment {
	t.Helper()
	cla := &endpointv3.ClusterLoadAssignment{}
	fromYAML(t, doc, cla)
	return cla
}

// loadResources reads a multi-document YAML file of {resource: {'@type': ...}}
// entries, the format of the CFP.
func loadResources(t testing.TB, path string) []proto.Message {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	var msgs []proto.Message
	for {
		var doc struct {
			Resource any `yaml:"resource"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if doc.Resource == nil {
			continue
		}
		b, err := json.Marshal(doc.Resource)
		if err != nil {
			t.Fatal(err)
		}
		a := &anypb.Any{}
		if err := protojson.Unmarshal(b, a); err != nil {
			t.Fatalf("%s: %v", bytes.TrimSpace(b), err)
		}
		m, err := a.UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	return msgs
}
