// SPDX-License-Identifier: Apache-2.0

package l4lb_test

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"

	"github.com/cilium/statedb"

	"github.com/l4xds/l4xds/pkg/controlplane"
	"github.com/l4xds/l4xds/pkg/l4lb"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
)

const (
	metadataDoc        = "../../Documentation/metadata.md"
	troubleshootingDoc = "../../Documentation/troubleshooting.md"
)

// docExample is a resources file of a document and the tables that the
// document says the agent then holds.
type docExample struct {
	line      int
	resources string
	tables    []docTable
}

type docTable struct {
	line int
	name string // services, frontends or backends
	text string
}

var (
	exampleMarker = regexp.MustCompile(`^<!-- example -->$`)
	tableMarker   = regexp.MustCompile(`^<!-- table: (services|frontends|backends) -->$`)
	words         = regexp.MustCompile(`\S+`)
)

// readExamples finds the fenced block after each `<!-- example -->` (the
// resources) and after each `<!-- table: NAME -->` (a table of the example
// above it).
func readExamples(t *testing.T, path string) []docExample {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		examples []docExample
		pending  func(line int, block string)
		block    []string
		inBlock  bool
		start    int
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case inBlock && line == "```":
			inBlock = false
			if pending != nil {
				pending(start, strings.Join(block, "\n")+"\n")
				pending = nil
			}
		case inBlock:
			block = append(block, line)
		case strings.HasPrefix(line, "```"):
			inBlock, block, start = true, nil, n
		case exampleMarker.MatchString(line):
			pending = func(line int, text string) {
				examples = append(examples, docExample{line: line, resources: text})
			}
		case tableMarker.MatchString(line):
			if len(examples) == 0 {
				t.Fatalf("%s:%d: a table before any example", path, n)
			}
			name := tableMarker.FindStringSubmatch(line)[1]
			pending = func(line int, text string) {
				ex := &examples[len(examples)-1]
				ex.tables = append(ex.tables, docTable{line: line, name: name, text: text})
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return examples
}

// agent is the control-plane half of an agent: the controller writing the
// load-balancing tables.
type agent struct {
	w    *lb.Writer
	ctrl *l4lb.Controller
}

type noNames struct{}

func (noNames) SetNames(string, []string) {}

func newAgent(t *testing.T) *agent {
	t.Helper()
	w, err := lb.NewWriter(statedb.New())
	if err != nil {
		t.Fatal(err)
	}
	return &agent{w: w, ctrl: l4lb.NewController(l4lb.NewTablesSink(w), noNames{})}
}

// apply sends the clusters of res in one CDS update, then its
// ClusterLoadAssignments in one EDS update, as the xDS client delivers a
// server's first full state, and returns the errors the NACKs carry.
func (a *agent) apply(res controlplane.Resources) []string {
	var errs []string
	for _, typeURL := range []string{xds.ClusterType, xds.EndpointType} {
		u := xds.Update{TypeURL: typeURL}
		for _, name := range slices.Sorted(maps.Keys(res[typeURL])) {
			u.Upserted = append(u.Upserted, xds.Resource{Name: name, Version: "1", Message: res[typeURL][name]})
		}
		var rejected map[string]error
		if typeURL == xds.ClusterType {
			rejected = a.ctrl.HandleClusters(context.Background(), u)
		} else {
			rejected = a.ctrl.HandleEndpoints(context.Background(), u)
		}
		for _, name := range slices.Sorted(maps.Keys(rejected)) {
			errs = append(errs, rejected[name].Error())
		}
	}
	return errs
}

type tableRow interface {
	TableHeader() []string
	TableRow() []string
}

func dump[T tableRow](txn statedb.ReadTxn, tbl statedb.Table[T]) (header []string, rows [][]string) {
	for obj := range tbl.All(txn) {
		header = obj.TableHeader()
		rows = append(rows, obj.TableRow())
	}
	return header, rows
}

func (a *agent) table(name string) (header []string, rows [][]string) {
	txn := a.w.ReadTxn()
	switch name {
	case "services":
		return dump(txn, a.w.Services())
	case "frontends":
		return dump(txn, a.w.Frontends())
	default:
		return dump(txn, a.w.Backends())
	}
}

// splitTable splits a table as `l4xds-dbg statedb` prints it into its
// header and cells, by the columns' positions in the header (a cell may be
// empty or hold spaces).
func splitTable(text string) (header []string, rows [][]string) {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	var pos []int
	for _, f := range words.FindAllStringIndex(lines[0], -1) {
		header = append(header, lines[0][f[0]:f[1]])
		pos = append(pos, f[0])
	}
	for _, line := range lines[1:] {
		row := make([]string, len(pos))
		for i, p := range pos {
			end := len(line)
			if i+1 < len(pos) {
				end = min(pos[i+1], len(line))
			}
			if p < len(line) {
				row[i] = strings.TrimSpace(line[p:end])
			}
		}
		rows = append(rows, row)
	}
	return header, rows
}

// render prints rows in the columns of header as `l4xds-dbg statedb`
// does; the Status column, which the datapath fills in, reads Done.
func render(header []string, cols []int, rows [][]string) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 5, 4, 3, ' ', 0)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, row := range rows {
		cells := make([]string, len(cols))
		for i, c := range cols {
			if header[i] == "Status" {
				cells[i] = "Done"
				continue
			}
			cells[i] = row[c]
		}
		fmt.Fprintln(w, strings.Join(cells, "\t"))
	}
	w.Flush()
	return b.String()
}

