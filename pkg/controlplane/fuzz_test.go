// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"bytes"
	"maps"
	"slices"
	"strings"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// FuzzParseResources feeds arbitrary files to the resource file parser. It
// must never panic; an error names the document; and what it accepts, every
// resource named, written back as a file of `resource:` documents, parses
// to the same resources. What the JSON path takes, the YAML path takes
// too, with the same resources; a list it splits reads a resource at a
// time as it does whole.
func FuzzParseResources(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := ParseResources(data)
		if fast, ok := parseJSON(data, parseOptions{}); ok {
			slow, err := parseYAML(data, parseOptions{})
			if err != nil {
				t.Fatalf("the JSON path took what the YAML path refuses: %v", err)
			}
			if !sameResources(fast, slow, proto.Equal) {
				t.Fatalf("the JSON path made other resources than the YAML path:\n%v\n%v", fast, slow)
			}
		}
		checkResourceList(t, data)
		checkReadAsJSON(t, data, res, err)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "document ") {
				t.Fatalf("error %q does not start with the document", err)
			}
			return
		}
		var file bytes.Buffer
		n := 0
		for _, typeURL := range slices.Sorted(maps.Keys(res)) {
			for _, name := range slices.Sorted(maps.Keys(res[typeURL])) {
				msg := res[typeURL][name]
				if name == "" || typeURLOf(msg) != typeURL {
					t.Fatalf("resource %q of %s is under type %s", name, typeURLOf(msg), typeURL)
				}
				a, err := anypb.New(msg)
				if err != nil {
					t.Fatalf("%s %q: %v", typeURL, name, err)
				}
				j, err := protojson.Marshal(a)
				if err != nil {
					// A value JSON cannot carry (a NaN in a Struct).
					return
				}
				file.WriteString("---\nresource: ")
				// In a YAML file, JSON's strings escape what YAML
				// refuses or reads as a line break.
				file.Write(jsonForYAML(j))
				file.WriteString("\n")
				n++
			}
		}
		if n != res.Len() {
			t.Fatalf("Len %d, %d resources listed", res.Len(), n)
		}
		again, err := ParseResources(file.Bytes())
		if err != nil {
			t.Fatalf("what was accepted does not parse again: %v\n%s", err, file.Bytes())
		}
		for typeURL, byName := range res {
			for name, msg := range byName {
				if !proto.Equal(msg, again[typeURL][name]) {
					t.Fatalf("%s %q: parsed again as %v, was %v", typeURL, name, again[typeURL][name], msg)
				}
			}
		}
		if again.Len() != res.Len() {
			t.Fatalf("%d resources parsed again, %d first", again.Len(), res.Len())
		}
	})
}

// checkResourceList: when parseJSON would split data's list, protojson
// reads the elements one at a time as it reads the whole file: the same
// resources, or an error either way.
func checkResourceList(t *testing.T, data []byte) {
	data = bytes.Trim(data, " \r\n")
	if len(data) == 0 || data[0] != '{' || data[len(data)-1] != '}' {
		return
	}
	keys, plain := plainJSON(data)
	if !plain {
		return
	}
	elems, ok := resourceList(data, keys)
	if !ok {
		return
	}
	var whole discovery.DiscoveryResponse
	wholeErr := protojson.Unmarshal(data, &whole)
	var parts []*anypb.Any
	var partErr error
	for _, e := range elems {
		var a anypb.Any
		if partErr = protojson.Unmarshal(e, &a); partErr != nil {
			break
		}
		parts = append(parts, &a)
	}
	if (wholeErr == nil) != (partErr == nil) {
		t.Fatalf("the whole file: %v; its %d elements one at a time: %v", wholeErr, len(elems), partErr)
	}
	if wholeErr == nil && !slices.EqualFunc(parts, whole.GetResources(), func(a, b *anypb.Any) bool { return proto.Equal(a, b) }) {
		t.Fatalf("the elements read one at a time:\n%v\nthe whole file:\n%v", parts, whole.GetResources())
	}
}

// checkReadAsJSON: what ParseResources takes of a file that protojson
// reads as a DiscoveryResponse, it reads as protojson does, whichever path
// read it.
func checkReadAsJSON(t *testing.T, data []byte, res Resources, err error) {
	var whole discovery.DiscoveryResponse
	if err != nil || protojson.Unmarshal(data, &whole) != nil {
		return
	}
	want := Resources{}
	for _, a := range whole.GetResources() {
		msg, err := a.UnmarshalNew()
		if err != nil || want.Add(msg) != nil {
			t.Fatalf("taken, but not a set of resources: %v", err)
		}
	}
	if !sameResources(res, want, proto.Equal) {
		t.Fatalf("read as\n%v\nJSON says\n%v", res, want)
	}
}
