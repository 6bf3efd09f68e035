// SPDX-License-Identifier: Apache-2.0

package l4lb

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
)

// MetadataKey is the filter_metadata key that makes a cluster an L4 load
// balancer.
const MetadataKey = "io.cilium.l4lb"

// ServiceSpec is what one l4lb cluster asks for.
type ServiceSpec struct {
	// Service is named after the cluster; its Source is SourceXDS.
	Service   *loadbalancer.Service
	Frontends []loadbalancer.FrontendParams
	// EDSName is the ClusterLoadAssignment to watch, "" for STATIC clusters.
	EDSName string
	// Backends are the inline load_assignment of a STATIC cluster.
	Backends []loadbalancer.BackendParams
}

// Error is a rejected resource: which one, which field in it, and why.
type Error struct {
	// Kind is "cluster" or "cluster_load_assignment".
	Kind string
	Name string
	// Field is the path of the offending field, such as
	// "io.cilium.l4lb.frontends[1].vip"; empty when the whole resource is
	// at fault.
	Field string
	Err   error
}

func (e *Error) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s %q: %v", e.Kind, e.Name, e.Err)
	}
	return fmt.Sprintf("%s %q: %s: %v", e.Kind, e.Name, e.Field, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// fieldError is an error at a path, before the resource is known.
type fieldError struct {
	path string
	err  error
}

func fieldErrorf(path, format string, args ...any) *fieldError {
	return &fieldError{path: path, err: fmt.Errorf(format, args...)}
}

func (fe *fieldError) in(kind, name string) error {
	return &Error{Kind: kind, Name: name, Field: fe.path, Err: fe.err}
}

var (
	// The naming keys (service, namespace, cluster, portName) are those of
	// the CFP author's prototype.
	serviceKeys  = []string{"vip", "port", "protocol", "frontends", "source_ranges", "session_affinity_timeout", "reject_weight", "service", "namespace", "cluster", "portName", "labels"}
	frontendKeys = []string{"vip", "port", "protocol", "target_port", "portName"}
	// endpointKeys are those of an endpoint's metadata under the same key.
	endpointKeys = []string{"zone", "nodeName"}
)

// Translator translates l4lb clusters and their endpoints under one Config.
type Translator struct{ cfg Config }

// NewTranslator checks cfg.
func NewTranslator(cfg Config) (*Translator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Translator{cfg: cfg}, nil
}

var defaultTranslator = &Translator{cfg: DefaultConfig}

// TranslateCluster translates an l4lb cluster under DefaultConfig.
func TranslateCluster(c *clusterv3.Cluster) (*ServiceSpec, error) {
	return defaultTranslator.Cluster(c)
}

// TranslateEndpoints translates a ClusterLoadAssignment under DefaultConfig.
func TranslateEndpoints(cla *endpointv3.ClusterLoadAssignment) ([]loadbalancer.BackendParams, error) {
	return defaultTranslator.Endpoints(cla)
}

// Cluster translates an l4lb cluster. A cluster without metadata under the
// key is not ours: it returns (nil, nil), never an error. Errors are *Error.
func (t *Translator) Cluster(c *clusterv3.Cluster) (*ServiceSpec, error) {
	md, ours := c.GetMetadata().GetFilterMetadata()[t.cfg.XDSMetadataKey]
	if !ours {
		return nil, nil
	}
	name := c.GetName()
	if name == "" {
		return nil, fieldErrorf("name", "must not be empty").in("cluster", name)
	}
	spec, fe := t.translateMetadata(name, md.GetFields())
	if fe != nil {
		return nil, fe.in("cluster", name)
	}
	if fe := t.translateDiscovery(c, spec); fe != nil {
		return nil, fe.in("cluster", name)
	}
	return spec, nil
}

func (t *Translator) translateMetadata(name string, fields map[string]*structpb.Value) (*ServiceSpec, *fieldError) {
	path := t.cfg.XDSMetadataKey
	if fe := checkKeys(fields, path, serviceKeys); fe != nil {
		return nil, fe
	}
	svc, fe := t.service(name, fields, path)
	if fe != nil {
		return nil, fe
	}
	svcName := svc.Name
	spec := &ServiceSpec{Service: svc}

	if list, ok := fields["frontends"]; ok {
		for _, k := range []string{"vip", "port", "protocol", "portName"} {
			if _, ok := fields[k]; ok {
				return nil, fieldErrorf(path+"."+k, "cannot be combined with frontends (give either vip and port, or frontends)")
			}
		}
		fes, fe := translateFrontends(svcName, list, path+".frontends")
		if fe != nil {
			return nil, fe
		}
		spec.Frontends = fes
	} else {
		_, hasVIP := fields["vip"]
		_, hasPort := fields["port"]
		_, hasProto := fields["protocol"]
		if !hasVIP && !hasPort && !hasProto {
			return nil, fieldErrorf(path, "neither vip nor frontends is set")
		}
		fe, ferr := translateFrontend(svcName, fields, path, false)
		if ferr != nil {
			return nil, ferr
		}
		spec.Frontends = []loadbalancer.FrontendParams{fe}
	}
	for _, fe := range spec.Frontends {
		if fe.PortName != "" {
			if svc.PortNames == nil {
				svc.PortNames = map[string]uint16{}
			}
			svc.PortNames[fe.PortName] = fe.Address.Port
		}
	}

	if v, ok := fields["source_ranges"]; ok {
		ranges, fe := translateSourceRanges(v, path+".source_ranges")
		if fe != nil {
			return nil, fe
		}
		spec.Service.SourceRanges = ranges
	}

	if v, ok := fields["session_affinity_timeout"]; ok {
		d, fe := translateTimeout(v, path+".session_affinity_timeout")
		if fe != nil {
			return nil, fe
		}
		spec.Service.SessionAffinity = true
		spec.Service.SessionAffinityTimeout = d
	}

	if v, ok := fields["reject_weight"]; ok {
		w, fe := weightValue(v, path+".reject_weight")
		if fe != nil {
			return nil, fe
		}
		spec.Service.RejectWeight = w
	}

	if v, ok := fields["labels"]; ok {
		labels, fe := translateLabels(v, path+".labels")
		if fe != nil {
			return nil, fe
		}
		spec.Service.Labels = labels
	}
	return spec, nil
}

// translateLabels reads the service's labels: a struct of strings, each key
// and value as Kubernetes allows them on an object, because inside Cilium
// they are what BGP advertisements and L2 announcement policies select on.
func translateLabels(v *structpb.Value, path string) (map[string]string, *fieldError) {
	st, ok := v.GetKind().(*structpb.Value_StructValue)
	if !ok {
		return nil, fieldErrorf(path, "want a struct of strings, got %s", describe(v))
	}
	fields := st.StructValue.GetFields()
	if len(fields) == 0 {
		return nil, nil
	}
	labels := make(map[string]string, len(fields))
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		val, fe := stringValue(fields[k], path+"."+k)
		if fe != nil {
			return nil, fe
		}
		if err := labelKey(k); err != nil {
			return nil, fieldErrorf(path+"."+k, "key: %w", err)
		}
		if err := labelName(val); val != "" && err != nil {
			return nil, fieldErrorf(path+"."+k, "value %q: %w", val, err)
		}
		labels[k] = val
	}
	return labels, nil
}