// TestDocsMetadataExamples: every resources file of metadata.md is served
// as the reference control plane reads it and accepted by the agent without
// a NACK, and the tables the document shows after it are what the agent
// then holds, column by column. The Status column is the datapath's and is
// not compared.
func TestDocsMetadataExamples(t *testing.T) {
	examples := readExamples(t, metadataDoc)
	if len(examples) < 8 {
		t.Fatalf("%s: found %d examples, want one per section", metadataDoc, len(examples))
	}
	for _, ex := range examples {
		t.Run(fmt.Sprintf("line %d", ex.line), func(t *testing.T) {
			res, err := controlplane.ParseResources([]byte(ex.resources))
			if err != nil {
				t.Fatalf("%s:%d: %v", metadataDoc, ex.line, err)
			}
			a := newAgent(t)
			if errs := a.apply(res); len(errs) > 0 {
				t.Fatalf("%s:%d: NACKed: %s", metadataDoc, ex.line, strings.Join(errs, "; "))
			}
			if !slices.ContainsFunc(ex.tables, func(tb docTable) bool { return tb.name == "frontends" }) {
				t.Fatalf("%s:%d: the example shows no frontends table", metadataDoc, ex.line)
			}
			for _, tb := range ex.tables {
				compareTable(t, a, tb)
			}
		})
	}
}

func compareTable(t *testing.T, a *agent, tb docTable) {
	t.Helper()
	docHeader, docRows := splitTable(tb.text)
	header, rows := a.table(tb.name)
	cols := make([]int, len(docHeader))
	for i, name := range docHeader {
		cols[i] = slices.Index(header, name)
		if cols[i] < 0 && len(header) > 0 {
			t.Fatalf("%s:%d: %s has no column %q (columns: %s)", metadataDoc, tb.line, tb.name, name, strings.Join(header, " "))
		}
	}
	ok := len(rows) == len(docRows)
	for r := 0; ok && r < len(rows); r++ {
		for i, name := range docHeader {
			if name != "Status" && docRows[r][i] != rows[r][cols[i]] {
				ok = false
			}
		}
	}
	if !ok {
		t.Errorf("%s:%d: the %s table differs from what the agent holds; it holds:\n%s\nthe document shows:\n%s",
			metadataDoc, tb.line, tb.name, render(docHeader, cols, rows), tb.text)
	}
}

