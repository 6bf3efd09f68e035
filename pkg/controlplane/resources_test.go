// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestParseCFPExample(t *testing.T) {
	data, err := os.ReadFile("testdata/cfp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The example in the repository's examples/ must stay the CFP's text.
	example, err := os.ReadFile("../../examples/cfp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(example) != string(data) {
		t.Fatal("examples/cfp.yaml differs from testdata/cfp.yaml")
	}

	res, err := ParseResources(data)
	if err != nil {
		t.Fatalf("ParseResources: %v", err)
	}
	if res.Len() != 2 {
		t.Fatalf("got %d resources, want 2: %v", res.Len(), res)
	}
	checkCFP(t, res)
}

func checkCFP(t *testing.T, res Resources) {
	t.Helper()
	c, ok := res[resource.ClusterType]["my-database-service"].(*clusterv3.Cluster)
	if !ok {
		t.Fatalf("no Cluster my-database-service in %v", res)
	}
	if c.GetType() != clusterv3.Cluster_EDS || c.GetEdsClusterConfig().GetServiceName() != "my-database-service" {
		t.Errorf("cluster discovery: type %v, eds service %q", c.GetType(), c.GetEdsClusterConfig().GetServiceName())
	}
	md := c.GetMetadata().GetFilterMetadata()["io.cilium.l4lb"].GetFields()
	if md["vip"].GetStringValue() != "10.1.2.3" || md["port"].GetNumberValue() != 3306 || md["protocol"].GetStringValue() != "TCP" {
		t.Errorf("io.cilium.l4lb metadata = %v", md)
	}

	cla, ok := res[resource.EndpointType]["my-database-service"].(*endpointv3.ClusterLoadAssignment)
	if !ok {
		t.Fatalf("no ClusterLoadAssignment my-database-service in %v", res)
	}
	var got []string
	for _, le := range cla.GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			got = append(got, sa.GetAddress()+":"+itoa(sa.GetPortValue()))
		}
	}
	if strings.Join(got, ",") != "192.168.1.10:3306,192.168.1.11:3306" {
		t.Errorf("endpoints = %v", got)
	}
}

func itoa(v uint32) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + v%10)}, b...)
		if v /= 10; v == 0 {
			return string(b)
		}
	}
}

// The same resources in the other accepted forms decode to the same messages.
func TestParseForms(t *testing.T) {
	want, err := LoadFile("testdata/cfp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	forms := map[string]string{
		"bare yaml, camelCase": `
'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
name: my-database-service
metadata: {filterMetadata: {io.cilium.l4lb: {vip: "10.1.2.3", port: 3306, protocol: TCP}}}
type: EDS
edsClusterConfig: {serviceName: my-database-service}
---
'@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
clusterName: my-database-service
endpoints:
- lbEndpoints:
  - endpoint: {address: {socketAddress: {address: 192.168.1.10, portValue: 3306}}}
  - endpoint: {address: {socketAddress: {address: 192.168.1.11, portValue: "3306"}}}
`,
		"json array, tab indented": `[
	{"resource": {
		"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
		"name": "my-database-service",
		"metadata": {"filter_metadata": {"io.cilium.l4lb": {"vip": "10.1.2.3", "port": 3306, "protocol": "TCP"}}},
		"type": "EDS",
		"eds_cluster_config": {"service_name": "my-database-service"}
	}},
	{
		"@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
		"cluster_name": "my-database-service",
		"endpoints": [{"lb_endpoints": [
			{"endpoint": {"address": {"socket_address": {"address": "192.168.1.10", "port_value": 3306}}}},
			{"endpoint": {"address": {"socket_address": {"address": "192.168.1.11", "port_value": 3306}}}}
		]}]
	}
]`,
		"envoy filesystem form with anchors": `
version_info: "1"
resources:
- '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: my-database-service
  metadata:
    filter_metadata:
      io.cilium.l4lb: {vip: "10.1.2.3", port: 3306, protocol: TCP}
  type: EDS
  eds_cluster_config: {service_name: my-database-service}
- '@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  cluster_name: my-database-service
  endpoints:
  - lb_endpoints:
    - endpoint:
        address:
          socket_address: &ep {address: 192.168.1.10, port_value: 3306}
    - endpoint:
        address:
          socket_address: {<<: *ep, address: 192.168.1.11}
`,
	}
	for name, text := range forms {
		t.Run(name, func(t *testing.T) {
			got, err := ParseResources([]byte(text))
			if err != nil {
				t.Fatalf("ParseResources: %v", err)
			}
			checkCFP(t, got)
			for typeURL, byName := range want {
				for n, msg := range byName {
					if !proto.Equal(msg, got[typeURL][n]) {
						t.Errorf("%s %q differs from the CFP's:\n got %v\nwant %v", typeURL, n, got[typeURL][n], msg)
					}
				}
			}
		})
	}
}

