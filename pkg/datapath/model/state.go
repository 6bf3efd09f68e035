// SPDX-License-Identifier: Apache-2.0

package model

import (
	"net/netip"
	"time"
)

// Direction of a conntrack entry or a remembered fragment.
type Direction uint8

const (
	// Forward: client -> VIP, naming the backend.
	Forward Direction = iota
	// Reply: backend -> client, naming the VIP to restore.
	Reply
)

// FlowKey is one direction of a flow as its packets carry it. Addresses
// are in their 16-byte form: an IPv4 packet and an IPv6 packet from the
// IPv4-mapped address have one key, as in the maps.
type FlowKey struct {
	Src, Dst netip.AddrPort
	Proto    uint8
	Dir      Direction
}

// FlowFlags are what conntrack remembers of a flow beside its backend.
type FlowFlags uint8

const (
	// Closing: a TCP FIN or RST was seen; the flow lives CloseLifetime.
	Closing FlowFlags = 1 << iota
	// ReplyLost: another flow from the client's port took this flow's
	// reply entry (the reply key names no VIP); the next packet writes it
	// back.
	ReplyLost
	// New: an entry of a flow not established yet.
	New
	// WithAffinity: the service has client affinity, written once the
	// flow is established (spoofed sources cannot flush a client's).
	WithAffinity
	// SynAckSeen: the backend's SYN-ACK passed; the client's ACK of it
	// (ack == SynAckAck) establishes the flow.
	SynAckSeen
)

// Flow is a conntrack entry.
type Flow struct {
	LastSeen  uint64 // monotonic ns
	BackendID uint32
	ServiceID uint32
	// VIP is the frontend to restore as the source of replies (both
	// entries carry it).
	VIP       netip.AddrPort
	Flags     FlowFlags
	SynAckAck uint32 // with SynAckSeen: the backend's initial sequence + 1
}

// Lifetimes of a conntrack entry since its last packet.
const (
	LifetimeTCP        = 21600 * time.Second
	LifetimeTCPClosing = 10 * time.Second
	LifetimeOther      = 60 * time.Second
	// LifetimeNew is that of a flow not established yet (Cilium's
	// ct-timeout-syn).
	LifetimeNew = 60 * time.Second
	// refreshEvery: entries are refreshed (and a lost reply entry
	// written back) at most this often.
	refreshEvery = time.Second
)

// AffinityKey is a client of a service.
type AffinityKey struct {
	Client    netip.Addr
	ServiceID uint32
}

// Affinity is the backend of a client's last established flow.
type Affinity struct {
	LastUsed  uint64
	BackendID uint32
}

// FragKey is an IP datagram, as all its fragments carry it.
type FragKey struct {
	Src, Dst netip.Addr
	// ID is the IP identification as on the wire (16 bits for IPv4, 32
	// for IPv6's Fragment header).
	ID    uint32
	Proto uint8
	Dir   Direction
	// IPv6 is the datagram's family: the ID's width.
	IPv6 bool
}

// Frag is the translation of a datagram's first fragment, for the later
// ones: the backend (Forward) or the VIP (Reply).
type Frag struct {
	Addr      netip.Addr
	ServiceID uint32
}

// DropReason says why a packet was dropped; the counters are by reason.
type DropReason int

const (
	DropNoBackend DropReason = iota
	DropSourceRange
	DropUnknownPort
	DropFragment
	DropMalformed
	DropBackendFamily
	DropProtocol
	DropICMP
	DropIPv6Extension
	DropRemovedVIP
	// DropRejectLimit: refused as DropNoBackend is, but over the reject
	// limit, so not answered.
	DropRejectLimit
	NumDropReasons
)

var dropNames = [NumDropReasons]string{"no backend", "source range", "unknown port", "fragment",
	"malformed", "backend family", "protocol", "icmp", "ipv6 extension", "removed vip", "reject limit"}

func (r DropReason) String() string {
	if r >= 0 && r < NumDropReasons {
		return dropNames[r]
	}
	return "reason?"
}

// Counters of a service (ID 0: what no service can be charged with).
type Counters struct {
	Packets, Bytes uint64
	Drops          [NumDropReasons]uint64
}

// State is what the datapath keeps between packets.
type State struct {
	// Established flows' entries, and those of flows not established yet
	// (apart, so that floods of new flows cannot evict established ones).
	CT, CTNew map[FlowKey]Flow
	Affinity  map[AffinityKey]Affinity
	Frags     map[FragKey]Frag
	Counters  map[uint32]Counters
	// RejectTAT is the reject limit's bucket (of the one CPU the packets
	// run on): the time at which it is full again, 0 at first.
	RejectTAT uint64
}

// NewState is an empty state.
func NewState() *State {
	return &State{
		CT: map[FlowKey]Flow{}, CTNew: map[FlowKey]Flow{},
		Affinity: map[AffinityKey]Affinity{}, Frags: map[FragKey]Frag{},
		Counters: map[uint32]Counters{},
	}
}

func (s *State) countDrop(svcID uint32, r DropReason) {
	c := s.Counters[svcID]
	c.Drops[r]++
	s.Counters[svcID] = c
}

func (s *State) countPacket(svcID uint32, n int) {
	c := s.Counters[svcID]
	c.Packets++
	c.Bytes += uint64(n)
	s.Counters[svcID] = c
}

// expired: an entry past its lifetime is no entry, whether or not the
// map has reclaimed it yet.
func (f *Flow) expired(proto uint8, now uint64) bool {
	life := LifetimeOther
	switch {
	case proto == ProtoTCP && f.Flags&Closing != 0:
		life = LifetimeTCPClosing
	case f.Flags&New != 0:
		life = LifetimeNew
	case proto == ProtoTCP:
		life = LifetimeTCP
	}
	return now-f.LastSeen > uint64(life)
}

// live returns the entry of k in m unless it expired.
func live(m map[FlowKey]Flow, k FlowKey, now uint64) (Flow, bool) {
	f, ok := m[k]
	if !ok || f.expired(k.Proto, now) {
		return Flow{}, false
	}
	return f, true
}
