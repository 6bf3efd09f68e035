// SPDX-License-Identifier: Apache-2.0

package loadbalancer

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/statedb/reconciler"
)

// L4Type is the transport protocol of an address.
type L4Type string

const (
	TCP L4Type = "TCP"
	UDP L4Type = "UDP"
	// ANY is the protocol of a backend address: a backend serves whatever
	// protocol the frontend that selects it speaks (one CLA endpoint can back
	// both 53/TCP and 53/UDP).
	ANY L4Type = ""
)

// ParseL4Type parses "TCP" or "UDP", case-insensitively.
func ParseL4Type(s string) (L4Type, error) {
	switch strings.ToUpper(s) {
	case "TCP":
		return TCP, nil
	case "UDP":
		return UDP, nil
	}
	return "", fmt.Errorf("%q is not a protocol (want TCP or UDP)", s)
}

// L3n4Addr is an IP address, an L4 port and a protocol: the identity of a
// frontend, or the address of a backend (with protocol ANY).
type L3n4Addr struct {
	Addr     netip.Addr
	Port     uint16
	Protocol L4Type
}

// NewL3n4Addr returns the address with the IP unmapped (::ffff:a.b.c.d is
// treated as a.b.c.d) so that equal addresses have equal keys.
func NewL3n4Addr(addr netip.Addr, port uint16, proto L4Type) L3n4Addr {
	return L3n4Addr{Addr: addr.Unmap(), Port: port, Protocol: proto}
}

// String formats as "10.1.2.3:3306/TCP", "[2001:db8::1]:53/UDP", or without
// the protocol suffix for a backend ("192.168.1.10:3306").
func (a L3n4Addr) String() string {
	s := netip.AddrPortFrom(a.Addr, a.Port).String()
	if a.Protocol != ANY {
		s += "/" + string(a.Protocol)
	}
	return s
}

// ParseL3n4Addr parses the format of String.
func ParseL3n4Addr(s string) (L3n4Addr, error) {
	addrPort, proto, hasProto := strings.Cut(s, "/")
	ap, err := netip.ParseAddrPort(addrPort)
	if err != nil {
		return L3n4Addr{}, fmt.Errorf("address %q: %w", s, err)
	}
	a := NewL3n4Addr(ap.Addr(), ap.Port(), ANY)
	if hasProto {
		if a.Protocol, err = ParseL4Type(proto); err != nil {
			return L3n4Addr{}, fmt.Errorf("address %q: %w", s, err)
		}
	}
	return a, nil
}

// Compare orders addresses as their keys do: IPv4 before IPv6, then by
// address, port and protocol.
func (a L3n4Addr) Compare(b L3n4Addr) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if a.Port != b.Port {
		if a.Port < b.Port {
			return -1
		}
		return 1
	}
	return int(a.Protocol.key()) - int(b.Protocol.key())
}

// MarshalText makes the address a plain string in JSON and YAML.
func (a L3n4Addr) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText parses the format of String.
func (a *L3n4Addr) UnmarshalText(b []byte) (err error) {
	*a, err = ParseL3n4Addr(string(b))
	return err
}

// Key is the address as an index key: 16 address bytes, port (big endian),
// protocol. IPv4 addresses sort before IPv6 ones.
func (a L3n4Addr) Key() []byte {
	return a.appendKey(make([]byte, 0, l3n4AddrKeyLen))
}

const l3n4AddrKeyLen = 1 + 16 + 2 + 1

// appendKey appends the Key to b, so that keys embedding an address are
// built in one allocation.
func (a L3n4Addr) appendKey(b []byte) []byte {
	ip16 := a.Addr.As16()
	if a.Addr.Is4() {
		b = append(b, 4)
	} else {
		b = append(b, 6)
	}
	b = append(b, ip16[:]...)
	b = append(b, byte(a.Port>>8), byte(a.Port))
	return append(b, a.Protocol.key())
}

func (t L4Type) key() byte {
	switch t {
	case TCP:
		return 6
	case UDP:
		return 17
	}
	return 0
}

// ServiceName names a service: the xDS cluster it was translated from.
type ServiceName string

func (n ServiceName) String() string { return string(n) }

// Source says who owns a row. Rows of one source are replaced and swept
// together; l4xds's only source today is xDS.
type Source string

const SourceXDS Source = "xds"

// SVCType is the type of a frontend.
type SVCType string

const SVCTypeLoadBalancer SVCType = "LoadBalancer"

