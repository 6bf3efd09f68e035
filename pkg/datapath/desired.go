// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"math"
	"net/netip"
	"slices"
	"time"

	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// desiredService is what the maps should hold for a frontend, before IDs.
type desiredService struct {
	// backends are those of the VIP's family, in the frontend's order.
	backends []desiredBackend
	// usable counts the backends that take new flows (usable is set).
	usable int
	// reject is the weight of the share of new flows to refuse: Maglev
	// slots of backend 0.
	reject uint16
	// flags and affinityTimeout (seconds) of the l4xds_services entry.
	flags           uint32
	affinityTimeout uint32
	// ranges are the source ranges, masked, without duplicates.
	ranges []netip.Prefix
}

type desiredBackend struct {
	addr     netip.AddrPort
	state    lb.BackendState
	weight   uint16
	priority uint32
	// usable backends are in the Maglev table.
	usable bool
}

// desire computes the maps' contents for fe.
//
// A backend of the other IP family than the VIP is left out: the datapath
// translates addresses, not families. New flows go to the usable backends:
// active, of non-zero weight (the loadbalancer's "no new flows"), and of the
// lowest priority that has such a backend (locality failover).
func desire(fe *lb.Frontend) desiredService {
	var d desiredService
	d.set(fe)
	return d
}

// set makes d what the maps should hold for fe, reusing d's buffers.
func (d *desiredService) set(fe *lb.Frontend) {
	*d = desiredService{backends: d.backends[:0], ranges: d.ranges[:0]}
	is4 := fe.Address.Addr.Is4()
	best := uint32(math.MaxUint32)
	for _, be := range fe.Backends {
		addr := be.Address.Addr.Unmap()
		if addr.Is4() != is4 {
			continue
		}
		b := desiredBackend{
			addr:     netip.AddrPortFrom(addr, be.Address.Port),
			state:    be.State,
			weight:   be.Weight,
			priority: be.Priority,
		}
		if b.takesNewFlows() {
			best = min(best, b.priority)
		}
		d.backends = append(d.backends, b)
	}
	for i := range d.backends {
		if b := &d.backends[i]; b.takesNewFlows() && b.priority == best {
			b.usable = true
			d.usable++
		}
	}

	if svc := fe.Service; svc != nil {
		if d.usable > 0 {
			// Without a backend for new flows, every new flow is
			// refused anyway.
			d.reject = svc.RejectWeight
		}
		if len(svc.SourceRanges) > 0 {
			d.flags |= svcFlagSourceRanges
			for _, p := range svc.SourceRanges {
				if p = normalPrefix(p); !slices.Contains(d.ranges, p) {
					d.ranges = append(d.ranges, p)
				}
			}
		}
		if svc.SessionAffinity {
			d.flags |= svcFlagAffinity
			d.affinityTimeout = affinitySeconds(svc.SessionAffinityTimeout)
		}
	}
}

// normalPrefix is p masked, IPv4-mapped IPv6 as IPv4 (as Kubernetes takes
// a range like ::ffff:10.0.0.0/104 to be IPv4): the form the LPM key reads
// back as, so that one range has one form. Which packets a range admits is
// the datapath's: IPv4 ranges IPv4 packets only, IPv6 ranges IPv6 packets
// only (see srcRangeToBPF).
func normalPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// tableEntries counts what the Maglev table is made of: the usable
// backends and the reject share. Fewer than two need no table.
func (d *desiredService) tableEntries() int {
	if d.reject > 0 {
		return d.usable + 1
	}
	return d.usable
}

func (b *desiredBackend) takesNewFlows() bool {
	return b.state == lb.BackendStateActive && b.weight > 0
}

// affinitySeconds rounds up, so that a sub-second timeout is not "none".
func affinitySeconds(d time.Duration) uint32 {
	s := math.Ceil(d.Seconds())
	return uint32(min(max(s, 1), math.MaxUint32))
}
