// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Verdicts as BPF_PROG_RUN reports them (the program's int return value).
const (
	verdictNext     = ^uint32(0) // TCX_NEXT (-1)
	verdictDrop     = 2
	verdictRedirect = 7
)

// Drop reasons (LB_DROP_* in l4xds.h).
const (
	dropNoBackend = iota
	dropSourceRange
	dropUnknownPort
	dropFragment
	dropMalformed
	dropBackendFamily
	dropProtocol
	dropICMP
	dropExtension
	dropRemovedVIP
	dropRejectLimit
)

// Backend states (LB_BACKEND_*) and service flags (LB_SVC_F_*).
const (
	backendActive      = 0
	backendTerminating = 1
	backendFStandby    = 1 << 0

	svcSourceRanges = 1 << 0
	svcAffinity     = 1 << 1

	ctForward    = 0
	ctReply      = 1
	ctFClosing   = 1 << 0
	ctFReplyLost = 1 << 1
	ctFNew       = 1 << 2
	ctFAffinity  = 1 << 3
	ctFSynAck    = 1 << 4
	testMaglevN  = 7
)

// datapath is the program loaded with fresh, unpinned maps.
type datapath struct {
	t    testing.TB
	objs L4xdsObjects
}

func newDatapath(t testing.TB) *datapath {
	return newDatapathWith(t, loadOptions{})
}

// loadOptions sets what tests may change about the program and maps.
type loadOptions struct {
	// ctEntries sizes l4xds_ct and ctNewEntries l4xds_ct_new (LRU maps
	// are preallocated): 4096 if 0.
	ctEntries, ctNewEntries uint32
	// fibRedirect sends translated packets to their next hop as the
	// agent's datapath does; without it they go on to the stack (TCX_NEXT),
	// whatever the routes of the namespace the test runs in.
	fibRedirect bool
	// reject sets the reject limit of each CPU (reject_interval_ns,
	// reject_burst_ns); nil keeps the program's.
	reject *rejectLimit
	coll   *ebpf.CollectionOptions
}

// rejectLimit is the program's reject limit of one CPU: one reject per
// interval, bursts of up to burst/interval (ns); burst 0: no rejects.
type rejectLimit struct{ interval, burst uint64 }

func newDatapathWith(t testing.TB, o loadOptions) *datapath {
	t.Helper()
	d := &datapath{t: t}
	loadWith(t, &d.objs, o)
	t.Cleanup(func() { d.objs.Close() })
	return d
}

// load loads the program with unpinned maps sized for tests.
func load(t testing.TB, objs *L4xdsObjects, opts *ebpf.CollectionOptions) {
	t.Helper()
	loadWith(t, objs, loadOptions{coll: opts})
}

func loadWith(t testing.TB, objs *L4xdsObjects, o loadOptions) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs and runs them with BPF_PROG_RUN")
	}
	spec, err := LoadL4xds()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	ctEntries := o.ctEntries
	if ctEntries == 0 {
		ctEntries = 4096
	}
	spec.Maps[L4xdsMapL4xdsCt].MaxEntries = ctEntries
	ctNewEntries := o.ctNewEntries
	if ctNewEntries == 0 {
		ctNewEntries = 4096
	}
	spec.Maps[L4xdsMapL4xdsCtNew].MaxEntries = ctNewEntries
	if err := spec.Variables[L4xdsVarFibRedirect].Set(o.fibRedirect); err != nil {
		t.Fatal(err)
	}
	if r := o.reject; r != nil {
		if err := spec.Variables[L4xdsVarRejectIntervalNs].Set(r.interval); err != nil {
			t.Fatal(err)
		}
		if err := spec.Variables[L4xdsVarRejectBurstNs].Set(r.burst); err != nil {
			t.Fatal(err)
		}
	}
	// LRU maps are preallocated: keep them small in tests.
	spec.Maps[L4xdsMapL4xdsAffinity].MaxEntries = 1024
	spec.Maps[L4xdsMapL4xdsFrags].MaxEntries = 1024
	spec.Maps[L4xdsMapL4xdsStats].MaxEntries = 64
	spec.Maps[L4xdsMapL4xdsMaglev].InnerMap.MaxEntries = testMaglevN
	if err := spec.Variables[L4xdsVarMaglevSize].Set(uint32(testMaglevN)); err != nil {
		t.Fatal(err)
	}
	if err := spec.LoadAndAssign(objs, o.coll); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("load: %+v", ve)
		}
		t.Fatalf("load: %v", err)
	}
}

