// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// Conntrack and session affinity are written by the programs only; the
// agent never reads them. These readers are for inspection (l4xds-dbg,
// tests) and open the pins of a running or stopped agent.

// Lifetimes of a conntrack entry since its last packet (CT_LIFETIME_* of
// bpf/l4xds.h).
const (
	CTLifetimeTCP        = 21600 * time.Second
	CTLifetimeTCPClosing = 10 * time.Second
	CTLifetimeNonTCP     = 60 * time.Second
	// CTLifetimeNew is that of a flow not established yet (CT_LIFETIME_NEW).
	CTLifetimeNew = 60 * time.Second
)

// Conntrack entries' directions and flags (CT_FORWARD, CT_REPLY, CT_F_*).
const (
	ctForward = 0
	ctReply   = 1

	ctFlagClosing = 1 << 0
	ctFlagNew     = 1 << 2
)

// CTEntry is an entry of l4xds_ct (established flows) or l4xds_ct_new
// (flows not established yet), with both its key and its value decoded.
// Every flow has two: the forward entry (client -> VIP) says which backend
// the flow has; the reply entry (backend -> client) says which VIP to
// restore as the source of the backend's answers.
type CTEntry struct {
	// New is true for an entry of l4xds_ct_new: a TCP flow whose client
	// has not acknowledged the backend's SYN-ACK, a UDP flow whose backend
	// has not answered.
	New bool
	// Reply is true for a reply entry (CT_REPLY).
	Reply    bool
	Protocol lb.L4Type
	// Client is the flow's client; Frontend its VIP and port. For a reply
	// entry Frontend comes from the value, for a forward one from the key.
	Client   netip.AddrPort
	Frontend netip.AddrPort
	// Backend is the key's source of a reply entry; a forward entry holds
	// only BackendID (invalid Backend).
	Backend   netip.AddrPort
	BackendID uint32
	ServiceID uint32
	// Closing: a TCP FIN or RST was seen, the entry lives CTLifetimeTCPClosing.
	Closing bool
	// LastSeen is bpf_ktime_get_ns() of the last refresh (CLOCK_MONOTONIC;
	// refreshed at most once a second).
	LastSeen time.Duration
}

// Lifetime is how long the entry lives after LastSeen, as the programs
// judge it (ct_expired).
func (e CTEntry) Lifetime() time.Duration {
	switch {
	case e.Protocol == lb.TCP && e.Closing:
		return CTLifetimeTCPClosing
	case e.New:
		return CTLifetimeNew
	case e.Protocol != lb.TCP:
		return CTLifetimeNonTCP
	}
	return CTLifetimeTCP
}

// Remaining is the entry's lifetime left at now (a Ktime reading); zero or
// less: expired, the programs ignore it and the LRU map reclaims it.
func (e CTEntry) Remaining(now time.Duration) time.Duration {
	return e.Lifetime() - (now - e.LastSeen)
}

// AffinityEntry is an entry of l4xds_affinity: the backend a client of a
// service with session affinity was last sent to.
type AffinityEntry struct {
	Client    netip.Addr
	ServiceID uint32
	BackendID uint32
	// LastUsed is bpf_ktime_get_ns() of the client's last new flow.
	LastUsed time.Duration
}

// Ktime is the clock of bpf_ktime_get_ns(): CLOCK_MONOTONIC, of the time
// namespace of the caller (the host's for an agent's l4xds-dbg).
func Ktime() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("clock_gettime(CLOCK_MONOTONIC): %w", err)
	}
	return time.Duration(ts.Nano()), nil
}

// Flows are the pinned conntrack and affinity maps, opened for reading.
type Flows struct {
	ct *ebpf.Map
	// ctNew is nil in the pins of an agent before l4xds_ct_new.
	ctNew    *ebpf.Map
	affinity *ebpf.Map
}