// labelKey checks a Kubernetes label key: an optional DNS subdomain prefix
// and a slash, then a name.
func labelKey(k string) error {
	name := k
	if prefix, n, hasPrefix := strings.Cut(k, "/"); hasPrefix {
		name = n
		if prefix == "" || len(prefix) > 253 || !dnsSubdomain.MatchString(prefix) {
			return fmt.Errorf("prefix %q is not a DNS subdomain (lower case letters, digits, '-' and '.', at most 253)", prefix)
		}
	}
	if err := labelName(name); err != nil {
		return fmt.Errorf("name %q: %w", name, err)
	}
	return nil
}

// labelName checks a label's name or (non-empty) value.
func labelName(s string) error {
	if len(s) > 63 || !labelNameChars.MatchString(s) {
		return errors.New("want at most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit")
	}
	return nil
}

var (
	labelNameChars = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsSubdomain   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// service names the cluster's service: the keys service, namespace and
// cluster, else the cluster's name and the configured namespace and cluster.
// An empty value is the default, as in the prototype that introduced them.
func (t *Translator) service(cluster string, fields map[string]*structpb.Value, path string) (*loadbalancer.Service, *fieldError) {
	short, ns, cl := cluster, t.cfg.XDSNamespace, t.cfg.XDSCluster
	for _, p := range []struct {
		key string
		dst *string
	}{{"service", &short}, {"namespace", &ns}, {"cluster", &cl}} {
		v, ok := fields[p.key]
		if !ok {
			continue
		}
		s, fe := stringValue(v, path+"."+p.key)
		if fe != nil {
			return nil, fe
		}
		if s == "" {
			continue
		}
		if err := namePart(s); err != nil {
			return nil, &fieldError{path: path + "." + p.key, err: err}
		}
		*p.dst = s
	}
	if cl != "" && ns == "" {
		return nil, fieldErrorf(path+".cluster", "%q needs a namespace (the namespace key or --xds-namespace)", cl)
	}
	// Cilium's form: "[cluster/]namespace/name". A cluster's own name may
	// hold slashes; Namespace and Cluster say where the prefix ends.
	name := short
	if ns != "" {
		name = ns + "/" + short
		if cl != "" {
			name = cl + "/" + name
		}
	}
	return &loadbalancer.Service{Name: loadbalancer.ServiceName(name), Namespace: ns, Cluster: cl, Source: loadbalancer.SourceXDS}, nil
}

// checkKeys rejects keys not in known, in sorted order so that the error is
// deterministic.
func checkKeys(fields map[string]*structpb.Value, path string, known []string) *fieldError {
	var unknown []string
	for k := range fields {
		if !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	return fieldErrorf(path+"."+unknown[0], "unknown key (known: %s)", strings.Join(known, ", "))
}

func translateFrontends(svc loadbalancer.ServiceName, v *structpb.Value, path string) ([]loadbalancer.FrontendParams, *fieldError) {
	list, ok := v.GetKind().(*structpb.Value_ListValue)
	if !ok {
		return nil, fieldErrorf(path, "want a list, got %s", describe(v))
	}
	items := list.ListValue.GetValues()
	if len(items) == 0 {
		return nil, fieldErrorf(path, "must not be empty")
	}
	fes := make([]loadbalancer.FrontendParams, 0, len(items))
	seen := make(map[loadbalancer.L3n4Addr]int, len(items))
	portNames := map[string]int{}
	for i, item := range items {
		itemPath := fmt.Sprintf("%s[%d]", path, i)
		st, ok := item.GetKind().(*structpb.Value_StructValue)
		if !ok {
			return nil, fieldErrorf(itemPath, "want a struct of vip, port, protocol, target_port, got %s", describe(item))
		}
		fields := st.StructValue.GetFields()
		if fe := checkKeys(fields, itemPath, frontendKeys); fe != nil {
			return nil, fe
		}
		fe, ferr := translateFrontend(svc, fields, itemPath, true)
		if ferr != nil {
			return nil, ferr
		}
		if j, dup := seen[fe.Address]; dup {
			return nil, fieldErrorf(itemPath, "%s duplicates frontends[%d]", fe.Address, j)
		}
		seen[fe.Address] = i
		// A port name names one port (TCP and UDP of DNS may share it).
		if j, dup := portNames[fe.PortName]; dup && fes[j].Address.Port != fe.Address.Port {
			return nil, fieldErrorf(itemPath+".portName", "%q already names port %d (frontends[%d])", fe.PortName, fes[j].Address.Port, j)
		} else if fe.PortName != "" && !dup {
			portNames[fe.PortName] = i
		}
		fes = append(fes, fe)
	}
	return fes, nil
}

// translateFrontend reads vip, port, protocol and (in a frontends entry)
// target_port from fields at path.
func translateFrontend(svc loadbalancer.ServiceName, fields map[string]*structpb.Value, path string, entry bool) (loadbalancer.FrontendParams, *fieldError) {
	var zero loadbalancer.FrontendParams
	alt := " (or use frontends)"
	if entry {
		alt = ""
	}
	v, ok := fields["vip"]
	if !ok {
		return zero, fieldErrorf(path+".vip", "required%s", alt)
	}
	s, fe := stringValue(v, path+".vip")
	if fe != nil {
		return zero, fe
	}
	vip, fe := parseIP(s, path+".vip")
	if fe != nil {
		return zero, fe
	}

	v, ok = fields["port"]
	if !ok {
		return zero, fieldErrorf(path+".port", "required")
	}
	port, fe := portValue(v, path+".port")
	if fe != nil {
		return zero, fe
	}

	proto := loadbalancer.TCP
	if v, ok := fields["protocol"]; ok {
		s, fe := stringValue(v, path+".protocol")
		if fe != nil {
			return zero, fe
		}
		p, err := loadbalancer.ParseL4Type(s)
		if err != nil {
			return zero, &fieldError{path: path + ".protocol", err: err}
		}
		proto = p
	}

	var target uint16
	if v, ok := fields["target_port"]; ok {
		if target, fe = portValue(v, path+".target_port"); fe != nil {
			return zero, fe
		}
	}

	var portName string
	if v, ok := fields["portName"]; ok {
		if portName, fe = stringValue(v, path+".portName"); fe != nil {
			return zero, fe
		}
	}

	return loadbalancer.FrontendParams{
		Address:     loadbalancer.NewL3n4Addr(vip, port, proto),
		Type:        loadbalancer.SVCTypeLoadBalancer,
		ServiceName: svc,
		PortName:    portName,
		ServicePort: target,
	}, nil
}

func translateSourceRanges(v *structpb.Value, path string) ([]netip.Prefix, *fieldError) {
	list, ok := v.GetKind().(*structpb.Value_ListValue)
	if !ok {
		return nil, fieldErrorf(path, "want a list of CIDR strings, got %s", describe(v))
	}
	var ranges []netip.Prefix
	for i, item := range list.ListValue.GetValues() {
		itemPath := fmt.Sprintf("%s[%d]", path, i)
		s, fe := stringValue(item, itemPath)
		if fe != nil {
			return nil, fe
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fieldErrorf(itemPath, "%q is not a CIDR", s)
		}
		// Host bits are ignored, as Kubernetes' loadBalancerSourceRanges
		// does; duplicates would only waste datapath entries.
		p = p.Masked()
		if !slices.Contains(ranges, p) {
			ranges = append(ranges, p)
		}
	}
	return ranges, nil
}

func translateTimeout(v *structpb.Value, path string) (time.Duration, *fieldError) {
	s, fe := stringValue(v, path)
	if fe != nil {
		return 0, fe
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fieldErrorf(path, "%q is not a duration (like \"3h\" or \"10800s\")", s)
	}
	if d <= 0 {
		return 0, fieldErrorf(path, "%q must be positive", s)
	}
	// The datapath keeps the timeout in 32-bit seconds.
	if d > math.MaxUint32*time.Second {
		return 0, fieldErrorf(path, "%q is too long (at most %s)", s, time.Duration(math.MaxUint32)*time.Second)
	}
	return d, nil
}

func stringValue(v *structpb.Value, path string) (string, *fieldError) {
	s, ok := v.GetKind().(*structpb.Value_StringValue)
	if !ok {
		return "", fieldErrorf(path, "want a string, got %s", describe(v))
	}
	return s.StringValue, nil
}

// portValue reads a port. Struct numbers are float64: anything that is not
// an integer in 1..65535 is an error, never rounded. A string of decimal
// digits ("8080") is read as its number, as the prototype that introduced
// the naming keys reads it.
func portValue(v *structpb.Value, path string) (uint16, *fieldError) {
	return uint16Value(v, path, 1)
}

// weightValue reads a weight on the scale of the endpoints'
// load_balancing_weight: 0..65535.
func weightValue(v *structpb.Value, path string) (uint16, *fieldError) {
	return uint16Value(v, path, 0)
}

// uint16Value reads an integer lo..65535.
func uint16Value(v *structpb.Value, path string, lo float64) (uint16, *fieldError) {
	var f float64
	switch k := v.GetKind().(type) {
	case *structpb.Value_NumberValue:
		f = k.NumberValue
	case *structpb.Value_StringValue:
		u, err := strconv.ParseUint(k.StringValue, 10, 32)
		if err != nil {
			return 0, fieldErrorf(path, "want a number, got %s", describe(v))
		}
		f = float64(u)
	default:
		return 0, fieldErrorf(path, "want a number, got %s", describe(v))
	}
	if math.IsNaN(f) || math.IsInf(f, 0) || f != math.Trunc(f) {
		return 0, fieldErrorf(path, "%s is not an integer", formatNumber(f))
	}
	if f < lo || f > 65535 {
		return 0, fieldErrorf(path, "%s is out of range %s..65535", formatNumber(f), formatNumber(lo))
	}
	return uint16(f), nil
}

// parseIP parses a VIP or backend address: an IPv4 or IPv6 literal that can
// be a packet's destination.
func parseIP(s, path string) (netip.Addr, *fieldError) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fieldErrorf(path, "%q is not an IP address", s)
	}
	switch {
	case ip.Zone() != "":
		return netip.Addr{}, fieldErrorf(path, "%q has a zone, which is not supported", s)
	case ip.Unmap().IsUnspecified():
		return netip.Addr{}, fieldErrorf(path, "%q is the unspecified address", s)
	case ip.Unmap().IsMulticast():
		return netip.Addr{}, fieldErrorf(path, "%q is a multicast address", s)
	}
	return ip.Unmap(), nil
}