func (d *datapath) must(err error, what string, args ...any) {
	d.t.Helper()
	if err != nil {
		d.t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}

// backend is one row of l4xds_backends.
type backend struct {
	id    uint32
	addr  netip.AddrPort
	state uint8
	flags uint8 // LB_BACKEND_F_*
}

// service is one frontend with its backends. The Maglev table is filled
// round robin with the backends' ids unless table is set.
type service struct {
	id              uint32
	vip             netip.AddrPort
	proto           uint8
	flags           uint32
	affinityTimeout uint32
	backends        []backend
	table           []uint32
	// single names the one backend for new flows in the service entry,
	// which then has no table (as the agent writes a service of one).
	single uint32
}

func (d *datapath) addService(s service) {
	d.t.Helper()
	key := L4xdsLbSvcKey{Addr: addr(s.vip.Addr()), Port: port(s.vip.Port()), Proto: s.proto}
	val := L4xdsLbSvc{Id: s.id, Flags: s.flags, Count: uint32(len(s.backends)), AffinityTimeout: s.affinityTimeout, BackendId: s.single}
	if s.single != 0 {
		val.Count = 1
	}
	d.must(d.objs.L4xdsServices.Put(&key, &val), "service %s", s.vip)
	for _, b := range s.backends {
		d.putBackend(s.id, b)
	}
	table := s.table
	if table == nil && len(s.backends) > 0 && s.single == 0 {
		for i := range testMaglevN {
			table = append(table, s.backends[i%len(s.backends)].id)
		}
	}
	if table != nil {
		d.setMaglev(s.id, table)
	}
	var n uint32
	vip := addr(s.vip.Addr())
	_ = d.objs.L4xdsVips.Lookup(&vip, &n)
	n++
	d.must(d.objs.L4xdsVips.Put(&vip, &n), "vip %s", s.vip.Addr())
}

// removeService deletes the service and its backends, and its VIP with
// its last service, as the agent does: the VIP is then a removed one,
// dropped until the monotonic time until (ns).
func (d *datapath) removeService(s service, until uint64) {
	d.t.Helper()
	key := L4xdsLbSvcKey{Addr: addr(s.vip.Addr()), Port: port(s.vip.Port()), Proto: s.proto}
	d.must(d.objs.L4xdsServices.Delete(&key), "delete service %s", s.vip)
	for _, b := range s.backends {
		d.deleteBackend(b.id)
	}
	_ = d.objs.L4xdsMaglev.Delete(s.id)
	var n uint32
	vip := addr(s.vip.Addr())
	d.must(d.objs.L4xdsVips.Lookup(&vip, &n), "vip %s", s.vip.Addr())
	if n--; n > 0 {
		d.must(d.objs.L4xdsVips.Put(&vip, &n), "vip %s", s.vip.Addr())
		return
	}
	d.setRemovedVIP(s.vip.Addr(), until)
	d.must(d.objs.L4xdsVips.Delete(&vip), "delete vip %s", s.vip.Addr())
}

// setRemovedVIP marks a VIP removed, dropped until the monotonic time
// until (ns).
func (d *datapath) setRemovedVIP(a netip.Addr, until uint64) {
	d.t.Helper()
	vip := addr(a)
	d.must(d.objs.L4xdsOldVips.Put(&vip, until), "removed vip %s", a)
}

func (d *datapath) putBackend(svcID uint32, b backend) {
	d.t.Helper()
	val := L4xdsLbBackend{Addr: addr(b.addr.Addr()), Port: port(b.addr.Port()), State: b.state, Flags: b.flags, SvcId: svcID}
	d.must(d.objs.L4xdsBackends.Put(b.id, &val), "backend %d", b.id)
}

func (d *datapath) deleteBackend(id uint32) {
	d.t.Helper()
	d.must(d.objs.L4xdsBackends.Delete(id), "delete backend %d", id)
}

// setMaglev swaps in a new table for the service, as the agent does.
func (d *datapath) setMaglev(svcID uint32, table []uint32) {
	d.t.Helper()
	// The outer map takes arrays of lb_maglev_inner's size and flags only.
	inner, err := ebpf.NewMap(&ebpf.MapSpec{
		Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: testMaglevN, Flags: unix.BPF_F_MMAPABLE,
	})
	d.must(err, "maglev table of service %d", svcID)
	defer inner.Close()
	for i, id := range table {
		d.must(inner.Put(uint32(i), id), "maglev slot %d", i)
	}
	d.must(d.objs.L4xdsMaglev.Put(svcID, inner), "maglev of service %d", svcID)
}

// allowSource adds a source range of the service.
func (d *datapath) allowSource(svcID uint32, p netip.Prefix) {
	d.t.Helper()
	key := srcRangeKey(svcID, p)
	d.must(d.objs.L4xdsSrcrange.Put(&key, uint8(1)), "source range %s", p)
}

// denySource removes a source range of the service.
func (d *datapath) denySource(svcID uint32, p netip.Prefix) {
	d.t.Helper()
	key := srcRangeKey(svcID, p)
	d.must(d.objs.L4xdsSrcrange.Delete(&key), "delete source range %s", p)
}

// srcRangeKey is the LPM key of a source range: the service, the family,
// then the address (IPv4 in the first 4 bytes).
func srcRangeKey(svcID uint32, p netip.Prefix) L4xdsLbSrcRangeKey {
	p = p.Masked()
	key := L4xdsLbSrcRangeKey{Prefixlen: 32 + 32 + uint32(p.Bits()), SvcId: svcID, Family: 6, Addr: addr(p.Addr())}
	if p.Addr().Is4() {
		key.Family = 4
		key.Addr = [4]uint32{key.Addr[3]}
	}
	return key
}

// run runs the program once on frame.
func (d *datapath) run(frame []byte) (uint32, []byte) {
	d.t.Helper()
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256)}
	verdict, err := d.objs.L4xdsIngress.Run(&opts)
	d.must(err, "run")
	return verdict, opts.DataOut
}