func TestParseSkipsEmptyDocuments(t *testing.T) {
	res, err := ParseResources([]byte("# nothing yet\n---\n# still nothing\n---\n"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Len() != 0 {
		t.Fatalf("got %v, want nothing", res)
	}
}

const goodCluster = `
resource:
  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: web
  type: EDS
`

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		text string
		opts []ParseOption
		// want are all substrings of the error.
		want []string
	}{
		{
			name: "unknown top-level field",
			text: goodCluster + `---
# the cluster with a typo
resource:
  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: db
  prot: TCP
`,
			want: []string{`document 2 (cluster "db"): unknown field "prot" (line 11)`},
		},
		{
			name: "a key twice",
			text: "{\"resources\": [{\"@type\": \"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment\", \"clusterName\": \"a\"}],\n" +
				" \"resources\": [{\"@type\": \"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment\", \"clusterName\": \"b\"}]}\n",
			want: []string{`document 1: line 2: key "resources" twice`},
		},
		{
			name: "a field of a resource twice",
			text: "resource:\n  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster\n  name: a\n  name: b\n",
			want: []string{`line 4: key "name" twice`},
		},
		{
			// The line is where the second key is written, not where the
			// anchor it names is.
			name: "a key twice through an alias",
			text: "resource:\n  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster\n  &n name: a\n  type: EDS\n  *n : b\n",
			want: []string{`document 1: line 5: key "name" twice`},
		},
		{
			name: "an unknown key through an alias",
			text: "resource:\n  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster\n  name: &k nme\n  type: EDS\n  *k : b\n",
			want: []string{`document 1 (cluster "nme"): unknown field "nme" (line 5)`},
		},
		{
			// JSON takes U+2028 and U+0085 inside a string as they are,
			// and so does an editor: they break no line.
			name: "line breaks of YAML in a JSON string",
			text: "{\"resources\":[{\"@type\":\"type.googleapis.com/envoy.config.cluster.v3.Cluster\",\"name\":\"a\u2028\u0085b\"},\n" +
				"{\"@type\":\"type.googleapis.com/envoy.config.cluster.v3.Cluster\",\"name\":\"c\",\"x\":1}]}\n",
			want: []string{`document 1, resources[1] (cluster "c"): unknown field "x" (line 2)`},
		},
		{
			// protojson's position is in the JSON made of the resource,
			// not in the file: the error names the field and its line.
			name: "a value of the wrong JSON type",
			text: "{\"resources\": [\n{\"@type\": \"type.googleapis.com/envoy.config.cluster.v3.Cluster\",\n \"name\": \"a\",\n \"connectTimeout\": 5}]}\n",
			want: []string{`document 1, resources[0] (cluster "a"): connectTimeout (line 4): unexpected token 5`},
		},
		{
			name: "a bad value of a well-known type",
			text: goodCluster + "  connect_timeout: x\n",
			want: []string{`document 1 (cluster "web"): connect_timeout (line 6): invalid google.protobuf.Duration value "x"`},
		},
		{
			name: "a bad value of a wrapper",
			text: goodCluster + "  per_connection_buffer_limit_bytes: -1\n",
			want: []string{`document 1 (cluster "web"): per_connection_buffer_limit_bytes (line 6): invalid value for uint32 field value: -1`},
		},
		{
			name: "a bad value deep inside",
			text: goodCluster + "  load_assignment:\n    cluster_name: web\n    endpoints:\n    - lb_endpoints:\n      - endpoint:\n          address:\n" +
				"            socket_address: {address: 10.0.0.1, port_value: p}\n",
			want: []string{`load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value (line 12): invalid value for uint32 field portValue: "p"`},
		},
		{
			name: "a field twice, in both its names",
			text: goodCluster + "  connect_timeout: 1s\n  connectTimeout: 2s\n",
			want: []string{`document 1 (cluster "web"): connectTimeout (line 7): duplicate field "connectTimeout"`},
		},
		{
			name: "an unknown type in an Any",
			text: goodCluster + "  typed_extension_protocol_options:\n    x:\n      '@type': type.googleapis.com/nope.Nope\n",
			want: []string{`typed_extension_protocol_options.x.@type (line 8): unable to resolve "type.googleapis.com/nope.Nope"`},
		},
		{
			name: "a merge of a scalar through an alias",
			text: "resource:\n  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster\n  name: &s a\n  type: EDS\n  <<: *s\n",
			want: []string{`line 5: "<<" must merge a map`},
		},
		{
			name: "unknown nested field",
			text: goodCluster + `---
---
resource:
  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: db
  eds_cluster_config:
    service_nam: db
`,
			want: []string{`document 3 (cluster "db"): unknown field "service_nam" in eds_cluster_config (line 12)`},
		},
		{
			name: "unknown field in a list item",
			text: `
'@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
cluster_name: db
endpoints:
- lb_endpoints:
  - endpoint: {address: {socket_address: {address: 10.0.0.1, port: 80}}}
`,
			want: []string{`document 1 (cluster_load_assignment "db"): unknown field "port" in endpoints[0].lb_endpoints[0].endpoint.address.socket_address (line 6)`},
		},
		{
			name: "wrong value type",
			text: `
'@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
cluster_name: db
endpoints:
- lb_endpoints:
  - endpoint: {address: {socket_address: {address: 10.0.0.1, port_value: eighty}}}
`,
			want: []string{`document 1 (cluster_load_assignment "db"): `, `portValue`, `eighty`},
		},
		{
			name: "envoy validation rule",
			text: `
'@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
cluster_name: db
endpoints:
- lb_endpoints:
  - endpoint: {address: {socket_address: {address: 10.0.0.1, port_value: 70000}}}
`,
			want: []string{`document 1 (cluster_load_assignment "db"): `, `PortValue`, `65535`},
		},
		{
			name: "unknown type",
			text: "resource:\n  '@type': type.googleapis.com/envoy.config.cluster.v3.Clusterr\n  name: db\n",
			want: []string{`document 1 (line 2): unknown @type "type.googleapis.com/envoy.config.cluster.v3.Clusterr"`},
		},
		{
			name: "missing type",
			text: "resource:\n  name: db\n",
			want: []string{`document 1 (line 2): resource has no "@type"`},
		},
		{
			name: "neither resource nor type",
			text: "name: db\n",
			want: []string{`document 1 (line 1): expected a resource`},
		},
		{
			name: "key beside resource",
			text: goodCluster + "version: 3\n",
			want: []string{`document 1 (line 6): unexpected key "version" beside "resource"`},
		},
		{
			name: "no name",
			text: "'@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment\nendpoints: []\n",
			opts: []ParseOption{WithoutValidation()},
			want: []string{`document 1 (cluster_load_assignment): resource has no name (field "cluster_name")`},
		},
		{
			name: "duplicate",
			text: goodCluster + "---\n" + goodCluster,
			want: []string{`document 2 (cluster "web"): duplicate cluster "web", first defined in document 1`},
		},
		{
			name: "duplicate in a list",
			text: "[{'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster, name: a}, {'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster, name: a}]",
			want: []string{`document 1, item 2 (cluster "a"): duplicate cluster "a", first defined in document 1, item 1`},
		},
		{
			name: "yaml syntax",
			text: goodCluster + "---\nresource: {name: [\n",
			want: []string{`document 2: yaml: `},
		},
		{
			name: "scalar document",
			text: "just text\n",
			want: []string{`document 1 (line 1): expected a resource, got "just text"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseResources([]byte(tt.text), tt.opts...)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestWithoutValidationKeepsOutOfRangeValues(t *testing.T) {
	text := `
'@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
cluster_name: db
endpoints:
- lb_endpoints:
  - endpoint: {address: {socket_address: {address: 10.0.0.1, port_value: 70000}}}
`
	res, err := ParseResources([]byte(text), WithoutValidation())
	if err != nil {
		t.Fatal(err)
	}
	cla := res[resource.EndpointType]["db"].(*endpointv3.ClusterLoadAssignment)
	if p := cla.Endpoints[0].LbEndpoints[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); p != 70000 {
		t.Fatalf("port_value = %d", p)
	}
}

func TestLoadFileNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resources.yaml")
	if err := os.WriteFile(path, []byte(goodCluster+"---\n"+goodCluster), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadFile(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+": document 2 (cluster \"web\"): duplicate") {
		t.Fatalf("LoadFile error = %v", err)
	}
}

// A few lines of YAML can name exponentially many nodes through aliases: each
// of these is refused with an error naming the document, quickly and without
// holding the expansion in memory.
func TestParseRefusesAliasBombs(t *testing.T) {
	// nest defines l1 to l30, each ten times the one before, as entries
	// of the form line (with the level, the anchor and the value).
	nest := func(first, line string, level func(prev string) string) string {
		var b strings.Builder
		b.WriteString(first)
		for i := 1; i <= 30; i++ {
			fmt.Fprintf(&b, line, i, i, level(fmt.Sprintf("*l%d", i-1)))
		}
		return b.String()
	}
	ten := func(s string) string { return strings.TrimSuffix(strings.Repeat(s+", ", 10), ", ") }
	cluster := "'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster\nname: x\nmetadata:\n"
	tests := []struct{ name, text string }{
		{"merge keys", cluster + nest("  l0: &l0 {v: 1}\n", "  l%d: &l%d %s\n", func(p string) string { return "{<<: [" + ten(p) + "]}" })},
		{"a long string in nested lists", cluster + nest("  l0: &l0 \""+strings.Repeat("x", 1<<16)+"\"\n", "  l%d: &l%d %s\n", func(p string) string { return "[" + ten(p) + "]" })},
		{"an alias inside the map it names", cluster + "  &a {filter_metadata: {k: {l: [*a]}}}\n"},
		{"an alias inside the list it names", "- &a [*a]\n"},
		{"documents of nested lists", nest("- &l0 [~]\n", "- # %d\n  &l%d %s\n", func(p string) string { return "[" + ten(p) + "]" })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseResources([]byte(tt.text))
			if err == nil || !strings.HasPrefix(err.Error(), "document 1") || !strings.Contains(err.Error(), "too ") {
				t.Fatalf("error %v, want document 1 ... too large or too deeply nested", err)
			}
		})
	}
}

// A program's file, `{"resources": [...]}` in JSON, is read by protojson at
// once; anything else, or anything wrong in it, by the YAML path, which
// says what is wrong.
func TestParseJSONTakesOnlyWholeGoodFiles(t *testing.T) {
	const cluster = `{"@type":"type.googleapis.com/envoy.config.cluster.v3.Cluster","name":"a","type":"EDS",` +
		`"metadata":{"filterMetadata":{"io.cilium.l4lb":{"vip":"10.0.0.1","port":80}}}}`
	const cla = `{"@type":"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment","clusterName":"a"}`
	for _, tc := range []struct {
		name, file string
		taken      bool
	}{
		{"resources", `{"resources":[` + cluster + `,` + cla + `]}`, true},
		{"with version and type", " \n{\"version_info\":\"1\",\"type_url\":\"x\",\"resources\":[" + cla + "]}\n", true},
		{"empty", `{"resources":[]}`, true},
		{"YAML", "resources:\n- " + cluster, false},
		{"a list of resources", `[` + cluster + `]`, false},
		{"resource form", `{"resource":` + cluster + `}`, false},
		{"another key", `{"resources":[],"nonce":"n"}`, false},
		{"resources not a list", `{"resources":{}}`, false},
		{"duplicate", `{"resources":[` + cla + `,` + cla + `]}`, false},
		{"unknown field", `{"resources":[{"@type":"type.googleapis.com/envoy.config.cluster.v3.Cluster","name":"a","nme":"b"}]}`, false},
		{"unknown type", `{"resources":[{"@type":"type.googleapis.com/x.Y","name":"a"}]}`, false},
		{"invalid", `{"resources":[{"@type":"type.googleapis.com/envoy.config.cluster.v3.Cluster","name":""}]}`, false},
		{"not JSON", `{"resources":[` + cluster + `]`, false},
		{"too deep", `{"resources":[],"version_info":` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `}`, false},
		// YAML ends a key 1024 characters after it starts, blanks
		// before the colon included: past that it refuses the file.
		{"blanks before a colon", `{"resources"` + strings.Repeat(" ", 1020) + `:[` + cla + `]}`, false},
		{"blanks before a colon in a resource", `{"resources":[{"@type":"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment","clusterName"` +
			strings.Repeat("\t", 1020) + `:"a"}]}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fast, taken := parseJSON([]byte(tc.file), parseOptions{})
			if taken != tc.taken {
				t.Fatalf("taken by the JSON path: %v, want %v", taken, tc.taken)
			}
			slow, err := parseYAML([]byte(tc.file), parseOptions{})
			if taken && (err != nil || !sameResources(fast, slow, proto.Equal)) {
				t.Fatalf("the YAML path: %v, %v; the JSON path: %v", slow, err, fast)
			}
		})
	}
}

// Any JSON file of the resources form is read as JSON reads it: the same
// resources as protojson makes of the whole file, though the file is one
// that the JSON path leaves to the YAML path. Programs write these escapes
// and characters: PHP escapes "/", Python writes a character past U+FFFF
// as a pair of surrogates, and JSON takes U+2028, U+0085 and DEL as they
// are inside a string, where YAML reads the first two as line breaks.
func TestParseReadsJSONAsJSON(t *testing.T) {
	const cluster = `{"@type":"type.googleapis.com/envoy.config.cluster.v3.Cluster","type":"EDS","name":`
	const route = `{"@type":"type.googleapis.com/envoy.config.route.v3.RouteConfiguration","name":"r","virtualHosts":[{"name":"v",` +
		`"domains":["*"],"routes":[{"match":{"prefix":"/","headers":[{"name":"h","rangeMatch":{"start":"1","end":`
	for _, tc := range []struct{ name, file string }{
		{"escaped slash", `{"resources":[{"@type":"type.googleapis.com\/envoy.config.cluster.v3.Cluster","name":"a\/b"}]}`},
		{"surrogate pair", `{"resources":[` + cluster + `"a\ud83d\ude00"}]}`},
		{"surrogate pair, upper case", `{"resources":[` + cluster + `"a\uD83D\uDE00"}]}`},
		{"line separator", "{\"resources\":[" + cluster + "\"a\u2028b\"}]}"},
		{"paragraph separator", "{\"resources\":[" + cluster + "\"a\u2029b\"}]}"},
		{"next line", "{\"resources\":[" + cluster + "\"a\u0085b\"}]}"},
		{"delete", "{\"resources\":[" + cluster + "\"a\x7fb\"}]}"},
		{"C1 control", "{\"resources\":[" + cluster + "\"a\u0090b\"}]}"},
		{"byte order mark inside", "{\"resources\":[" + cluster + "\"a\ufeffb\"}]}"},
		// YAML reads a number with a point or an exponent as a float64,
		// which holds 15 digits; protojson reads the digits into an int64.
		{"an integer with a point", `{"resources":[` + route + `9007199254740993.0}}]},"directResponse":{"status":200}}]}]}]}`},
		{"an integer with an exponent", `{"resources":[` + route + `123456789012345678e1}}]},"directResponse":{"status":200}}]}]}]}`},
		{"on several lines", "{\"resources\": [\n  " + cluster + "\"a\u0085b\"},\n  " + cluster + "\"c\\/d\"}\n]}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var file discovery.DiscoveryResponse
			if err := protojson.Unmarshal([]byte(tc.file), &file); err != nil {
				t.Fatalf("not JSON of the resources form: %v", err)
			}
			want := Resources{}
			for _, a := range file.GetResources() {
				msg, err := a.UnmarshalNew()
				if err != nil {
					t.Fatal(err)
				}
				if err := want.Add(msg); err != nil {
					t.Fatal(err)
				}
			}
			got, err := ParseResources([]byte(tc.file))
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !sameResources(got, want, proto.Equal) {
				t.Fatalf("read as\n%v\nJSON says\n%v", got, want)
			}
		})
	}
}

