// SPDX-License-Identifier: Apache-2.0

package test

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const docsFile = "Documentation/kubernetes.md"

// schemaNode is the part of values.schema.json this test reads.
type schemaNode struct {
	Type                 any                    `json:"type"` // a name or a list of names
	Description          string                 `json:"description"`
	Properties           map[string]*schemaNode `json:"properties"`
	AdditionalProperties any                    `json:"additionalProperties"`
	Required             []string               `json:"required"`
}

// valuePaths lists the values an operator sets: the leaves of values.yaml,
// where a free-form object (resources, nodeSelector, ...) is one value.
// It descends where the schema lists the keys of an object, and checks
// that values.yaml and the schema list the same keys there.
func valuePaths(t *testing.T, prefix string, vals map[string]any, node *schemaNode) []string {
	t.Helper()
	var paths []string
	for _, key := range slices.Sorted(maps.Keys(vals)) {
		p := strings.TrimPrefix(prefix+"."+key, ".")
		sub, ok := node.Properties[key]
		if !ok {
			t.Errorf("values.yaml has %s, values.schema.json does not", p)
			continue
		}
		if sub.Description == "" {
			t.Errorf("values.schema.json: %s has no description", p)
		}
		child, isMap := vals[key].(map[string]any)
		if isMap && sub.Properties != nil && sub.AdditionalProperties == false {
			paths = append(paths, valuePaths(t, p, child, sub)...)
			continue
		}
		paths = append(paths, p)
	}
	for key := range node.Properties {
		if _, ok := vals[key]; !ok {
			t.Errorf("values.schema.json has %s, values.yaml does not", strings.TrimPrefix(prefix+"."+key, "."))
		}
	}
	// A required key fails `helm upgrade --reuse-values` to the chart
	// version that adds it (TestUpgradeReuseValues).
	if len(node.Required) > 0 {
		t.Errorf("values.schema.json %q: required %v, want none", prefix, node.Required)
	}
	return paths
}

// Every value of values.yaml is documented, as `path` in the values table of
// Documentation/kubernetes.md.
func TestValuesDocumented(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema schemaNode
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	if schema.AdditionalProperties != false {
		t.Error("values.schema.json: the top level must set additionalProperties: false")
	}
	paths := valuePaths(t, "", readValues(t, filepath.Join(chartDir, "values.yaml")), &schema)
	if len(paths) < 40 {
		t.Fatalf("only %d values found: %v", len(paths), paths)
	}
	doc, err := os.ReadFile(filepath.Join(repoRoot, docsFile))
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for line := range strings.Lines(string(doc)) {
		if strings.HasPrefix(line, "| `") {
			rows = append(rows, line)
		}
	}
	for _, p := range paths {
		if !slices.ContainsFunc(rows, func(row string) bool { return strings.HasPrefix(row, "| `"+p+"`") }) {
			t.Errorf("%s does not document %s (want a table row starting with | `%s`)", docsFile, p, p)
		}
	}
}
