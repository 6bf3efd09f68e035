// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Pool is a named set of addresses the source may give to Services and
// Gateways: CIDRs and first-last ranges of one IP family or both.
type Pool struct {
	Name   string
	Ranges []AddrRange
}

// AddrRange is an inclusive range of addresses of one family.
type AddrRange struct{ First, Last netip.Addr }

// Contains reports whether a is in the range.
func (r AddrRange) Contains(a netip.Addr) bool {
	return a.Is4() == r.First.Is4() && a.Compare(r.First) >= 0 && a.Compare(r.Last) <= 0
}

// ParsePool parses "NAME=RANGE[,RANGE...]" where a RANGE is a CIDR
// ("10.0.10.0/24": every address of it, the network and broadcast addresses
// included, as a VIP is no host on that network) or "FIRST-LAST".
func ParsePool(s string) (Pool, error) {
	name, list, ok := strings.Cut(s, "=")
	if !ok || name == "" || list == "" {
		return Pool{}, fmt.Errorf("pool %q: want NAME=CIDR|FIRST-LAST[,...]", s)
	}
	p := Pool{Name: name}
	for _, item := range strings.Split(list, ",") {
		r, err := parseRange(strings.TrimSpace(item))
		if err != nil {
			return Pool{}, fmt.Errorf("pool %q: %w", name, err)
		}
		p.Ranges = append(p.Ranges, r)
	}
	return p, nil
}

func parseRange(s string) (AddrRange, error) {
	if first, last, ok := strings.Cut(s, "-"); ok {
		a, err := netip.ParseAddr(first)
		if err != nil {
			return AddrRange{}, fmt.Errorf("range %q: %w", s, err)
		}
		b, err := netip.ParseAddr(last)
		if err != nil {
			return AddrRange{}, fmt.Errorf("range %q: %w", s, err)
		}
		a, b = a.Unmap(), b.Unmap()
		if a.Is4() != b.Is4() || a.Compare(b) > 0 {
			return AddrRange{}, fmt.Errorf("range %q: the first address must not be after the last, both of one family", s)
		}
		return AddrRange{a, b}, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return AddrRange{}, fmt.Errorf("range %q: want a CIDR or FIRST-LAST: %w", s, err)
	}
	p = p.Masked()
	return AddrRange{p.Addr(), lastAddr(p)}, nil
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Pools is the ordered list of pools. The first pool with a free address of
// the family asked for serves a Service that names no pool.
type Pools []Pool

// find returns the pool that holds a, or false.
func (ps Pools) find(a netip.Addr) (string, bool) {
	for _, p := range ps {
		for _, r := range p.Ranges {
			if r.Contains(a) {
				return p.Name, true
			}
		}
	}
	return "", false
}

func (ps Pools) byName(name string) (Pool, bool) {
	i := slices.IndexFunc(ps, func(p Pool) bool { return p.Name == name })
	if i < 0 {
		return Pool{}, false
	}
	return ps[i], true
}

// each calls fn with the addresses of family v4 (IPv4 when true) of the
// pools, in order, until fn returns false.
func (ps Pools) each(v4 bool, fn func(netip.Addr) bool) {
	for _, p := range ps {
		for _, r := range p.Ranges {
			if r.First.Is4() != v4 {
				continue
			}
			for a := r.First; a.IsValid() && a.Compare(r.Last) <= 0; a = a.Next() {
				if !fn(a) {
					return
				}
			}
		}
	}
}