// A file of the list alone is split into its resources, each read on its
// own; a list it cannot split is read whole (or by the YAML path).
func TestResourceList(t *testing.T) {
	resources := []topKey{{"resources", '['}}
	for _, tc := range []struct {
		name, file string
		keys       []topKey
		want       []string // nil: not split
	}{
		{"empty", `{"resources":[]}`, resources, []string{}},
		{"two", `{"resources":[{"a":1},{"b":[2,{}]}]}`, resources, []string{`{"a":1}`, `{"b":[2,{}]}`}},
		{"white space", " {\n \"resources\" :\t[ {\"a\":1} ,\r\n{} ]\n}", resources, []string{`{"a":1}`, `{}`}},
		{"brackets and quotes in strings", `{"resources":[{"a":"}]\"{["},{"b":"\\"}]}`, resources, []string{`{"a":"}]\"{["}`, `{"b":"\\"}`}},
		{"other keys", `{"version_info":"1","resources":[{}]}`, []topKey{{"version_info", '"'}, {"resources", '['}}, nil},
		{"a trailing comma", `{"resources":[{},]}`, resources, nil},
		{"no comma", `{"resources":[{} {}]}`, resources, nil},
		{"not an object", `{"resources":[{},1]}`, resources, nil},
		{"unclosed", `{"resources":[{"a":[}]`, resources, nil},
		{"after the list", `{"resources":[{}],}`, resources, nil},
		{"not a list", `{"resources":{}}`, []topKey{{"resources", '{'}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := bytes.Trim([]byte(tc.file), " \r\n")
			elems, ok := resourceList(data, tc.keys)
			if ok != (tc.want != nil) {
				t.Fatalf("split: %v, want %v", ok, tc.want != nil)
			}
			var got []string
			for _, e := range elems {
				got = append(got, string(e))
			}
			if ok && !slices.Equal(got, tc.want) {
				t.Errorf("elements %q, want %q", got, tc.want)
			}
		})
	}
}