// Service is a load-balanced service, one per l4lb cluster.
type Service struct {
	Name   ServiceName
	Source Source
	// Namespace and Cluster, when set, qualify Name as Cilium qualifies its
	// service names: Name is then "[Cluster/]Namespace/<service>".
	Namespace string `yaml:"namespace,omitempty"`
	Cluster   string `yaml:"cluster,omitempty"`
	// Labels are free-form annotations (e.g. the xDS resource version).
	Labels map[string]string
	// SourceRanges, when not empty, are the only client prefixes allowed.
	SourceRanges []netip.Prefix `yaml:"sourceRanges"`
	// SessionAffinity pins a client IP to its backend for
	// SessionAffinityTimeout.
	SessionAffinity        bool          `yaml:"sessionAffinity"`
	SessionAffinityTimeout time.Duration `yaml:"sessionAffinityTimeout"`
	// PortNames maps a port name to a frontend port.
	PortNames map[string]uint16 `yaml:"portNames"`
	// RejectWeight is a share of new flows, weighed against the backends'
	// weights, that is refused (TCP RST, ICMP port unreachable) rather
	// than served: a weighted route's share of a backend that does not
	// exist (GEP-2645).
	RejectWeight uint16 `yaml:"rejectWeight"`
}

func (s *Service) Clone() *Service { s2 := *s; return &s2 }

// FrontendParams is what a writer's caller says about a frontend.
type FrontendParams struct {
	Address     L3n4Addr
	Type        SVCType
	ServiceName ServiceName `yaml:"serviceName"`
	PortName    string      `yaml:"portName"`
	// ServicePort, when not zero, replaces the port of every backend of the
	// frontend (the frontend's target_port).
	ServicePort uint16 `yaml:"servicePort"`
}

// Frontend is a row of the frontends table: the params, the backends the
// writer computed for it, and the status of its reconciliation into the
// datapath.
type Frontend struct {
	FrontendParams `yaml:",inline"`
	// Service is the service the frontend belongs to, as last written: a
	// change of the service (source ranges, affinity) rewrites its frontends
	// so that the datapath reconciles them.
	Service *Service `json:"-" yaml:"-"`
	// Backends are the service's backends as this frontend uses them (port
	// replaced by ServicePort), sorted by address. Computed by the Writer.
	Backends []*Backend
	Status   reconciler.Status
}

func (fe *Frontend) Clone() *Frontend { fe2 := *fe; return &fe2 }

// BackendState is the state of a backend, as Cilium's.
type BackendState uint8

const (
	// BackendStateActive backends receive new flows.
	BackendStateActive BackendState = iota
	// BackendStateTerminating backends keep their flows, get no new ones.
	BackendStateTerminating
	// BackendStateQuarantined backends are unhealthy: no new flows.
	BackendStateQuarantined
	// BackendStateMaintenance backends are out of service: no new flows.
	BackendStateMaintenance
)

var backendStateNames = [...]string{"active", "terminating", "quarantined", "maintenance"}

func (s BackendState) String() string {
	if int(s) < len(backendStateNames) {
		return backendStateNames[s]
	}
	return "unknown(" + strconv.Itoa(int(s)) + ")"
}

// MarshalText makes the state its name in JSON and YAML.
func (s BackendState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText parses the output of String.
func (s *BackendState) UnmarshalText(b []byte) (err error) {
	*s, err = ParseBackendState(string(b))
	return err
}

// ParseBackendState parses the output of String.
func ParseBackendState(s string) (BackendState, error) {
	for i, n := range backendStateNames {
		if strings.EqualFold(n, s) {
			return BackendState(i), nil
		}
	}
	return 0, fmt.Errorf("%q is not a backend state", s)
}

// BackendParams is what a writer's caller says about one backend.
type BackendParams struct {
	Address  L3n4Addr
	Weight   uint16
	State    BackendState
	Zone     string
	Priority uint32
	// NodeName is the node the backend runs on, when the control plane
	// says (endpoint metadata nodeName); informational.
	NodeName string `yaml:"nodeName,omitempty"`
}

// Backend is a row of the backends table: one backend of one service from
// one source.
type Backend struct {
	BackendParams `yaml:",inline"`
	ServiceName   ServiceName `yaml:"serviceName"`
	Source        Source
}

// ErrFrontendConflict: the frontend address belongs to another service.
var ErrFrontendConflict = errors.New("frontend already owned by another service")

// ErrServiceOwned: a service of that name belongs to another source (inside
// Cilium, a Kubernetes Service, say), which an upsert would replace.
var ErrServiceOwned = errors.New("service owned by another source")
