// SPDX-License-Identifier: Apache-2.0

package model

import (
	"net/netip"
	"time"
)

// IP protocols the datapath translates.
const (
	ProtoICMP   = 1
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoICMPv6 = 58
)

// BackendState is a backend's state as the control plane says it.
type BackendState uint8

const (
	// Active backends take new and existing flows.
	Active BackendState = iota
	// Terminating backends keep their flows (drain), and take no new one.
	Terminating
	// Quarantined and Maintenance backends take no new flow either.
	Quarantined
	Maintenance
)

// Frontend is what a service answers on: TCP and UDP on one VIP and port
// are two services.
type Frontend struct {
	VIP   netip.Addr
	Port  uint16
	Proto uint8
}

// Backend is one backend of a service.
type Backend struct {
	// ID is the backend's ID in the maps: what conntrack and affinity
	// name.
	ID       uint32
	Addr     netip.AddrPort
	State    BackendState
	Weight   uint16
	Priority uint32
}

// Service is one frontend with what decides where its flows go.
type Service struct {
	// ID is the service's ID in the maps: what conntrack, affinity and
	// the counters are keyed by.
	ID       uint32
	Frontend Frontend
	// Backends in any family; those of the other family than the VIP are
	// never used (the datapath translates addresses, not families).
	Backends []Backend
	// SourceRanges, when not empty, are the only client prefixes
	// served. A range admits clients of its own family only:
	// ::ffff:0:0/96 does not admit IPv4 clients, an IPv4 range does not
	// admit IPv6 clients from IPv4-mapped addresses.
	SourceRanges []netip.Prefix
	// Affinity, when not 0, keeps a client's new flows on the backend of
	// its last established flow for this long (whole seconds, rounded up).
	Affinity time.Duration
	// RejectWeight is the share of new flows refused, in Maglev slots
	// of backend 0, beside the usable backends' weights.
	RejectWeight uint16
	// Table is the Maglev table: slot -> backend ID, 0 for the reject
	// share. A flow's slot is its hash modulo len(Table). Built by the
	// agent from the weights; the model checks that it names usable
	// backends only (CheckTable) but does not rebuild it.
	Table []uint32
}

// Table is the service table: what the control plane asked for, with
// the IDs the agent gave it.
type Table struct {
	Services []*Service
	// RemovedVIPs are VIPs with no service left, and until when (in
	// monotonic ns) their packets are still dropped.
	RemovedVIPs map[netip.Addr]uint64
}

// service returns the service of a frontend.
func (t *Table) service(fe Frontend) *Service {
	for _, s := range t.Services {
		if s.Frontend.Port == fe.Port && s.Frontend.Proto == fe.Proto && addr16(s.Frontend.VIP) == addr16(fe.VIP) {
			return s
		}
	}
	return nil
}

// isVIP says whether some service answers on a.
func (t *Table) isVIP(a netip.Addr) bool {
	for _, s := range t.Services {
		if addr16(s.Frontend.VIP) == addr16(a) {
			return true
		}
	}
	return false
}

// removedVIP says whether a is a VIP removed within its grace period.
func (t *Table) removedVIP(a netip.Addr, now uint64) bool {
	for v, until := range t.RemovedVIPs {
		if addr16(v) == addr16(a) && now < until {
			return true
		}
	}
	return false
}

// backend returns a backend by ID, and its service.
func (t *Table) backend(id uint32) (*Service, *Backend) {
	for _, s := range t.Services {
		if _, b := s.backendByID(id); b != nil {
			return s, b
		}
	}
	return nil, nil
}

// sameFamily says whether a backend can serve the VIP's flows.
func (s *Service) sameFamily(b *Backend) bool {
	return b.Addr.Addr().Unmap().Is4() == s.Frontend.VIP.Unmap().Is4()
}

// takesNewFlows: active and of non-zero weight.
func (b *Backend) takesNewFlows() bool { return b.State == Active && b.Weight > 0 }

// Usable says whether a backend gets new flows: it takes them, is of the
// VIP's family, and of the best (lowest) priority that has such a backend
// (failover: a priority serves only while all better ones have none).
func (s *Service) Usable(b *Backend) bool {
	if !b.takesNewFlows() || !s.sameFamily(b) {
		return false
	}
	for i := range s.Backends {
		o := &s.Backends[i]
		if o.takesNewFlows() && s.sameFamily(o) && o.Priority < b.Priority {
			return false
		}
	}
	return true
}

// usableCount counts the backends that take new flows.
func (s *Service) usableCount() int {
	n := 0
	for i := range s.Backends {
		if s.Usable(&s.Backends[i]) {
			n++
		}
	}
	return n
}

// CheckTable reports the first slot of the Maglev table that names
// neither a usable backend nor, with a reject share, backend 0: the table
// must only ever send new flows where the control plane allows them.
func (s *Service) CheckTable() (slot int, id uint32, ok bool) {
	for i, id := range s.Table {
		if id == 0 && s.RejectWeight > 0 {
			continue
		}
		_, b := s.backendByID(id)
		if b == nil || !s.Usable(b) {
			return i, id, false
		}
	}
	return 0, 0, true
}

// backendByID finds a backend the maps hold: of the VIP's family (the
// agent writes no other), with an ID (0 is never a backend).
func (s *Service) backendByID(id uint32) (int, *Backend) {
	for i := range s.Backends {
		if id != 0 && s.Backends[i].ID == id && s.sameFamily(&s.Backends[i]) {
			return i, &s.Backends[i]
		}
	}
	return -1, nil
}

// admits says whether the service serves a client: without source ranges
// everyone; with, clients in a range of their own family. An IPv6 packet
// from ::ffff:a.b.c.d is an IPv6 client: the address is the sender's to
// choose and must not borrow the trust of an IPv4 range.
func (s *Service) admits(client netip.Addr, v6 bool) bool {
	if len(s.SourceRanges) == 0 {
		return true
	}
	for _, p := range s.SourceRanges {
		p = normalPrefix(p)
		if v6 && p.Addr().Is6() && p.Contains(client) {
			return true
		}
		if !v6 && p.Addr().Is4() && p.Contains(client.Unmap()) {
			return true
		}
	}
	return false
}

// normalPrefix takes an IPv4-mapped prefix of at least 96 bits to be the
// IPv4 prefix it maps (as Kubernetes does): ::ffff:10.0.0.0/104 is
// 10.0.0.0/8. A shorter one (::ffff:0:0/95, ::/0) is an IPv6 prefix.
func normalPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// addr16 is an address in its 16-byte form (IPv4 as IPv4-mapped IPv6): the
// one form of keys, so that an IPv4 address and its mapped form are one
// key, as in the maps.
func addr16(a netip.Addr) netip.Addr {
	if !a.IsValid() {
		return netip.IPv6Unspecified()
	}
	return netip.AddrFrom16(a.As16())
}