func formatNumber(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// describe names a Struct value for "want X, got Y" errors.
func describe(v *structpb.Value) string {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return fmt.Sprintf("string %q", k.StringValue)
	case *structpb.Value_NumberValue:
		return "number " + formatNumber(k.NumberValue)
	case *structpb.Value_BoolValue:
		return "bool " + strconv.FormatBool(k.BoolValue)
	case *structpb.Value_ListValue:
		return "a list"
	case *structpb.Value_StructValue:
		return "a struct"
	}
	return "null"
}

// translateDiscovery fills in where the backends come from.
func (t *Translator) translateDiscovery(c *clusterv3.Cluster, spec *ServiceSpec) *fieldError {
	if ct, ok := c.GetClusterDiscoveryType().(*clusterv3.Cluster_ClusterType); ok {
		return fieldErrorf("type", "cluster_type extension %q is not supported (want EDS or STATIC)", ct.ClusterType.GetName())
	}
	switch typ := c.GetType(); typ {
	case clusterv3.Cluster_EDS:
		// An inline load_assignment of an EDS cluster is ignored, as Envoy
		// does.
		spec.EDSName = c.GetEdsClusterConfig().GetServiceName()
		if spec.EDSName == "" {
			spec.EDSName = c.GetName()
		}
		// The client would reject the ClusterLoadAssignment of that name.
		if n := len(spec.EDSName); n > xds.MaxNameLength {
			return fieldErrorf("eds_cluster_config.service_name", "%d bytes is longer than %d", n, xds.MaxNameLength)
		}
	case clusterv3.Cluster_STATIC:
		la := c.GetLoadAssignment()
		if la == nil {
			// Also catches a forgotten "type: EDS": STATIC is the default.
			return fieldErrorf("load_assignment", "required for a STATIC cluster (or set type: EDS)")
		}
		bes, fe := t.translateCLA(la, "load_assignment.")
		if fe != nil {
			return fe
		}
		spec.Backends = bes
	default:
		return fieldErrorf("type", "%s is not supported (want EDS or STATIC)", typ)
	}
	return nil
}

