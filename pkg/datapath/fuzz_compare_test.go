// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	"github.com/l4xds/l4xds/pkg/datapath/model"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// The fuzzer's side of the maps: emptying them, seeding them, and reading
// them back as the model's state.

// fzReset empties the maps and the counters a run can use.
func fzReset(t *testing.T, dp *Datapath) {
	o := &dp.objs
	for _, m := range []*ebpf.Map{o.L4xdsServices, o.L4xdsBackends, o.L4xdsMaglev, o.L4xdsSrcrange, o.L4xdsVips,
		o.L4xdsOldVips, o.L4xdsCt, o.L4xdsCtNew, o.L4xdsFrags, o.L4xdsAffinity} {
		var keys [][]byte
		var prev []byte
		for {
			next := make([]byte, m.KeySize())
			var err error
			if prev == nil {
				err = m.NextKey(nil, next)
			} else {
				err = m.NextKey(prev, next)
			}
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				break
			}
			if err != nil {
				t.Fatalf("empty %s: %v", mapName(m), err)
			}
			keys, prev = append(keys, next), next
		}
		for _, k := range keys {
			if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				t.Fatalf("empty %s: %v", mapName(m), err)
			}
		}
	}
	for id := range uint32(fzMaxServiceID + 1) {
		if _, err := dp.Maps.zeroStats([]uint32{id}); err != nil {
			t.Fatal(err)
		}
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.objs.L4xdsRejectBucket.Put(uint32(0), make([]bpf.L4xdsLbRejectBucket, cpus)); err != nil {
		t.Fatalf("empty %s: %v", bpf.L4xdsMapL4xdsRejectBucket, err)
	}
}

// fzRejectTAT is the reject limit's bucket of a CPU.
func fzRejectTAT(t *testing.T, dp *Datapath, cpu int) uint64 {
	var b []bpf.L4xdsLbRejectBucket
	if err := dp.objs.L4xdsRejectBucket.Lookup(uint32(0), &b); err != nil {
		t.Fatalf("%s: %v", bpf.L4xdsMapL4xdsRejectBucket, err)
	}
	return b[cpu].Tat
}