// stats sums the per-CPU counters of a service (0: unknown port).
func (d *datapath) stats(id uint32) L4xdsLbStats {
	d.t.Helper()
	var perCPU []L4xdsLbStats
	d.must(d.objs.L4xdsStats.Lookup(id, &perCPU), "stats %d", id)
	var sum L4xdsLbStats
	for _, s := range perCPU {
		sum.Packets += s.Packets
		sum.Bytes += s.Bytes
		for i := range sum.Drops {
			sum.Drops[i] += s.Drops[i]
		}
	}
	return sum
}

func ctKey(src, dst netip.AddrPort, proto, dir uint8) L4xdsLbCtKey {
	return L4xdsLbCtKey{
		Saddr: addr(src.Addr()), Daddr: addr(dst.Addr()),
		Sport: port(src.Port()), Dport: port(dst.Port()),
		Proto: proto, Dir: dir,
	}
}

// ct returns the conntrack entry of a key, if any.
func (d *datapath) ct(key L4xdsLbCtKey) (L4xdsLbCtEntry, bool) {
	var e L4xdsLbCtEntry
	err := d.objs.L4xdsCt.Lookup(&key, &e)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return e, false
	}
	d.must(err, "ct lookup")
	return e, true
}

// ctNew returns the entry of a key in l4xds_ct_new (flows not
// established yet), if any.
func (d *datapath) ctNew(key L4xdsLbCtKey) (L4xdsLbCtEntry, bool) {
	var e L4xdsLbCtEntry
	err := d.objs.L4xdsCtNew.Lookup(&key, &e)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return e, false
	}
	d.must(err, "ct_new lookup")
	return e, true
}

func (d *datapath) putCT(key L4xdsLbCtKey, e L4xdsLbCtEntry) {
	d.t.Helper()
	d.must(d.objs.L4xdsCt.Put(&key, &e), "ct update")
}

func (d *datapath) putCTNew(key L4xdsLbCtKey, e L4xdsLbCtEntry) {
	d.t.Helper()
	d.must(d.objs.L4xdsCtNew.Put(&key, &e), "ct_new update")
}

// frag returns the l4xds_frags entry of a datagram, if any.
func (d *datapath) frag(key L4xdsLbFragKey) (L4xdsLbFrag, bool) {
	d.t.Helper()
	var f L4xdsLbFrag
	err := d.objs.L4xdsFrags.Lookup(&key, &f)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return f, false
	}
	d.must(err, "frag lookup")
	return f, true
}