// Endpoints translates a ClusterLoadAssignment into backends, in its
// order. Errors are *Error.
func (t *Translator) Endpoints(cla *endpointv3.ClusterLoadAssignment) ([]loadbalancer.BackendParams, error) {
	name := cla.GetClusterName()
	if name == "" {
		return nil, fieldErrorf("cluster_name", "must not be empty").in("cluster_load_assignment", name)
	}
	bes, fe := t.translateCLA(cla, "")
	if fe != nil {
		return nil, fe.in("cluster_load_assignment", name)
	}
	return bes, nil
}

// translateCLA translates the endpoints of cla; prefix is the path of cla
// in its resource ("" or "load_assignment."). Paths are formatted only for
// an error: a CLA may hold thousands of endpoints.
//
// DEGRADED endpoints are Envoy's fallback: used only when there are not
// enough healthy ones. Our selection has no partial spill-over, so they take
// new flows only when no healthy endpoint of their IP family is left, and
// are in maintenance (kept, no new flows) otherwise.
func (t *Translator) translateCLA(cla *endpointv3.ClusterLoadAssignment, prefix string) ([]loadbalancer.BackendParams, *fieldError) {
	lles := cla.GetEndpoints()
	total := 0
	for _, lle := range lles {
		total += len(lle.GetLbEndpoints())
	}
	bes := make([]loadbalancer.BackendParams, 0, total)
	// seen is the (locality, endpoint) index of each address.
	seen := make(map[loadbalancer.L3n4Addr][2]int, total)
	var degraded []int
	var healthy4, healthy6 bool
	for i, lle := range lles {
		switch lle.GetLbConfig().(type) {
		case *endpointv3.LocalityLbEndpoints_LoadBalancerEndpoints:
			return nil, fieldErrorf(fmt.Sprintf("%sendpoints[%d].load_balancer_endpoints", prefix, i), "is not supported (use lb_endpoints)")
		case *endpointv3.LocalityLbEndpoints_LedsClusterLocalityConfig:
			return nil, fieldErrorf(fmt.Sprintf("%sendpoints[%d].leds_cluster_locality_config", prefix, i), "LEDS is not supported (use lb_endpoints)")
		}
		for j, lbe := range lle.GetLbEndpoints() {
			be, isDegraded, fe := t.translateLbEndpoint(lbe)
			if fe != nil {
				fe.path = endpointPath(prefix, i, j) + fe.path
				return nil, fe
			}
			be.Priority = lle.GetPriority()
			if be.Zone == "" {
				be.Zone = lle.GetLocality().GetZone()
			}
			if other, dup := seen[be.Address]; dup {
				return nil, fieldErrorf(endpointPath(prefix, i, j)+".endpoint.address.socket_address", "%s duplicates %s",
					be.Address, endpointPath("", other[0], other[1]))
			}
			seen[be.Address] = [2]int{i, j}
			switch {
			case isDegraded:
				degraded = append(degraded, len(bes))
			case be.State == loadbalancer.BackendStateActive && be.Address.Addr.Is4():
				healthy4 = true
			case be.State == loadbalancer.BackendStateActive:
				healthy6 = true
			}
			bes = append(bes, be)
		}
	}
	for _, k := range degraded {
		healthy := healthy6
		if bes[k].Address.Addr.Is4() {
			healthy = healthy4
		}
		if healthy {
			bes[k].State = loadbalancer.BackendStateMaintenance
		}
	}
	return bes, nil
}

