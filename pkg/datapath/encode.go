// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// The maps' encodings (bpf/l4xds.h): addresses are 16 bytes in network
// order, IPv4 as IPv4-mapped IPv6; ports are in network order. The Go
// mirrors hold them as host-order integers, so the bytes are reinterpreted
// in the host's byte order.

const (
	ipprotoTCP = 6
	ipprotoUDP = 17
)

// Services' flags and backends' states (LB_SVC_F_*, LB_BACKEND_*).
const (
	svcFlagSourceRanges = 1 << 0
	svcFlagAffinity     = 1 << 1

	// backendFlagStandby: active, but not in the Maglev table (a priority
	// behind the best, or weight 0); affinity sends no new flow to it.
	backendFlagStandby = 1 << 0

	// srcRangeSvcBits is the svc_id part of an LPM key's prefix length.
	srcRangeSvcBits = 32
)

func addrToBPF(a netip.Addr) (out [4]uint32) {
	b := a.As16() // IPv4-mapped for an IPv4 address
	for i := range out {
		out[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return out
}

// addrFromBPF returns the address, unmapped if it is IPv4-mapped.
func addrFromBPF(in [4]uint32) netip.Addr { return addr16FromBPF(in).Unmap() }

func addr16FromBPF(in [4]uint32) netip.Addr {
	var b [16]byte
	for i, w := range in {
		binary.NativeEndian.PutUint32(b[4*i:], w)
	}
	return netip.AddrFrom16(b)
}

// portToBPF returns port as a host integer whose bytes are in network order.
func portToBPF(port uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], port)
	return binary.NativeEndian.Uint16(b[:])
}

func portFromBPF(port uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], port)
	return binary.BigEndian.Uint16(b[:])
}

func protoToBPF(p lb.L4Type) (uint8, error) {
	switch p {
	case lb.TCP:
		return ipprotoTCP, nil
	case lb.UDP:
		return ipprotoUDP, nil
	}
	return 0, fmt.Errorf("protocol %q is not TCP or UDP", p)
}

func protoFromBPF(p uint8) (lb.L4Type, error) {
	switch p {
	case ipprotoTCP:
		return lb.TCP, nil
	case ipprotoUDP:
		return lb.UDP, nil
	}
	return "", fmt.Errorf("IP protocol %d is not TCP or UDP", p)
}

func svcKeyToBPF(fe lb.L3n4Addr) (bpf.L4xdsLbSvcKey, error) {
	proto, err := protoToBPF(fe.Protocol)
	if err != nil {
		return bpf.L4xdsLbSvcKey{}, err
	}
	return bpf.L4xdsLbSvcKey{Addr: addrToBPF(fe.Addr), Port: portToBPF(fe.Port), Proto: proto}, nil
}

func svcKeyFromBPF(k bpf.L4xdsLbSvcKey) (lb.L3n4Addr, error) {
	proto, err := protoFromBPF(k.Proto)
	if err != nil {
		return lb.L3n4Addr{}, err
	}
	return lb.NewL3n4Addr(addrFromBPF(k.Addr), portFromBPF(k.Port), proto), nil
}

func backendToBPF(svcID uint32, addr netip.AddrPort, state lb.BackendState) bpf.L4xdsLbBackend {
	return bpf.L4xdsLbBackend{
		Addr:  addrToBPF(addr.Addr()),
		Port:  portToBPF(addr.Port()),
		State: uint8(state),
		SvcId: svcID,
	}
}

func backendAddrFromBPF(v bpf.L4xdsLbBackend) netip.AddrPort {
	return netip.AddrPortFrom(addrFromBPF(v.Addr), portFromBPF(v.Port))
}

// The families of a source range's LPM key (LB_FAMILY_*), matched in full
// ahead of the address: no prefix of one family covers the other's
// addresses.
const (
	familyIPv4 = 4
	familyIPv6 = 6
	// srcRangeFamilyBits is the family part of an LPM key's prefix length.
	srcRangeFamilyBits = 32
)

// srcRangeToBPF is the LPM key of a prefix of a service (normalPrefix'd):
// an IPv4 prefix has its address in the key's first 4 bytes, and admits
// IPv4 packets only; an IPv6 prefix, ::/0 included, IPv6 packets only.
func srcRangeToBPF(svcID uint32, p netip.Prefix) bpf.L4xdsLbSrcRangeKey {
	p = normalPrefix(p)
	k := bpf.L4xdsLbSrcRangeKey{
		Prefixlen: uint32(srcRangeSvcBits + srcRangeFamilyBits + p.Bits()),
		SvcId:     svcID,
		Family:    familyIPv6,
	}
	if p.Addr().Is4() {
		k.Family = familyIPv4
		b := p.Addr().As4()
		k.Addr[0] = binary.NativeEndian.Uint32(b[:])
		return k
	}
	k.Addr = addrToBPF(p.Addr())
	return k
}

func srcRangeFromBPF(k bpf.L4xdsLbSrcRangeKey) (netip.Prefix, error) {
	var a netip.Addr
	switch k.Family {
	case familyIPv4:
		var b [4]byte
		binary.NativeEndian.PutUint32(b[:], k.Addr[0])
		a = netip.AddrFrom4(b)
	case familyIPv6:
		a = addr16FromBPF(k.Addr)
	default:
		return netip.Prefix{}, fmt.Errorf("source range of service %d: family %d is not IPv4 (%d) or IPv6 (%d)", k.SvcId, k.Family, familyIPv4, familyIPv6)
	}
	p, err := a.Prefix(int(k.Prefixlen) - srcRangeSvcBits - srcRangeFamilyBits)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("source range of service %d: %w", k.SvcId, err)
	}
	return p, nil
}