// nackCases are malformed resources, each with a good cluster where a
// ClusterLoadAssignment needs one to be requested. Each must be NACKed with
// exactly one error, and troubleshooting.md must list that error verbatim.
var nackCases = []struct {
	name      string
	resources string
}{
	{"unknown key", cluster(`{ vip: "10.1.2.3", port: 3306, protocl: UDP }`)},
	{"vip and frontends", cluster(`{ vip: "10.1.2.3", frontends: [{ vip: "10.1.2.3", port: 3306 }] }`)},
	{"no vip", cluster(`{ protocol: TCP }`)},
	{"empty", cluster(`{}`)},
	{"vip not a string", cluster(`{ vip: 10, port: 3306 }`)},
	{"vip not an IP", cluster(`{ vip: "db.example.internal", port: 3306 }`)},
	{"vip with a zone", cluster(`{ vip: "fe80::1%eth0", port: 3306 }`)},
	{"vip unspecified", cluster(`{ vip: "0.0.0.0", port: 3306 }`)},
	{"vip multicast", cluster(`{ vip: "239.1.2.3", port: 3306 }`)},
	{"no port", cluster(`{ vip: "10.1.2.3" }`)},
	{"port a word", cluster(`{ vip: "10.1.2.3", port: "mysql" }`)},
	{"port a fraction", cluster(`{ vip: "10.1.2.3", port: 3306.5 }`)},
	{"port out of range", cluster(`{ vip: "10.1.2.3", port: 70000 }`)},
	{"protocol", cluster(`{ vip: "10.1.2.3", port: 3306, protocol: SCTP }`)},
	{"cluster without a namespace", cluster(`{ vip: "10.1.2.3", port: 3306, cluster: prod }`)},
	{"service with a slash", cluster(`{ vip: "10.1.2.3", port: 3306, service: platform/cassandra }`)},
	{"portName with frontends", cluster(`{ frontends: [{ vip: "10.1.2.53", port: 53 }], portName: dns }`)},
	{"one portName for two ports", cluster(`{ frontends: [{ vip: "10.1.2.53", port: 53, portName: dns }, { vip: "10.1.2.53", port: 5353, portName: dns }] }`)},
	{"frontends not a list", cluster(`{ frontends: { vip: "10.1.2.53", port: 53 } }`)},
	{"frontends empty", cluster(`{ frontends: [] }`)},
	{"frontend not a struct", cluster(`{ frontends: [ "10.1.2.53:53" ] }`)},
	{"frontend unknown key", cluster(`{ frontends: [{ vip: "10.1.2.53", port: 53, source_ranges: ["10.0.0.0/8"] }] }`)},
	{"frontend without vip", cluster(`{ frontends: [{ port: 53 }] }`)},
	{"frontend twice", cluster(`{ frontends: [{ vip: "10.1.2.53", port: 53, protocol: UDP }, { vip: "10.1.2.53", port: 53, protocol: udp }] }`)},
	{"target port", cluster(`{ frontends: [{ vip: "10.1.2.80", port: 80, target_port: 0 }] }`)},
	{"source ranges a string", cluster(`{ vip: "10.1.2.3", port: 3306, source_ranges: "10.0.0.0/8" }`)},
	{"source range not a CIDR", cluster(`{ vip: "10.1.2.3", port: 3306, source_ranges: ["10.0.0.1"] }`)},
	{"affinity a number", cluster(`{ vip: "10.1.2.3", port: 3306, session_affinity_timeout: 10800 }`)},
	{"affinity not a duration", cluster(`{ vip: "10.1.2.3", port: 3306, session_affinity_timeout: "3 hours" }`)},
	{"affinity not positive", cluster(`{ vip: "10.1.2.3", port: 3306, session_affinity_timeout: "0s" }`)},
	{"affinity too long", cluster(`{ vip: "10.1.2.3", port: 3306, session_affinity_timeout: "2000000h" }`)},
	{"cluster type", `
'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
name: db
type: LOGICAL_DNS
metadata: { filter_metadata: { io.cilium.l4lb: { vip: "10.1.2.3", port: 3306 } } }
`},
	{"cluster type extension", `
'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
name: db
cluster_type: { name: envoy.clusters.aggregate }
metadata: { filter_metadata: { io.cilium.l4lb: { vip: "10.1.2.3", port: 3306 } } }
`},
	{"EDS service name too long", `
'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
name: db
type: EDS
eds_cluster_config: { service_name: ` + strings.Repeat("x", 4097) + ` }
metadata: { filter_metadata: { io.cilium.l4lb: { vip: "10.1.2.3", port: 3306 } } }
`},
	{"static without load_assignment", `
'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
name: db
metadata: { filter_metadata: { io.cilium.l4lb: { vip: "10.1.2.3", port: 3306 } } }
`},
	{"static with a bad endpoint", `
'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
name: db
type: STATIC
metadata: { filter_metadata: { io.cilium.l4lb: { vip: "10.1.2.3", port: 3306 } } }
load_assignment:
  cluster_name: db
  endpoints:
  - lb_endpoints:
    - endpoint: { address: { socket_address: { address: db-0.example.internal, port_value: 3306 } } }
`},
	{"service named twice", cluster(`{ vip: "10.1.2.3", port: 3306, service: cassandra, namespace: platform }`) + `---
'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
name: db-west
type: EDS
metadata: { filter_metadata: { io.cilium.l4lb: { vip: "10.1.2.4", port: 3306, service: cassandra, namespace: platform } } }
`},
	{"frontend conflict", cluster(`{ vip: "10.1.2.3", port: 3306 }`) + `---
'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
name: db-copy
type: EDS
metadata: { filter_metadata: { io.cilium.l4lb: { vip: "10.1.2.3", port: 3306 } } }
`},
	{"load_balancer_endpoints", cla(`- load_balancer_endpoints: { lb_endpoints: [] }`)},
	{"LEDS", cla(`- leds_cluster_locality_config: { leds_collection_name: db }`)},
	{"endpoint name", cla(`- lb_endpoints: [{ endpoint_name: db-0 }]`)},
	{"pipe", cla(`- lb_endpoints: [{ endpoint: { address: { pipe: { path: /run/db.sock } } } }]`)},
	{"internal address", cla(`- lb_endpoints: [{ endpoint: { address: { envoy_internal_address: { server_listener_name: db } } } }]`)},
	{"no address", cla(`- lb_endpoints: [{ endpoint: {} }]`)},
	{"hostname", cla(`- lb_endpoints: [{ endpoint: { address: { socket_address: { address: db-0.example.internal, port_value: 3306 } } } }]`)},
	{"named port", cla(`- lb_endpoints: [{ endpoint: { address: { socket_address: { address: 192.168.1.10, named_port: mysql } } } }]`)},
	{"no port_value", cla(`- lb_endpoints: [{ endpoint: { address: { socket_address: { address: 192.168.1.10 } } } }]`)},
	{"weight zero", cla(`- lb_endpoints: [{ endpoint: { address: { socket_address: { address: 192.168.1.10, port_value: 3306 } } }, load_balancing_weight: 0 }]`)},
	{"weight too large", cla(`- lb_endpoints: [{ endpoint: { address: { socket_address: { address: 192.168.1.10, port_value: 3306 } } }, load_balancing_weight: 100000 }]`)},
	{"endpoint metadata unknown key", cla(`- lb_endpoints: [{ endpoint: { address: { socket_address: { address: 192.168.1.10, port_value: 3306 } } }, metadata: { filter_metadata: { io.cilium.l4lb: { node: node-a } } } }]`)},
	{"endpoint twice", cla(`- lb_endpoints: [{ endpoint: { address: { socket_address: { address: 192.168.1.10, port_value: 3306 } } } }]
  - lb_endpoints: [{ endpoint: { address: { socket_address: { address: 192.168.1.10, port_value: 3306 } } } }]`)},
}