func endpointPath(prefix string, locality, endpoint int) string {
	return fmt.Sprintf("%sendpoints[%d].lb_endpoints[%d]", prefix, locality, endpoint)
}

// translateLbEndpoint translates one endpoint, and says whether it is
// DEGRADED; the paths of its errors are relative to the endpoint
// (".endpoint.address...").
func (t *Translator) translateLbEndpoint(lbe *endpointv3.LbEndpoint) (loadbalancer.BackendParams, bool, *fieldError) {
	be, fe := t.translateLbEndpointAddress(lbe)
	if fe != nil {
		return be, false, fe
	}
	if md, ok := lbe.GetMetadata().GetFilterMetadata()[t.cfg.XDSMetadataKey]; ok {
		path := ".metadata.filter_metadata." + t.cfg.XDSMetadataKey
		fields := md.GetFields()
		if fe := checkKeys(fields, path, endpointKeys); fe != nil {
			return be, false, fe
		}
		// The endpoint's zone overrides its locality's.
		if v, ok := fields["zone"]; ok {
			if be.Zone, fe = stringValue(v, path+".zone"); fe != nil {
				return be, false, fe
			}
		}
		if v, ok := fields["nodeName"]; ok {
			if be.NodeName, fe = stringValue(v, path+".nodeName"); fe != nil {
				return be, false, fe
			}
		}
	}
	return be, lbe.GetHealthStatus() == corev3.HealthStatus_DEGRADED, nil
}