// BenchmarkParseResources parses a generated file of N clusters and their
// ClusterLoadAssignments, in JSON (the JSON path) and the same as YAML.
func BenchmarkParseResources(b *testing.B) {
	const n = 10000
	var js, ym strings.Builder
	js.WriteString(`{"resources":[`)
	ym.WriteString("resources:\n")
	for i := range n {
		if i > 0 {
			js.WriteString(",")
		}
		fmt.Fprintf(&js, `{"@type":"type.googleapis.com/envoy.config.cluster.v3.Cluster","name":"s%d","type":"EDS",`+
			`"metadata":{"filterMetadata":{"io.cilium.l4lb":{"vip":"172.16.%d.%d","port":80}}}},`+
			`{"@type":"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment","clusterName":"s%d",`+
			`"endpoints":[{"lbEndpoints":[{"endpoint":{"address":{"socketAddress":{"address":"10.128.%d.%d","portValue":8080}}}}]}]}`,
			i, i/256, i%256, i, i/256, i%256)
		fmt.Fprintf(&ym, "- {'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster, name: s%d, type: EDS, "+
			"metadata: {filter_metadata: {io.cilium.l4lb: {vip: 172.16.%d.%d, port: 80}}}}\n"+
			"- {'@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment, cluster_name: s%d, "+
			"endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 10.128.%d.%d, port_value: 8080}}}}]}]}\n",
			i, i/256, i%256, i, i/256, i%256)
	}
	js.WriteString("]}")
	for _, f := range []struct{ form, data string }{{"json", js.String()}, {"yaml", ym.String()}} {
		b.Run(f.form, func(b *testing.B) {
			for b.Loop() {
				res, err := ParseResources([]byte(f.data))
				if err != nil || res.Len() != 2*n {
					b.Fatalf("%d resources, %v", res.Len(), err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/(2*n), "µs/resource")
		})
	}
}

// A resource of a JSON list is read straight into its type: typeMember
// finds its one "@type" and takes it out, so that what is left is the
// resource's own JSON.
func TestTypeMember(t *testing.T) {
	for _, tc := range []struct {
		name, elem string
		typeURL    string
		rest       string // "": not found
	}{
		{"first", `{"@type":"T","name":"a"}`, "T", `{"name":"a"}`},
		{"between", `{"name":"a","@type":"T","type":"EDS"}`, "T", `{"name":"a","type":"EDS"}`},
		{"last", `{"name":"a", "@type" : "T" }`, "T", `{"name":"a" }`},
		{"alone", "{ \"@type\":\"T\"\n}", "T", "{ \n}"},
		{"beside objects and lists", `{"m":{"@type":"X","l":[1,"]"]},"@type":"T","n":[{}]}`, "T", `{"m":{"@type":"X","l":[1,"]"]},"n":[{}]}`},
		{"after a string that holds one", `{"name":"\"@type\":\"X\"","@type":"T"}`, "T", `{"name":"\"@type\":\"X\""}`},
		{"none", `{"name":"a","m":{"@type":"X"}}`, "", ""},
		{"twice", `{"@type":"T","@type":"T"}`, "", ""},
		{"not a string", `{"@type":1,"name":"a"}`, "", ""},
		{"escaped", `{"@type":"a\"b"}`, "", ""},
		{"empty", `{}`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			typeURL, rest, ok := typeMember([]byte(tc.elem))
			if ok != (tc.rest != "") || typeURL != tc.typeURL || string(rest) != tc.rest {
				t.Fatalf("typeMember: %q, %q, %v; want %q, %q", typeURL, rest, ok, tc.typeURL, tc.rest)
			}
			if ok && !json.Valid(rest) {
				t.Fatalf("what is left is not JSON: %s", rest)
			}
		})
	}
}

// What decodeTyped reads is what protojson and decodeAny make of the same
// JSON as an Any, nested Anys included; a well-known type, whose JSON in
// an Any has its value apart, is left to them.
func TestDecodeTypedReadsAsAnAny(t *testing.T) {
	for _, tc := range []struct {
		name, elem string
		typed      bool
	}{
		{"cluster", `{"@type":"type.googleapis.com/envoy.config.cluster.v3.Cluster","name":"a","type":"EDS","connectTimeout":"1.5s",` +
			`"metadata":{"filterMetadata":{"io.cilium.l4lb":{"vip":"10.0.0.1","port":80,"protocols":["TCP"]}}},` +
			`"transportSocket":{"name":"tls","typedConfig":{"@type":"type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext","sni":"x"}}}`, true},
		{"endpoints", `{"clusterName":"a","@type":"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",` +
			`"endpoints":[{"priority":1,"lbEndpoints":[{"endpoint":{"address":{"socketAddress":{"address":"10.1.0.1","portValue":8080}}},"loadBalancingWeight":3}]}]}`, true},
		{"a well-known type", `{"@type":"type.googleapis.com/google.protobuf.Struct","value":{"a":1}}`, false},
		{"invalid", `{"@type":"type.googleapis.com/envoy.config.cluster.v3.Cluster","name":""}`, false},
		{"unknown field", `{"@type":"type.googleapis.com/envoy.config.cluster.v3.Cluster","name":"a","nme":"b"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a anypb.Any
			anyErr := protojson.Unmarshal([]byte(tc.elem), &a)
			typeURL, rest, ok := typeMember([]byte(tc.elem))
			if !ok {
				t.Fatal("no @type found")
			}
			got := decodeTyped(typeURL, rest, parseOptions{})
			if (got != nil) != tc.typed {
				t.Fatalf("read straight into its type: %v, want %v", got != nil, tc.typed)
			}
			if got == nil {
				return
			}
			if anyErr != nil {
				t.Fatalf("protojson refuses it as an Any: %v", anyErr)
			}
			if want := decodeAny(&a, parseOptions{}); !proto.Equal(got, want) {
				t.Fatalf("read as\n%v\nas an Any\n%v", got, want)
			}
		})
	}
}