// cluster is an EDS cluster "db" with md as its io.cilium.l4lb metadata.
func cluster(md string) string {
	return `
'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
name: db
type: EDS
metadata: { filter_metadata: { io.cilium.l4lb: ` + md + ` } }
`
}

// cla is a good cluster "db" and its ClusterLoadAssignment with endpoints.
func cla(endpoints string) string {
	return cluster(`{ vip: "10.1.2.3", port: 3306 }`) + `---
'@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
cluster_name: db
endpoints:
  ` + endpoints + "\n"
}

// docMessage is a message in the first column of a table row of
// troubleshooting.md: | `cluster "db": ...` | ... |
var docMessage = regexp.MustCompile("(?m)^\\| `((?:cluster|cluster_load_assignment) \"[^`]*)` \\|")

// TestDocsNACKMessages: every NACK the l4lb translation sends for a
// malformed cluster or ClusterLoadAssignment is listed in troubleshooting.md
// verbatim, and every such message listed there is one the agent sends.
func TestDocsNACKMessages(t *testing.T) {
	data, err := os.ReadFile(troubleshootingDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	produced := map[string]bool{}
	for _, c := range nackCases {
		t.Run(c.name, func(t *testing.T) {
			// Without the Envoy API's validation: another management
			// server may send what the reference one would refuse to read.
			res, err := controlplane.ParseResources([]byte(c.resources), controlplane.WithoutValidation())
			if err != nil {
				t.Fatalf("%v\n%s", err, c.resources)
			}
			errs := newAgent(t).apply(res)
			if len(errs) != 1 {
				t.Fatalf("want one NACK error, got %d: %q", len(errs), errs)
			}
			produced[errs[0]] = true
			if !strings.Contains(doc, "`"+errs[0]+"`") {
				t.Errorf("%s does not list the NACK error\n\t%s", troubleshootingDoc, errs[0])
			}
		})
	}
	for _, m := range docMessage.FindAllStringSubmatch(doc, -1) {
		if !produced[m[1]] {
			t.Errorf("%s lists a NACK error that no malformed resource of this test produces:\n\t%s", troubleshootingDoc, m[1])
		}
	}
}
