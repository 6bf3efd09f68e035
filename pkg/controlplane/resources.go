// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf16"
	"unicode/utf8"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	yaml "go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/l4xds/l4xds/pkg/xds"

	// Register the message types a resource file may name in '@type',
	// including those commonly nested in a Cluster's typed_config fields.
	_ "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// Resources is a full set of xDS resources: type URL -> resource name ->
// message. Messages put in a Resources must not be modified afterwards; a
// Server shares them with its clients.
type Resources map[string]map[string]proto.Message

// Add puts msg under its type URL and name (Cluster name, or cluster_name for
// a ClusterLoadAssignment). It fails when msg has no name or when a resource
// of the same type and name is already present.
func (r Resources) Add(msg proto.Message) error {
	typeURL := typeURLOf(msg)
	name := cache.GetResourceName(msg)
	if name == "" {
		return fmt.Errorf("%s: resource has no name (field %q)", kindOf(msg), nameField(msg))
	}
	if _, dup := r[typeURL][name]; dup {
		return fmt.Errorf("duplicate %s %q", kindOf(msg), name)
	}
	if r[typeURL] == nil {
		r[typeURL] = map[string]proto.Message{}
	}
	r[typeURL][name] = msg
	return nil
}

// Len is the number of resources of all types.
func (r Resources) Len() int {
	n := 0
	for _, byName := range r {
		n += len(byName)
	}
	return n
}

func typeURLOf(msg proto.Message) string {
	return "type.googleapis.com/" + string(msg.ProtoReflect().Descriptor().FullName())
}

// ParseOption changes how ParseResources decodes.
type ParseOption func(*parseOptions)

type parseOptions struct {
	skipValidation bool
}

// WithoutValidation skips the protoc-gen-validate rules of the Envoy API
// (port ranges, required names, ...). Useful to serve deliberately broken
// resources, for example to test how a client NACKs them.
func WithoutValidation() ParseOption {
	return func(o *parseOptions) { o.skipValidation = true }
}