func fzBackends(t *testing.T, dp *Datapath) []BackendEntry {
	var out []BackendEntry
	for b, err := range dp.Maps.Backends() {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b BackendEntry) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func fzProto(p lb.L4Type) uint8 {
	if p == lb.UDP {
		return model.ProtoUDP
	}
	return model.ProtoTCP
}

// fzModelServices is the model's table of the frontends left: the
// control plane's rows, with the IDs and the Maglev tables the agent
// wrote.
func fzModelServices(t *testing.T, dp *Datapath, s *scenario, ids map[int]uint32) []*model.Service {
	entries := map[lb.L3n4Addr]ServiceEntry{}
	for e, err := range dp.Maps.Services() {
		if err != nil {
			t.Fatal(err)
		}
		entries[e.Frontend] = e
	}
	backendIDs := map[uint32]map[netip.AddrPort]uint32{}
	for _, b := range fzBackends(t, dp) {
		if backendIDs[b.ServiceID] == nil {
			backendIDs[b.ServiceID] = map[netip.AddrPort]uint32{}
		}
		backendIDs[b.ServiceID][b.Address] = b.ID
	}
	var out []*model.Service
	for i, fe := range s.frontends {
		if s.removed[i] {
			continue
		}
		e, ok := entries[fe.Address]
		if !ok {
			t.Fatalf("frontend %s: no entry in %s", fe.Address, bpf.L4xdsMapL4xdsServices)
		}
		svc := &model.Service{
			ID:           ids[i],
			Frontend:     model.Frontend{VIP: fe.Address.Addr, Port: fe.Address.Port, Proto: fzProto(fe.Address.Protocol)},
			SourceRanges: fe.Service.SourceRanges,
			RejectWeight: fe.Service.RejectWeight,
		}
		if fe.Service.SessionAffinity {
			svc.Affinity = fe.Service.SessionAffinityTimeout
		}
		for _, b := range fe.Backends {
			addr := netip.AddrPortFrom(b.Address.Addr, b.Address.Port)
			svc.Backends = append(svc.Backends, model.Backend{ID: backendIDs[e.ID][addr], Addr: addr,
				State: model.BackendState(b.State), Weight: b.Weight, Priority: b.Priority})
		}
		table, ok, err := dp.Maps.MaglevTable(e.ID)
		switch {
		case err != nil:
			t.Fatal(err)
		case ok:
			svc.Table = table
		case e.Backend != 0:
			svc.Table = []uint32{e.Backend}
		}
		out = append(out, svc)
	}
	return out
}

func fzRemovedVIPs(t *testing.T, dp *Datapath) map[netip.Addr]uint64 {
	out := map[netip.Addr]uint64{}
	var k [4]uint32
	var until uint64
	it := dp.objs.L4xdsOldVips.Iterate()
	for it.Next(&k, &until) {
		out[addr16FromBPF(k)] = until
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// fzSeed writes the scenario's conntrack and affinity entries into the
// maps and the model.
func fzSeed(t *testing.T, dp *Datapath, m *model.Datapath, s *scenario, ids map[int]uint32, backends []BackendEntry) {
	now := fzKtime(t)
	ago := func(d int64) uint64 { return now - min(uint64(d), now) }
	// The backend at index i: mostly one of the frontend's own (what a
	// flow or affinity names but for a change of the table since), else
	// any.
	backend := func(fe, i int) BackendEntry {
		var own []BackendEntry
		for _, b := range backends {
			if b.ServiceID == ids[fe] {
				own = append(own, b)
			}
		}
		if i < 6 && len(own) > 0 {
			return own[i%len(own)]
		}
		return backends[i%len(backends)]
	}
	for _, f := range s.flows {
		if len(backends) == 0 {
			break
		}
		fe := s.frontends[f.frontend].Address
		b := backend(f.frontend, f.backend)
		vip := netip.AddrPortFrom(a16(fe.Addr), fe.Port)
		client := netip.AddrPortFrom(a16(f.client.Addr()), f.client.Port())
		proto := fzProto(fe.Protocol)
		fk := model.FlowKey{Src: client, Dst: vip, Proto: proto, Dir: model.Forward}
		rk := model.FlowKey{Src: netip.AddrPortFrom(a16(b.Address.Addr()), b.Address.Port()), Dst: client, Proto: proto, Dir: model.Reply}
		fwd := model.Flow{LastSeen: ago(int64(f.age)), BackendID: b.ID, ServiceID: ids[f.frontend], VIP: vip, Flags: f.flags, SynAckAck: f.synAckAck}
		rev := fwd
		rev.Flags &^= model.SynAckSeen | model.ReplyLost
		rev.SynAckAck = 0
		if f.staleReply {
			// The entry another backend's flow left: its reply key and
			// backend are that backend's (of the same service, or not).
			rb := backend(f.frontend, f.backend+1)
			rk.Src = netip.AddrPortFrom(a16(rb.Address.Addr()), rb.Address.Port())
			rev.BackendID, rev.ServiceID = rb.ID, rb.ServiceID
		}
		fmp, fst := dp.objs.L4xdsCt, m.State.CT
		rmp, rst := fmp, fst
		if !f.established {
			rmp, rst = dp.objs.L4xdsCtNew, m.State.CTNew
			if !f.forwardEstablished {
				fmp, fst = rmp, rst
			} else {
				fwd.Flags &^= model.New | model.SynAckSeen | model.WithAffinity
				fwd.SynAckAck = 0
			}
		}
		for _, e := range []struct {
			mp *ebpf.Map
			st map[model.FlowKey]model.Flow
			k  model.FlowKey
			v  model.Flow
		}{{fmp, fst, fk, fwd}, {rmp, rst, rk, rev}} {
			key, val := fzCTKeyToBPF(e.k), fzCTEntryToBPF(e.v)
			if err := e.mp.Put(&key, &val); err != nil {
				t.Fatal(err)
			}
			e.st[e.k] = e.v
		}
	}
	if s.rejectAhead > 0 {
		// As a larger limit left it, on every CPU.
		tat := now + uint64(s.rejectAhead)
		cpus, err := ebpf.PossibleCPU()
		if err != nil {
			t.Fatal(err)
		}
		b := make([]bpf.L4xdsLbRejectBucket, cpus)
		for i := range b {
			b[i].Tat = tat
		}
		if err := dp.objs.L4xdsRejectBucket.Put(uint32(0), b); err != nil {
			t.Fatalf("write %s: %v", bpf.L4xdsMapL4xdsRejectBucket, err)
		}
		m.State.RejectTAT = tat
	}
	for _, a := range s.affinity {
		if len(backends) == 0 {
			break
		}
		k := model.AffinityKey{Client: a16(a.client), ServiceID: ids[a.frontend]}
		v := model.Affinity{LastUsed: ago(int64(a.age)), BackendID: backend(a.frontend, a.backend).ID}
		key := bpf.L4xdsLbAffinityKey{Client: addrToBPF(k.Client), SvcId: k.ServiceID}
		val := bpf.L4xdsLbAffinity{LastUsed: v.LastUsed, BackendId: v.BackendID}
		if err := dp.objs.L4xdsAffinity.Put(&key, &val); err != nil {
			t.Fatal(err)
		}
		m.State.Affinity[k] = v
	}
}

func a16(a netip.Addr) netip.Addr { return netip.AddrFrom16(a.As16()) }

func fzCTKeyToBPF(k model.FlowKey) bpf.L4xdsLbCtKey {
	return bpf.L4xdsLbCtKey{Saddr: addrToBPF(k.Src.Addr()), Daddr: addrToBPF(k.Dst.Addr()),
		Sport: portToBPF(k.Src.Port()), Dport: portToBPF(k.Dst.Port()), Proto: k.Proto, Dir: uint8(k.Dir)}
}

func fzCTKeyFromBPF(k bpf.L4xdsLbCtKey) model.FlowKey {
	return model.FlowKey{Src: netip.AddrPortFrom(addr16FromBPF(k.Saddr), portFromBPF(k.Sport)),
		Dst: netip.AddrPortFrom(addr16FromBPF(k.Daddr), portFromBPF(k.Dport)), Proto: k.Proto, Dir: model.Direction(k.Dir)}
}

// be32ToBPF is a host integer whose bytes are v in network order.
func be32ToBPF(v uint32) uint32 {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return binary.NativeEndian.Uint32(b[:])
}

func be32FromBPF(v uint32) uint32 {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return binary.BigEndian.Uint32(b[:])
}

func fzCTEntryToBPF(f model.Flow) bpf.L4xdsLbCtEntry {
	return bpf.L4xdsLbCtEntry{LastSeen: f.LastSeen, BackendId: f.BackendID, SvcId: f.ServiceID,
		Vip: addrToBPF(f.VIP.Addr()), VipPort: portToBPF(f.VIP.Port()), Flags: uint8(f.Flags), SynackAck: be32ToBPF(f.SynAckAck)}
}

func fzCTEntryFromBPF(e bpf.L4xdsLbCtEntry) model.Flow {
	return model.Flow{LastSeen: e.LastSeen, BackendID: e.BackendId, ServiceID: e.SvcId,
		VIP: netip.AddrPortFrom(addr16FromBPF(e.Vip), portFromBPF(e.VipPort)), Flags: model.FlowFlags(e.Flags), SynAckAck: be32FromBPF(e.SynackAck)}
}

// fzProgRun runs the program once.
func fzProgRun(t *testing.T, dp *Datapath, frame []byte, gsoSize uint32) (int32, []byte) {
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256)}
	if gsoSize != 0 {
		// A GSO packet: the fields of struct __sk_buff that
		// BPF_PROG_RUN takes from its context.
		l, err := fzSKBLayout()
		if err != nil {
			t.Fatal(err)
		}
		ctx := make([]byte, l.size)
		binary.NativeEndian.PutUint32(ctx[l.gsoSize:], gsoSize)
		binary.NativeEndian.PutUint32(ctx[l.gsoSegs:], uint32(len(frame)/int(gsoSize)+1))
		opts.Context = ctx
	}
	ret, err := dp.objs.L4xdsIngress.Run(&opts)
	if err != nil {
		t.Fatalf("BPF_PROG_RUN of %d bytes: %v\n%s", len(frame), err, fzHex(frame))
	}
	return int32(ret), opts.DataOut
}

// fzFragKey is the l4xds_frags key of a datagram: the ID as the program
// loads it from the header, 16 bits for IPv4, 32 for IPv6 (the key has
// no family: compared as keys, not read back).
func fzFragKey(k model.FragKey) bpf.L4xdsLbFragKey {
	id := be32ToBPF(k.ID)
	if !k.IPv6 {
		var b [2]byte
		binary.BigEndian.PutUint16(b[:], uint16(k.ID))
		id = uint32(binary.NativeEndian.Uint16(b[:]))
	}
	return bpf.L4xdsLbFragKey{Saddr: addrToBPF(k.Src), Daddr: addrToBPF(k.Dst), Id: id, Proto: k.Proto, Dir: uint8(k.Dir)}
}

// fzReadFrags reads l4xds_frags.
func fzReadFrags(t *testing.T, dp *Datapath) map[bpf.L4xdsLbFragKey]model.Frag {
	out := map[bpf.L4xdsLbFragKey]model.Frag{}
	var k bpf.L4xdsLbFragKey
	var v bpf.L4xdsLbFrag
	it := dp.objs.L4xdsFrags.Iterate()
	for it.Next(&k, &v) {
		out[k] = model.Frag{Addr: addr16FromBPF(v.Addr), ServiceID: v.SvcId}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// fzSKBLayout is where struct __sk_buff holds the GSO fields, from the
// program's BTF.
var fzSKBLayout = sync.OnceValues(func() (l struct{ size, gsoSize, gsoSegs uint32 }, err error) {
	spec, err := bpf.LoadL4xds()
	if err != nil {
		return l, err
	}
	var s *btf.Struct
	if err := spec.Types.TypeByName("__sk_buff", &s); err != nil {
		return l, err
	}
	l.size = s.Size
	for _, m := range s.Members {
		switch m.Name {
		case "gso_size":
			l.gsoSize = m.Offset.Bytes()
		case "gso_segs":
			l.gsoSegs = m.Offset.Bytes()
		}
	}
	if l.gsoSize == 0 || l.gsoSegs == 0 {
		return l, errors.New("__sk_buff has no gso_size or gso_segs in the program's BTF")
	}
	return l, nil
})

// fzReadState reads the maps back as the model's state (but for
// fragments: fzReadFrags).
func fzReadState(t *testing.T, dp *Datapath) *model.State {
	st := model.NewState()
	for _, c := range []struct {
		m   *ebpf.Map
		out map[model.FlowKey]model.Flow
	}{{dp.objs.L4xdsCt, st.CT}, {dp.objs.L4xdsCtNew, st.CTNew}} {
		var k bpf.L4xdsLbCtKey
		var v bpf.L4xdsLbCtEntry
		it := c.m.Iterate()
		for it.Next(&k, &v) {
			c.out[fzCTKeyFromBPF(k)] = fzCTEntryFromBPF(v)
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
	}
	var ak bpf.L4xdsLbAffinityKey
	var av bpf.L4xdsLbAffinity
	it := dp.objs.L4xdsAffinity.Iterate()
	for it.Next(&ak, &av) {
		st.Affinity[model.AffinityKey{Client: addr16FromBPF(ak.Client), ServiceID: ak.SvcId}] = model.Affinity{LastUsed: av.LastUsed, BackendID: av.BackendId}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	for id := range uint32(fzMaxServiceID + 1) {
		s, err := dp.Maps.ServiceStats(id)
		if err != nil {
			t.Fatal(err)
		}
		if s != (Stats{}) {
			c := model.Counters{Packets: s.Packets, Bytes: s.Bytes}
			for r := range c.Drops {
				c.Drops[r] = s.Drops[r]
			}
			st.Counters[id] = c
		}
	}
	return st
}

// fzVerdict is the model's verdict of a program's return value.
func fzVerdict(v int32) (model.Verdict, bool) {
	switch v {
	case -1: // TCX_NEXT
		return model.Pass, true
	case 2: // TCX_DROP
		return model.Drop, true
	case 7: // TCX_REDIRECT
		return model.Redirect, true
	}
	return 0, false
}

// fzDiffResult compares the verdict and, unless dropped, the frame.
func fzDiffResult(want model.Result, verdict int32, out []byte) []string {
	got, ok := fzVerdict(verdict)
	if !ok {
		return []string{fmt.Sprintf("verdict: program returned %d, not a tcx verdict", verdict)}
	}
	if got != want.Verdict {
		return []string{fmt.Sprintf("verdict: program %s, model %s", got, want.Verdict)}
	}
	if got == model.Drop {
		return nil
	}
	if len(out) != len(want.Frame) {
		return []string{fmt.Sprintf("frame: program %d bytes, model %d bytes\n  program:\n%s  model:\n%s", len(out), len(want.Frame), fzHex(out), fzHex(want.Frame))}
	}
	var diffs []string
	for i := range out {
		if out[i] != want.Frame[i] {
			diffs = append(diffs, fmt.Sprintf("frame byte %d (%#x): program %#02x, model %#02x", i, i, out[i], want.Frame[i]))
		}
	}
	if len(diffs) > 8 {
		diffs = append(diffs[:8], fmt.Sprintf("... %d bytes differ\n  program:\n%s  model:\n%s", len(diffs), fzHex(out), fzHex(want.Frame)))
	}
	return diffs
}

// fzWindow is when the program ran a packet: from the model's now (taken
// just before) to after it returned.
type fzWindow struct{ now, after uint64 }

// fzDiffState compares the model's state with the maps'. A time the
// program wrote while it ran a packet is that packet's now in the model.
func fzDiffState(want, got *model.State, gotFrags map[bpf.L4xdsLbFragKey]model.Frag, runs []fzWindow, limit model.RejectLimit) []string {
	norm := func(ts uint64) uint64 {
		for _, w := range runs {
			if ts >= w.now && ts <= w.after {
				return w.now
			}
		}
		return ts
	}
	var diffs []string
	// The bucket's time is that of a reject, some intervals on.
	tat := got.RejectTAT
	for k := uint64(1); k <= 8 && tat > k*limit.Interval; k++ {
		if n := norm(tat - k*limit.Interval); n != tat-k*limit.Interval {
			tat = n + k*limit.Interval
			break
		}
	}
	// Or clamped to a packet's now and the burst (a bucket found ahead).
	if n := norm(tat - min(tat, limit.Burst)); tat > limit.Burst && n != tat-limit.Burst {
		tat = n + limit.Burst
	}
	if tat != want.RejectTAT {
		diffs = append(diffs, fmt.Sprintf("l4xds_reject_bucket: program tat %d, model %d", tat, want.RejectTAT))
	}
	for _, c := range []struct {
		name      string
		want, got map[model.FlowKey]model.Flow
	}{{"l4xds_ct", want.CT, got.CT}, {"l4xds_ct_new", want.CTNew, got.CTNew}} {
		for k, g := range c.got {
			g.LastSeen = norm(g.LastSeen)
			c.got[k] = g
		}
		diffs = append(diffs, diffMaps(c.name, c.want, c.got, fmtFlowKey, fmtFlow)...)
	}
	for k, g := range got.Affinity {
		g.LastUsed = norm(g.LastUsed)
		got.Affinity[k] = g
	}
	diffs = append(diffs, diffMaps("l4xds_affinity", want.Affinity, got.Affinity,
		func(k model.AffinityKey) string { return fmt.Sprintf("client %s of service %d", k.Client, k.ServiceID) },
		func(v model.Affinity) string { return fmt.Sprintf("backend %d, last used %d", v.BackendID, v.LastUsed) })...)
	wantFrags := map[bpf.L4xdsLbFragKey]model.Frag{}
	for k, v := range want.Frags {
		wantFrags[fzFragKey(k)] = v
	}
	diffs = append(diffs, diffMaps("l4xds_frags", wantFrags, gotFrags,
		func(k bpf.L4xdsLbFragKey) string {
			return fmt.Sprintf("%s -> %s id (as loaded) %#x proto %d dir %d", addr16FromBPF(k.Saddr), addr16FromBPF(k.Daddr), k.Id, k.Proto, k.Dir)
		},
		func(v model.Frag) string { return fmt.Sprintf("%s, service %d", v.Addr, v.ServiceID) })...)
	wantCounters := maps.Clone(want.Counters)
	maps.DeleteFunc(wantCounters, func(_ uint32, c model.Counters) bool { return c == model.Counters{} })
	diffs = append(diffs, diffMaps("l4xds_stats", wantCounters, got.Counters,
		func(id uint32) string { return fmt.Sprintf("service %d", id) }, fmtCounters)...)
	return diffs
}

func fmtFlowKey(k model.FlowKey) string {
	dir := "forward"
	if k.Dir == model.Reply {
		dir = "reply"
	}
	return fmt.Sprintf("%s %s -> %s proto %d", dir, k.Src, k.Dst, k.Proto)
}

func fmtFlow(f model.Flow) string {
	return fmt.Sprintf("{backend %d service %d vip %s flags %#x synack_ack %d last_seen %d}", f.BackendID, f.ServiceID, f.VIP, f.Flags, f.SynAckAck, f.LastSeen)
}

func fmtCounters(c model.Counters) string {
	s := fmt.Sprintf("packets %d bytes %d", c.Packets, c.Bytes)
	for r, n := range c.Drops {
		if n > 0 {
			s += fmt.Sprintf(", %s drops %d", model.DropReason(r), n)
		}
	}
	return s
}

// diffMaps lists the entries the program and the model disagree on.
func diffMaps[K comparable, V comparable](name string, want, got map[K]V, fk func(K) string, fv func(V) string) []string {
	var diffs []string
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s: %s: program has none, model %s", name, fk(k), fv(w)))
		case g != w:
			diffs = append(diffs, fmt.Sprintf("%s: %s: program %s, model %s", name, fk(k), fv(g), fv(w)))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: %s: program %s, model has none", name, fk(k), fv(g)))
		}
	}
	slices.Sort(diffs)
	return diffs
}