func (t *Translator) translateLbEndpointAddress(lbe *endpointv3.LbEndpoint) (loadbalancer.BackendParams, *fieldError) {
	var zero loadbalancer.BackendParams
	if _, named := lbe.GetHostIdentifier().(*endpointv3.LbEndpoint_EndpointName); named {
		return zero, fieldErrorf(".endpoint_name", "named endpoints are not supported (use endpoint)")
	}
	const apath = ".endpoint.address"
	var sa *corev3.SocketAddress
	switch a := lbe.GetEndpoint().GetAddress().GetAddress().(type) {
	case *corev3.Address_SocketAddress:
		sa = a.SocketAddress
	case *corev3.Address_Pipe:
		return zero, fieldErrorf(apath+".pipe", "pipe addresses are not supported (use socket_address)")
	case *corev3.Address_EnvoyInternalAddress:
		return zero, fieldErrorf(apath+".envoy_internal_address", "internal addresses are not supported (use socket_address)")
	}
	const sapath = apath + ".socket_address"
	if sa == nil {
		return zero, fieldErrorf(sapath, "required")
	}
	ip, fe := parseIP(sa.GetAddress(), sapath+".address")
	if fe != nil {
		return zero, fe
	}
	if _, named := sa.GetPortSpecifier().(*corev3.SocketAddress_NamedPort); named {
		return zero, fieldErrorf(sapath+".named_port", "named ports are not supported (use port_value)")
	}
	if p := sa.GetPortValue(); p < 1 || p > 65535 {
		return zero, fieldErrorf(sapath+".port_value", "%d is out of range 1..65535", p)
	}

	weight := uint32(1)
	if w := lbe.GetLoadBalancingWeight(); w != nil {
		weight = w.GetValue()
		if weight < 1 || weight > 65535 {
			return zero, fieldErrorf(".load_balancing_weight", "%d is out of range 1..65535", weight)
		}
	}

	state, err := backendState(lbe.GetHealthStatus())
	if err != nil {
		return zero, &fieldError{path: ".health_status", err: err}
	}

	return loadbalancer.BackendParams{
		Address: loadbalancer.NewL3n4Addr(ip, uint16(sa.GetPortValue()), loadbalancer.ANY),
		Weight:  uint16(weight),
		State:   state,
	}, nil
}

// backendState maps Envoy's health status onto Cilium's backend states.
func backendState(hs corev3.HealthStatus) (loadbalancer.BackendState, error) {
	switch hs {
	case corev3.HealthStatus_UNKNOWN, corev3.HealthStatus_HEALTHY, corev3.HealthStatus_DEGRADED:
		return loadbalancer.BackendStateActive, nil
	case corev3.HealthStatus_DRAINING:
		return loadbalancer.BackendStateTerminating, nil
	case corev3.HealthStatus_UNHEALTHY, corev3.HealthStatus_TIMEOUT:
		return loadbalancer.BackendStateQuarantined, nil
	}
	return 0, errors.New(strconv.Itoa(int(hs)) + " is not a known health status")
}