// OpenPinnedFlows opens l4xds_ct, l4xds_ct_new and l4xds_affinity pinned
// under <bpfRoot>/l4xds for reading.
func OpenPinnedFlows(bpfRoot string) (*Flows, error) {
	open := func(name string) (*ebpf.Map, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(bpfRoot, PinDir, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", name, err)
		}
		return m, nil
	}
	ct, err := open(bpf.L4xdsMapL4xdsCt)
	if err != nil {
		return nil, err
	}
	ctNew, err := open(bpf.L4xdsMapL4xdsCtNew)
	if errors.Is(err, os.ErrNotExist) {
		ctNew = nil
	} else if err != nil {
		ct.Close()
		return nil, err
	}
	affinity, err := open(bpf.L4xdsMapL4xdsAffinity)
	if err != nil {
		ct.Close()
		if ctNew != nil {
			ctNew.Close()
		}
		return nil, err
	}
	return &Flows{ct: ct, ctNew: ctNew, affinity: affinity}, nil
}

// Close closes the handles; the pinned maps stay.
func (f *Flows) Close() error {
	errs := []error{f.ct.Close(), f.affinity.Close()}
	if f.ctNew != nil {
		errs = append(errs, f.ctNew.Close())
	}
	return errors.Join(errs...)
}

// Conntrack returns the entries of l4xds_ct, then those of l4xds_ct_new.
// The maps change with traffic while they are read: an entry may be
// missed or seen twice, a flow's entries seen in both maps. An error ends
// the sequence.
func (f *Flows) Conntrack() iter.Seq2[CTEntry, error] {
	return func(yield func(CTEntry, error) bool) {
		for _, m := range []struct {
			name string
			m    *ebpf.Map
		}{{bpf.L4xdsMapL4xdsCt, f.ct}, {bpf.L4xdsMapL4xdsCtNew, f.ctNew}} {
			if m.m == nil {
				continue
			}
			var (
				k bpf.L4xdsLbCtKey
				v bpf.L4xdsLbCtEntry
			)
			it := m.m.Iterate()
			for it.Next(&k, &v) {
				e, err := ctEntryFromBPF(m.name, k, v)
				if !yield(e, err) || err != nil {
					return
				}
			}
			if err := it.Err(); err != nil {
				yield(CTEntry{}, fmt.Errorf("iterate %s: %w", m.name, err))
				return
			}
		}
	}
}

// Affinity returns the entries of l4xds_affinity. An error ends the
// sequence.
func (f *Flows) Affinity() iter.Seq2[AffinityEntry, error] {
	return func(yield func(AffinityEntry, error) bool) {
		var (
			k bpf.L4xdsLbAffinityKey
			v bpf.L4xdsLbAffinity
		)
		it := f.affinity.Iterate()
		for it.Next(&k, &v) {
			e := AffinityEntry{
				Client:    addrFromBPF(k.Client),
				ServiceID: k.SvcId,
				BackendID: v.BackendId,
				LastUsed:  time.Duration(v.LastUsed),
			}
			if !yield(e, nil) {
				return
			}
		}
		if err := it.Err(); err != nil {
			yield(AffinityEntry{}, fmt.Errorf("iterate %s: %w", bpf.L4xdsMapL4xdsAffinity, err))
		}
	}
}

// ctEntryFromBPF decodes an entry of the map called name as handle_service
// writes it: the forward key is the client's packet (client -> VIP), the
// reply key the backend's answer (backend -> client).
func ctEntryFromBPF(name string, k bpf.L4xdsLbCtKey, v bpf.L4xdsLbCtEntry) (CTEntry, error) {
	src := netip.AddrPortFrom(addrFromBPF(k.Saddr), portFromBPF(k.Sport))
	dst := netip.AddrPortFrom(addrFromBPF(k.Daddr), portFromBPF(k.Dport))
	e := CTEntry{
		BackendID: v.BackendId,
		ServiceID: v.SvcId,
		Closing:   v.Flags&ctFlagClosing != 0,
		New:       v.Flags&ctFlagNew != 0,
		LastSeen:  time.Duration(v.LastSeen),
	}
	proto, err := protoFromBPF(k.Proto)
	if err != nil {
		return e, fmt.Errorf("%s: entry %s -> %s: %w", name, src, dst, err)
	}
	e.Protocol = proto
	switch k.Dir {
	case ctForward:
		e.Client, e.Frontend = src, dst
	case ctReply:
		e.Reply = true
		e.Backend, e.Client = src, dst
		e.Frontend = netip.AddrPortFrom(addrFromBPF(v.Vip), portFromBPF(v.VipPort))
	default:
		return e, fmt.Errorf("%s: entry %s -> %s: direction %d is not CT_FORWARD or CT_REPLY", name, src, dst, k.Dir)
	}
	return e, nil
}
