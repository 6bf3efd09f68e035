// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Reasons of the address condition, also the reasons of the Events.
const (
	ReasonAddressAssigned  = "AddressAssigned"
	ReasonAddressNotInPool = "AddressNotInPool"
	ReasonAddressInUse     = "AddressInUse"
	ReasonPoolExhausted    = "PoolExhausted"
	ReasonInvalidRequest   = "InvalidAddressRequest"
)

// portKey is a port and protocol of a frontend.
type portKey struct {
	Port     int32
	Protocol corev1.Protocol
}

// holder is an object (a Service, a Gateway) holding an address.
type holder struct {
	owner      string
	sharingKey string
	ports      map[portKey]bool
}

// allocator hands out pool addresses. Objects are offered in a stable order
// (oldest first), so that an object keeps its address when a newer one
// wants the same.
type allocator struct {
	pools    Pools
	keepHeld bool // see Config.KeepHeldAddresses
	used     map[netip.Addr][]*holder
	// shared are the addresses held under each sharing key, in the order
	// taken: a key's holder is found without walking the pools (an IPv6
	// pool has more addresses than can be walked).
	shared map[string][]netip.Addr
}

func newAllocator(pools Pools) *allocator {
	return &allocator{pools: pools, used: map[netip.Addr][]*holder{}, shared: map[string][]netip.Addr{}}
}

// conflict says why h may not use a, or "" when it may: a is free, or all
// its holders share h's sharing key and none of their ports and protocols
// overlap h's.
func (al *allocator) conflict(a netip.Addr, h *holder) string {
	for _, o := range al.used[a] {
		if o.owner == h.owner {
			return "" // already ours
		}
		if h.sharingKey == "" || o.sharingKey != h.sharingKey {
			return fmt.Sprintf("%s is used by %s", a, o.owner)
		}
		for p := range h.ports {
			if o.ports[p] {
				return fmt.Sprintf("%s %d/%s is used by %s", a, p.Port, p.Protocol, o.owner)
			}
		}
	}
	return ""
}

func (al *allocator) take(a netip.Addr, h *holder) {
	for _, o := range al.used[a] {
		if o == h {
			return
		}
	}
	al.used[a] = append(al.used[a], h)
	if h.sharingKey != "" && !slices.Contains(al.shared[h.sharingKey], a) {
		al.shared[h.sharingKey] = append(al.shared[h.sharingKey], a)
	}
}

// addrError is why an object has no address (a condition reason and a
// message for it and for an Event).
type addrError struct{ Reason, Message string }

// request checks an address an object asked for.
func (al *allocator) request(a netip.Addr, h *holder, pool string) *addrError {
	in, ok := al.pools.find(a)
	if !ok {
		return &addrError{ReasonAddressNotInPool, fmt.Sprintf("%s is in no address pool", a)}
	}
	if pool != "" {
		if p, ok := al.pools.byName(pool); ok && !inPool(p, a) {
			return &addrError{ReasonAddressNotInPool, fmt.Sprintf("%s is in pool %q, not in %q", a, in, pool)}
		}
	}
	if why := al.conflict(a, h); why != "" {
		return &addrError{ReasonAddressInUse, why}
	}
	al.take(a, h)
	return nil
}

// hold checks an address an object holds (its status says so).
func (al *allocator) hold(a netip.Addr, h *holder, pool string) *addrError {
	if !al.keepHeld {
		return al.request(a, h, pool)
	}
	if why := al.conflict(a, h); why != "" {
		return &addrError{ReasonAddressInUse, why}
	}
	al.take(a, h)
	return nil
}

// allocate finds a free address of the family for h.
func (al *allocator) allocate(v4 bool, h *holder, pool string) (netip.Addr, *addrError) {
	pools := al.pools
	if pool != "" {
		p, ok := al.pools.byName(pool)
		if !ok {
			return netip.Addr{}, &addrError{ReasonInvalidRequest, fmt.Sprintf("no address pool is named %q", pool)}
		}
		pools = Pools{p}
	}
	var got netip.Addr
	// An address shared under h's key first, so that sharing Services end
	// up on one address.
	if h.sharingKey != "" {
		for _, a := range al.shared[h.sharingKey] {
			if _, ok := pools.find(a); ok && a.Is4() == v4 && al.conflict(a, h) == "" {
				got = a
				break
			}
		}
	}
	if !got.IsValid() {
		pools.each(v4, func(a netip.Addr) bool {
			if al.conflict(a, h) == "" {
				got = a
				return false
			}
			return true
		})
	}
	if !got.IsValid() {
		family := "IPv6"
		if v4 {
			family = "IPv4"
		}
		where := "the address pools have"
		if pool != "" {
			where = fmt.Sprintf("pool %q has", pool)
		}
		return got, &addrError{ReasonPoolExhausted, fmt.Sprintf("%s no free %s address", where, family)}
	}
	al.take(got, h)
	return got, nil
}

func inPool(p Pool, a netip.Addr) bool {
	for _, r := range p.Ranges {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

// requestedAddrs parses the addresses an object asks for: the annotation,
// else spec.loadBalancerIP (given as legacy).
func requestedAddrs(annotation, legacy string) ([]netip.Addr, *addrError) {
	s := annotation
	if s == "" {
		s = legacy
	}
	if s == "" {
		return nil, nil
	}
	var out []netip.Addr
	for _, f := range strings.Split(s, ",") {
		a, err := netip.ParseAddr(strings.TrimSpace(f))
		if err != nil {
			return nil, &addrError{ReasonInvalidRequest, fmt.Sprintf("%s: %q is not an IP address", AnnotationAddresses, f)}
		}
		a = a.Unmap()
		for _, b := range out {
			if b.Is4() == a.Is4() {
				return nil, &addrError{ReasonInvalidRequest, fmt.Sprintf("%s: %s and %s are of one IP family; ask for at most one address per family", AnnotationAddresses, b, a)}
			}
		}
		out = append(out, a)
	}
	return out, nil
}
