// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"bytes"
	"maps"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// FuzzParseResources feeds arbitrary files to the resource file parser. It
// must never panic; an error names the document; and what it accepts, every
// resource named, written back as a file of `resource:` documents, parses
// to the same resources. What the JSON path takes, the YAML path takes
// too, with the same resources.
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
				file.Write(j)
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