// LoadFile reads and parses a resource file. Errors start with the path.
func LoadFile(path string, opts ...ParseOption) (Resources, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	res, err := ParseResources(data, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return res, nil
}

// ParseResources decodes a resource file: a stream of YAML documents
// separated by "---", or JSON (JSON is read as YAML, its strings as JSON
// reads them, but for a good file of the `resources` form: parseJSON).
// Each document is one of
//
//   - `resource: {'@type': ..., ...}`, the form of the CFP's example;
//   - a bare resource, `{'@type': ..., ...}`;
//   - `resources: [...]`, Envoy's filesystem subscription form, a list of
//     bare resources (version_info and type_url beside it are ignored);
//   - a list of any of the above.
//
// Fields may be spelled in proto (snake_case) or JSON (camelCase) form.
// Documents holding only comments are skipped. Errors name the document
// (1-based, as separated by "---"), the resource and, where it can be found,
// the field and its line.
func ParseResources(data []byte, opts ...ParseOption) (Resources, error) {
	var o parseOptions
	for _, opt := range opts {
		opt(&o)
	}
	if res, ok := parseJSON(data, o); ok {
		return res, nil
	}
	return parseYAML(data, o)
}

// parseYAML is ParseResources for any file: every form, YAML's aliases and
// merge keys, and errors that name the document, resource, field and line.
func parseYAML(data []byte, o parseOptions) (Resources, error) {
	data = jsonForYAML(data)
	p := parser{opts: o, res: Resources{}, firstSeen: map[string]string{}}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for doc := 1; ; doc++ {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		p.budget = budget{nodes: maxNodes}
		if err := p.document(fmt.Sprintf("document %d", doc), &n); err != nil {
			return nil, err
		}
	}
	return p.res, nil
}

// jsonForYAML returns a file that is one JSON value, a byte order mark
// allowed before it, rewritten so that YAML reads it as JSON does: in its
// strings, an escaped "/" becomes "/", an escaped pair of surrogates one
// \U escape, and the characters YAML refuses (DEL, C1 controls, U+FFFE,
// U+FFFF) or reads as line breaks (U+0085, U+2028, U+2029) \u escapes.
// Lines stay as they are, so YAML's line numbers are an editor's. Any
// other file is returned as it is.
func jsonForYAML(data []byte) []byte {
	body := bytes.TrimPrefix(data, []byte("\ufeff"))
	if !json.Valid(body) {
		return data
	}
	start := len(data) - len(body)
	var out []byte // nil while nothing is rewritten
	done := 0      // data[:done] is in out
	rewrite := func(from, to int, with string) {
		if out == nil {
			out = make([]byte, 0, len(data)+64)
		}
		out = append(append(out, data[done:from]...), with...)
		done = to
	}
	inString := false
	for i := start; i < len(data); {
		c := data[i]
		switch {
		case c == '"':
			inString = !inString
			i++
		case !inString:
			i++
		case c == '\\' && data[i+1] == '/':
			rewrite(i, i+2, "/")
			i += 2
		case c == '\\' && data[i+1] == 'u':
			// A valid file has four hex digits after \u.
			hi, _ := strconv.ParseUint(string(data[i+2:i+6]), 16, 32)
			if utf16.IsSurrogate(rune(hi)) && i+12 <= len(data) && data[i+6] == '\\' && data[i+7] == 'u' {
				lo, err := strconv.ParseUint(string(data[i+8:i+12]), 16, 32)
				if r := utf16.DecodeRune(rune(hi), rune(lo)); err == nil && r != utf8.RuneError {
					rewrite(i, i+12, fmt.Sprintf(`\U%08X`, r))
					i += 12
					continue
				}
			}
			i += 6
		case c == '\\':
			i += 2
		case c == 0x7f:
			rewrite(i, i+1, `\u007F`)
			i++
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(data[i:])
			if r >= 0x80 && r <= 0x9f || r == 0x2028 || r == 0x2029 || r == 0xfffe || r == 0xffff {
				rewrite(i, i+size, fmt.Sprintf(`\u%04X`, r))
			}
			i += size
		}
	}
	if out == nil {
		return data
	}
	return append(out, data[done:]...)
}

// parseJSON is ParseResources for the form a program writes: one JSON
// object, `{"resources": [...]}`, read by protojson at once (a DiscoveryResponse
// has that field), without the YAML node tree and the re-encoding of every
// resource, which are most of the time a large file takes. It takes a file
// only when the whole of it is good, and reports false otherwise: parseYAML
// then reads it and says what is wrong. The two make the same resources of
// what both accept (FuzzParseResources).
func parseJSON(data []byte, o parseOptions) (Resources, bool) {
	// Only what YAML too reads as blank: a tab cannot start a line of YAML.
	data = bytes.Trim(data, " \r\n")
	// Past this size parseYAML's budget may refuse what protojson takes:
	// it spends less than one node per byte of JSON.
	if len(data) == 0 || data[0] != '{' || data[len(data)-1] != '}' || len(data) > maxNodes {
		return nil, false
	}
	keys, plain := plainJSON(data)
	if !plain {
		return nil, false
	}
	// The keys parseYAML allows beside "resources", whose value is a list.
	list := false
	for _, k := range keys {
		switch k.name {
		case "resources":
			list = k.value == '['
		case "version_info", "versionInfo", "type_url", "typeUrl":
		default:
			return nil, false
		}
	}
	if !list {
		return nil, false
	}
	// A file of the list alone is read a resource at a time, on every core;
	// any other form (or a list this cannot split) whole, and its resources
	// decoded on every core.
	var (
		n      int
		decode func(i int) proto.Message
	)
	//
	// protojson takes some JSON that is not (a number "1E" in an Any), which
	// YAML reads otherwise: what it reads must be valid JSON first.
	if elems, ok := resourceList(data, keys); ok {
		n, decode = len(elems), func(i int) proto.Message {
			if !json.Valid(elems[i]) {
				return nil
			}
			if typeURL, rest, ok := typeMember(elems[i]); ok {
				if msg := decodeTyped(typeURL, rest, o); msg != nil {
					return msg
				}
			}
			var a anypb.Any
			if protojson.Unmarshal(elems[i], &a) != nil {
				return nil
			}
			return decodeAny(&a, o)
		}
	} else {
		var file discovery.DiscoveryResponse
		if !json.Valid(data) || protojson.Unmarshal(data, &file) != nil {
			return nil, false
		}
		anys := file.GetResources()
		n, decode = len(anys), func(i int) proto.Message { return decodeAny(anys[i], o) }
	}
	msgs := make([]proto.Message, n)
	if !parallel(n, func(i int) bool {
		msgs[i] = decode(i)
		return msgs[i] != nil
	}) {
		return nil, false
	}
	res := Resources{}
	for _, msg := range msgs {
		if cache.GetResourceName(msg) == "" || res.Add(msg) != nil {
			return nil, false // unnamed, or a duplicate
		}
	}
	return res, true
}

// decodeAny is the resource a of a JSON file, validated; nil if it is not
// one.
func decodeAny(a *anypb.Any, o parseOptions) proto.Message {
	if a.GetTypeUrl() == "" {
		return nil
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(a.GetTypeUrl())
	if err != nil {
		return nil
	}
	msg := mt.New().Interface()
	if proto.Unmarshal(a.GetValue(), msg) != nil {
		return nil
	}
	return validated(msg, o)
}

// decodeTyped is decodeAny for a resource of a JSON list read straight into
// its type: elem without its "@type" member (typeMember). protojson reads
// an Any the same way and then marshals the message, for decodeAny to
// unmarshal it again: two fifths of a large file's parse. Nil if it is not
// a valid resource, and for the well-known types, whose JSON in an Any
// differs.
func decodeTyped(typeURL string, elem []byte, o parseOptions) proto.Message {
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(typeURL)
	if err != nil || mt.Descriptor().ParentFile().Package() == "google.protobuf" {
		return nil
	}
	msg := mt.New().Interface()
	if protojson.Unmarshal(elem, msg) != nil {
		return nil
	}
	return validated(msg, o)
}

// validated is msg if it is valid or validation is off, nil if not.
func validated(msg proto.Message, o parseOptions) proto.Message {
	if v, ok := msg.(interface{ Validate() error }); ok && !o.skipValidation && v.Validate() != nil {
		return nil
	}
	return msg
}

// typeMember finds the one "@type" member of elem, an object of valid plain
// JSON (plainJSON), and returns its value and elem without it. ok is false
// when elem has none, more than one, or one whose value is not a string
// without escapes.
func typeMember(elem []byte) (typeURL string, rest []byte, ok bool) {
	cut, cutEnd := -1, -1
	prevEnd := -1 // just past the previous member's value
	for i := skipBlanks(elem, 1); i < len(elem) && elem[i] == '"'; {
		k := valueEnd(elem, i)
		v := skipBlanks(elem, skipBlanks(elem, k)+1) // past the colon
		e := valueEnd(elem, v)
		next := skipBlanks(elem, e)
		if string(elem[i:k]) == `"@type"` {
			if cut >= 0 || elem[v] != '"' || bytes.IndexByte(elem[v:e], '\\') >= 0 {
				return "", nil, false
			}
			typeURL = string(elem[v+1 : e-1])
			switch {
			case next < len(elem) && elem[next] == ',':
				cut, cutEnd = i, next+1 // the member and its comma
			case prevEnd >= 0:
				cut, cutEnd = prevEnd, e // the last: the comma before it
			default:
				cut, cutEnd = i, e // the only member
			}
		}
		if next >= len(elem) || elem[next] != ',' {
			break
		}
		prevEnd = e
		i = skipBlanks(elem, next+1)
	}
	if cut < 0 {
		return "", nil, false
	}
	return typeURL, append(elem[:cut:cut], elem[cutEnd:]...), true
}

// valueEnd is the index just past the JSON value that starts at data[i], -1
// if it is a string, object or list that does not end: brackets are counted
// outside strings, and a backslash in a string escapes the next byte.
func valueEnd(data []byte, i int) int {
	switch data[i] {
	case '"':
		for i++; i < len(data); i++ {
			switch data[i] {
			case '\\':
				i++
			case '"':
				return i + 1
			}
		}
		return -1
	case '{', '[':
		for depth := 0; i < len(data); i++ {
			switch data[i] {
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			case '"':
				if i = valueEnd(data, i) - 1; i < 0 {
					return -1
				}
			}
		}
		return -1
	}
	for i < len(data) && strings.IndexByte(",}] \t\r\n", data[i]) < 0 {
		i++
	}
	return i
}

// parallel calls do for 0 to n-1, in as many goroutines as there are
// cores, each taking the next range of indexes, and reports whether every
// call returned true. It stops early once one returned false.
func parallel(n int, do func(i int) bool) bool {
	const chunk = 64
	var (
		next   atomic.Int64
		failed atomic.Bool
		wg     sync.WaitGroup
	)
	for range min(runtime.GOMAXPROCS(0), (n+chunk-1)/chunk) {
		wg.Go(func() {
			for !failed.Load() {
				lo := int(next.Add(chunk)) - chunk
				if lo >= n {
					return
				}
				for i := lo; i < min(lo+chunk, n); i++ {
					if !do(i) {
						failed.Store(true)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	return !failed.Load()
}

// resourceList splits data, a JSON object that plainJSON took with the keys
// it found, into the elements of its list when "resources" is its only key
// and every element is an object: `{"resources": [{...}, {...}]}`, white
// space allowed between the tokens. It reports false for anything else, to
// be read whole. protojson reads each element as it would inside the whole:
// the elements are the list's values, with nothing around them.
func resourceList(data []byte, keys []topKey) ([][]byte, bool) {
	if len(keys) != 1 || keys[0].name != "resources" {
		return nil, false
	}
	const key = `"resources"`
	i := skipBlanks(data, 1)
	if !bytes.HasPrefix(data[i:], []byte(key)) {
		return nil, false
	}
	i = skipBlanks(data, i+len(key))
	if i >= len(data) || data[i] != ':' {
		return nil, false
	}
	i = skipBlanks(data, i+1)
	if i >= len(data) || data[i] != '[' {
		return nil, false
	}
	i = skipBlanks(data, i+1)
	var elems [][]byte
	if i < len(data) && data[i] == ']' {
		i++
	} else {
		for {
			end := objectEnd(data, i)
			if end < 0 {
				return nil, false
			}
			elems = append(elems, data[i:end])
			i = skipBlanks(data, end)
			if i >= len(data) {
				return nil, false
			}
			if data[i] == ']' {
				i++
				break
			}
			if data[i] != ',' {
				return nil, false
			}
			i = skipBlanks(data, i+1)
		}
	}
	if skipBlanks(data, i) != len(data)-1 { // the object's closing brace
		return nil, false
	}
	return elems, true
}

// objectEnd is the index just past the object that starts at data[i], -1
// if no object starts there or it does not end.
func objectEnd(data []byte, i int) int {
	if i >= len(data) || data[i] != '{' {
		return -1
	}
	return valueEnd(data, i)
}

// topKey is a key of the outermost object of JSON data, as written, and the
// first byte of its value.
type topKey struct {
	name  string
	value byte
}

// plainJSON returns the keys of the outermost object of JSON data (an
// object), and whether the data is of the plain kind that YAML reads as
// protojson does. It errs towards parseYAML, answering false for
//
//   - bytes other than printable ASCII, tabs and line ends: YAML refuses
//     some control characters and reads some separators as line breaks;
//   - the escapes "\/" and "\u...": YAML lacks the first and refuses
//     surrogates;
//   - a key on another line than its colon, or of more than 1000 bytes
//     with the blanks before its colon (a YAML key ends within 1024
//     characters of its start);
//   - numbers of more than 15 digits, and "-0": YAML reads them as a
//     float64 and as the integer 0, where protojson reads the digits;
//   - nesting deeper than 64, well within parseYAML's bound.
func plainJSON(data []byte) ([]topKey, bool) {
	var keys []topKey
	depth := 0
	for i := 0; i < len(data); i++ {
		switch c := data[i]; {
		case c >= 0x7f || c < ' ' && c != '\t' && c != '\n' && c != '\r':
			return nil, false
		case c == '{' || c == '[':
			if depth++; depth > 64 {
				return nil, false
			}
		case c == '}' || c == ']':
			depth--
		case c == '"':
			start := i
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] >= 0x7f || data[i] < ' ' {
					return nil, false
				}
				if data[i] == '\\' {
					if i++; i < len(data) && (data[i] == '/' || data[i] == 'u') {
						return nil, false
					}
				}
			}
			end := i + 1 // past the closing quote
			j := skipBlanks(data, end)
			if j >= len(data) || data[j] != ':' {
				break // a value, not a key
			}
			if j-start > 1000 || bytes.ContainsAny(data[end:j], "\r\n") {
				return nil, false
			}
			if depth == 1 {
				if v := skipBlanks(data, j+1); v < len(data) {
					keys = append(keys, topKey{name: string(data[start+1 : i]), value: data[v]})
				}
			}
		case c == '-' || c >= '0' && c <= '9':
			j, digits := i, 0
			for ; j < len(data) && strings.IndexByte("+-.0123456789eE", data[j]) >= 0; j++ {
				if data[j] >= '0' && data[j] <= '9' {
					digits++
				}
			}
			if digits > 15 || string(data[i:j]) == "-0" {
				return nil, false
			}
			i = j - 1
		}
	}
	return keys, true
}

// skipBlanks is the index of the first byte of data from i on that is not
// a JSON blank, len(data) if none.
func skipBlanks(data []byte, i int) int {
	for i < len(data) && strings.IndexByte(" \t\r\n", data[i]) >= 0 {
		i++
	}
	return i
}

type parser struct {
	opts parseOptions
	res  Resources
	// firstSeen maps "type URL/name" to the location that defined it, to
	// name both places in a duplicate error.
	firstSeen map[string]string
	// budget bounds the work of the current document.
	budget budget
}

func (p *parser) document(where string, n *yaml.Node) error {
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		n = n.Content[0]
	}
	n = resolveAlias(n)
	if err := p.budget.spend(1); err != nil {
		return fmt.Errorf("%s (line %d): %w", where, n.Line, err)
	}
	if err := p.budget.enter(); err != nil {
		return fmt.Errorf("%s (line %d): %w", where, n.Line, err)
	}
	defer p.budget.leave()
	switch n.Kind {
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return nil // only comments, or an empty document
		}
		return fmt.Errorf("%s (line %d): expected a resource, got %q", where, n.Line, n.Value)
	case yaml.SequenceNode:
		for i, item := range n.Content {
			if err := p.document(where+", item "+strconv.Itoa(i+1), item); err != nil {
				return err
			}
		}
		return nil
	case yaml.MappingNode:
	default:
		return fmt.Errorf("%s (line %d): expected a resource", where, n.Line)
	}

	pairs, err := mappingPairs(n, 0, &p.budget)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if _, ok := lookup(pairs, "@type"); ok {
		return p.resource(where, n)
	}
	if inner, ok := lookup(pairs, "resource"); ok {
		for _, kv := range pairs {
			if kv.key != "resource" {
				return fmt.Errorf("%s (line %d): unexpected key %q beside \"resource\"", where, kv.keyNode.Line, kv.key)
			}
		}
		return p.resource(where, inner)
	}
	if list, ok := lookup(pairs, "resources"); ok {
		for _, kv := range pairs {
			switch kv.key {
			case "resources", "version_info", "versionInfo", "type_url", "typeUrl":
			default:
				return fmt.Errorf("%s (line %d): unexpected key %q beside \"resources\"", where, kv.keyNode.Line, kv.key)
			}
		}
		if list.Kind != yaml.SequenceNode {
			return fmt.Errorf("%s (line %d): \"resources\" must be a list", where, list.Line)
		}
		for i, item := range list.Content {
			if err := p.resource(fmt.Sprintf("%s, resources[%d]", where, i), resolveAlias(item)); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("%s (line %d): expected a resource: a map with \"@type\", or \"resource\" holding one", where, n.Line)
}

// resource decodes one mapping that carries '@type'.
func (p *parser) resource(where string, n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("%s (line %d): a resource must be a map with \"@type\"", where, n.Line)
	}
	pairs, err := mappingPairs(n, 0, &p.budget)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	typeNode, ok := lookup(pairs, "@type")
	if !ok {
		return fmt.Errorf("%s (line %d): resource has no \"@type\"", where, n.Line)
	}
	typeURL := typeNode.Value
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(typeURL)
	if err != nil {
		return fmt.Errorf("%s (line %d): unknown @type %q", where, typeNode.Line, typeURL)
	}
	md := mt.Descriptor()
	kind := xds.KindName(string(md.FullName()))

	// Name the resource in errors before it is decoded, from the raw keys.
	label := kind
	for _, key := range []string{"name", "cluster_name", "clusterName"} {
		if v, ok := lookup(pairs, key); ok && v.Kind == yaml.ScalarNode {
			label = fmt.Sprintf("%s %q", kind, v.Value)
			break
		}
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%s (%s): %s", where, label, fmt.Sprintf(format, args...))
	}

	var buf bytes.Buffer
	if err := writeJSON(&buf, n, true, &p.budget, nil, ""); err != nil {
		return fail("%v", err)
	}
	msg := mt.New().Interface()
	if err := protojson.Unmarshal(buf.Bytes(), msg); err != nil {
		if u, ok := findUnknownField(md, n, "", &p.budget); ok {
			return fail("%s", u)
		}
		return fail("%s", protoError(n, buf.Bytes(), err))
	}
	if !p.opts.skipValidation {
		if v, ok := msg.(interface{ Validate() error }); ok {
			if err := v.Validate(); err != nil {
				return fail("%v", err)
			}
		}
	}
	name := cache.GetResourceName(msg)
	if name == "" {
		return fail("resource has no name (field %q)", nameField(msg))
	}
	key := typeURLOf(msg) + "/" + name
	if first, dup := p.firstSeen[key]; dup {
		return fail("duplicate %s %q, first defined in %s", kind, name, first)
	}
	p.firstSeen[key] = where
	// Store under the canonical URL so that "type.googleapis.com/" and
	// other prefixes land in the same cache.
	return p.res.Add(msg)
}

// kindOf names a message's type in errors, as the agent does.
func kindOf(msg proto.Message) string {
	return xds.KindName(string(msg.ProtoReflect().Descriptor().FullName()))
}

func nameField(msg proto.Message) string {
	if _, ok := msg.(interface{ GetClusterName() string }); ok {
		return "cluster_name"
	}
	return "name"
}

// unknownField is a key that names no field of its message.
type unknownField struct {
	parent string // dotted path of the enclosing message, "" at the top
	key    string
	line   int
}

func (u unknownField) String() string {
	if u.parent == "" {
		return fmt.Sprintf("unknown field %q (line %d)", u.key, u.line)
	}
	return fmt.Sprintf("unknown field %q in %s (line %d)", u.key, u.parent, u.line)
}

// protojson's errors start with "proto:" (followed by a space or a
// non-breaking space) and a position in the JSON we generated, which means
// nothing to the author of the YAML.
var (
	protoErrorPrefix = regexp.MustCompile(`^proto:[\s\x{00a0}]*(syntax error[\s\x{00a0}]*)?(\(line \d+:\d+\):[\s\x{00a0}]*)?`)
	protoErrorColumn = regexp.MustCompile(`^proto:[\s\x{00a0}]*(?:syntax error[\s\x{00a0}]*)?\(line 1:(\d+)\)`)
)

func cleanProtoError(err error) string {
	return protoErrorPrefix.ReplaceAllString(err.Error(), "")
}

// jsonMarker finds the key or value of a resource that writeJSON writes
// at or last before a byte offset of its JSON.
type jsonMarker struct {
	at   int // the offset
	path string
	line int // 0 until one is found
}

func (mk *jsonMarker) mark(offset int, path string, line int) {
	if offset <= mk.at {
		mk.path, mk.line = path, line
	}
}

// errMarked stops writeJSON past its marker's offset.
var errMarked = errors.New("past the marker")

// protoError is protojson's error err about js, the JSON that writeJSON
// made of the resource n, with the field and the line its position falls
// on instead of the position.
func protoError(n *yaml.Node, js []byte, err error) string {
	msg := cleanProtoError(err)
	m := protoErrorColumn.FindStringSubmatch(err.Error())
	if m == nil {
		return msg
	}
	col, _ := strconv.Atoi(m[1])
	mk := jsonMarker{} // js is one line: col counts its runes from 1
	for r := 1; r < col && mk.at < len(js); r++ {
		_, size := utf8.DecodeRune(js[mk.at:])
		mk.at += size
	}
	// Again, up to the offset, marking where each key and value goes.
	var buf bytes.Buffer
	b := budget{nodes: maxNodes}
	if err := writeJSON(&buf, n, true, &b, &mk, ""); err != nil && err != errMarked || mk.line == 0 {
		return msg
	}
	return fmt.Sprintf("%s (line %d): %s", mk.path, mk.line, msg)
}

// A few lines of YAML can name exponentially many nodes through aliases and
// merge keys, so the work is bounded: the nodes and merged keys visited in
// one document, and the JSON written for one resource. Both are far above
// what a file of 100,000 endpoints needs.
const (
	maxNodes     = 10_000_000
	maxJSONBytes = 64 << 20
)

// maxDepth bounds the nesting of one document: an alias inside the node it
// names makes a cycle, which would recurse until the stack overflows.
const maxDepth = 1000

type budget struct{ nodes, depth int }

var (
	errTooLarge = errors.New("document too large after expanding aliases")
	errTooDeep  = errors.New("document nested too deeply (an alias inside the node it names?)")
)

// enter counts one more level of nesting; leave, its undo, is deferred.
func (b *budget) enter() error {
	if b.depth++; b.depth > maxDepth {
		b.depth--
		return errTooDeep
	}
	return nil
}

func (b *budget) leave() { b.depth-- }

func (b *budget) spend(nodes int) error {
	if b.nodes -= nodes; b.nodes < 0 {
		return errTooLarge
	}
	return nil
}

type pair struct {
	key string
	// keyNode is the key as written: an alias, for a key written "*x",
	// whose line is that of the alias, not of its anchor.
	keyNode *yaml.Node
	value   *yaml.Node
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func lookup(pairs []pair, key string) (*yaml.Node, bool) {
	for _, kv := range pairs {
		if kv.key == key {
			return resolveAlias(kv.value), true
		}
	}
	return nil, false
}

// mappingPairs lists a mapping's entries with YAML merge keys ("<<: *x")
// expanded: explicit keys win over merged ones, earlier merges over later.
func mappingPairs(n *yaml.Node, depth int, b *budget) ([]pair, error) {
	if depth > 32 {
		return nil, fmt.Errorf("line %d: merge keys nested too deeply", n.Line)
	}
	if err := b.spend(len(n.Content) / 2); err != nil {
		return nil, err
	}
	var pairs []pair
	var merges []*yaml.Node
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		written, v := n.Content[i], n.Content[i+1]
		k := resolveAlias(written)
		if k.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("line %d: map keys must be plain values", written.Line)
		}
		if k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		// YAML wants a map's keys unique; a decoder into nodes does
		// not check, and lookup would take the first and drop the rest.
		if seen[k.Value] {
			return nil, fmt.Errorf("line %d: key %q twice", written.Line, k.Value)
		}
		seen[k.Value] = true
		pairs = append(pairs, pair{key: k.Value, keyNode: written, value: v})
	}
	for _, v := range merges {
		sources := []*yaml.Node{v}
		if r := resolveAlias(v); r.Kind == yaml.SequenceNode {
			sources = r.Content
		}
		for _, written := range sources {
			src := resolveAlias(written)
			if src.Kind != yaml.MappingNode {
				return nil, fmt.Errorf("line %d: \"<<\" must merge a map", written.Line)
			}
			sub, err := mappingPairs(src, depth+1, b)
			if err != nil {
				return nil, err
			}
			// Deduplicated as they come, so that a map merged many times
			// through aliases holds each key once.
			for _, kv := range sub {
				if !seen[kv.key] {
					seen[kv.key] = true
					pairs = append(pairs, kv)
				}
			}
		}
	}
	return pairs, nil
}

// writeJSON converts a YAML node to JSON. With skipType, the top-level
// "@type" key is left out: the caller already picked the message from it.
// With a marker, it marks where it writes each key and value of n, at
// path, and stops past the marker's offset.
func writeJSON(buf *bytes.Buffer, n *yaml.Node, skipType bool, b *budget, mk *jsonMarker, path string) error {
	if mk != nil && buf.Len() > mk.at {
		return errMarked
	}
	if err := b.spend(1); err != nil {
		return err
	}
	if buf.Len() > maxJSONBytes {
		return errTooLarge
	}
	if err := b.enter(); err != nil {
		return err
	}
	defer b.leave()
	n = resolveAlias(n)
	switch n.Kind {
	case yaml.MappingNode:
		pairs, err := mappingPairs(n, 0, b)
		if err != nil {
			return err
		}
		buf.WriteByte('{')
		first := true
		for _, kv := range pairs {
			if skipType && kv.key == "@type" {
				continue
			}
			if !first {
				buf.WriteByte(',')
			}
			first = false
			var sub string
			if mk != nil {
				if sub = kv.key; path != "" {
					sub = path + "." + kv.key
				}
				mk.mark(buf.Len(), sub, kv.keyNode.Line)
			}
			writeString(buf, kv.key)
			buf.WriteByte(':')
			if mk != nil {
				mk.mark(buf.Len(), sub, kv.value.Line)
			}
			if err := writeJSON(buf, kv.value, false, b, mk, sub); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case yaml.SequenceNode:
		buf.WriteByte('[')
		for i, item := range n.Content {
			if i > 0 {
				buf.WriteByte(',')
			}
			var sub string
			if mk != nil {
				sub = path + "[" + strconv.Itoa(i) + "]"
				mk.mark(buf.Len(), sub, item.Line)
			}
			if err := writeJSON(buf, item, false, b, mk, sub); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case yaml.ScalarNode:
		return writeScalar(buf, n)
	default:
		return fmt.Errorf("line %d: unsupported YAML node", n.Line)
	}
	return nil
}

func writeScalar(buf *bytes.Buffer, n *yaml.Node) error {
	switch n.ShortTag() {
	case "!!null":
		buf.WriteString("null")
	case "!!bool":
		var b bool
		if err := n.Decode(&b); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		buf.WriteString(strconv.FormatBool(b))
	case "!!int":
		if isJSONNumber(n.Value) {
			// As written: "-0" is -0 to protojson in a double.
			buf.WriteString(n.Value)
			break
		}
		var v any // int, int64 or uint64, whichever holds it
		if err := n.Decode(&v); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		out, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		buf.Write(out)
	case "!!float":
		var f float64
		if err := n.Decode(&f); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		switch {
		case !math.IsInf(f, 0) && !math.IsNaN(f) && isJSONNumber(n.Value):
			// As written: protojson reads an integer's digits past the
			// 15 or so that a float64 holds.
			buf.WriteString(n.Value)
		case math.IsNaN(f):
			buf.WriteString(`"NaN"`)
		case math.IsInf(f, 1):
			buf.WriteString(`"Infinity"`)
		case math.IsInf(f, -1):
			buf.WriteString(`"-Infinity"`)
		default:
			buf.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
		}
	default:
		// Strings, and timestamps and binary kept as written: protojson
		// parses RFC 3339 times and base64 itself.
		writeString(buf, n.Value)
	}
	return nil
}

// isJSONNumber reports whether s is a number as JSON writes one.
func isJSONNumber(s string) bool {
	return s != "" && (s[0] == '-' || s[0] >= '0' && s[0] <= '9') && json.Valid([]byte(s))
}

func writeString(buf *bytes.Buffer, s string) {
	out, _ := json.Marshal(s) // cannot fail for a string
	buf.Write(out)
}

// findUnknownField walks n along md's fields, as protojson would, and
// returns the first key that is not a field.
// Well-known types (Struct, Any, Duration, ...) have their own JSON forms
// and are not entered.
func findUnknownField(md protoreflect.MessageDescriptor, n *yaml.Node, path string, b *budget) (unknownField, bool) {
	n = resolveAlias(n)
	if b.spend(1) != nil || b.enter() != nil {
		return unknownField{}, false
	}
	defer b.leave()
	if n.Kind != yaml.MappingNode || strings.HasPrefix(string(md.FullName()), "google.protobuf.") {
		return unknownField{}, false
	}
	pairs, err := mappingPairs(n, 0, b)
	if err != nil {
		return unknownField{}, false
	}
	for _, kv := range pairs {
		if kv.key == "@type" && path == "" {
			continue
		}
		sub := kv.key
		if path != "" {
			sub = path + "." + kv.key
		}
		fd := md.Fields().ByName(protoreflect.Name(kv.key))
		if fd == nil {
			fd = md.Fields().ByJSONName(kv.key)
		}
		if fd == nil {
			return unknownField{parent: path, key: kv.key, line: kv.keyNode.Line}, true
		}
		v := resolveAlias(kv.value)
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() != protoreflect.MessageKind || v.Kind != yaml.MappingNode {
				continue
			}
			entries, err := mappingPairs(v, 0, b)
			if err != nil {
				continue
			}
			for _, e := range entries {
				if u, ok := findUnknownField(fd.MapValue().Message(), e.value, sub+"["+e.key+"]", b); ok {
					return u, true
				}
			}
		case fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind:
		case fd.IsList():
			if v.Kind != yaml.SequenceNode {
				continue
			}
			for i, item := range v.Content {
				if u, ok := findUnknownField(fd.Message(), item, fmt.Sprintf("%s[%d]", sub, i), b); ok {
					return u, true
				}
			}
		default:
			if u, ok := findUnknownField(fd.Message(), v, sub, b); ok {
				return u, true
			}
		}
	}
	return unknownField{}, false
}
