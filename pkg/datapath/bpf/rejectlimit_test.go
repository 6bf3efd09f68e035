// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// onOneCPU runs the rest of the test on one CPU, whose reject bucket the
// program takes from: the buckets are per CPU.
func onOneCPU(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	var was unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		t.Fatal(err)
	}
	cpu := -1
	for i := range 1024 {
		if was.IsSet(i) {
			cpu = i
			break
		}
	}
	var one unix.CPUSet
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.SchedSetaffinity(0, &was); err != nil {
			t.Error(err)
		}
		runtime.UnlockOSThread()
	})
}

// rejectBuckets is the reject bucket of every CPU.
func (d *datapath) rejectBuckets() []L4xdsLbRejectBucket {
	d.t.Helper()
	var b []L4xdsLbRejectBucket
	d.must(d.objs.L4xdsRejectBucket.Lookup(uint32(0), &b), "reject buckets")
	return b
}

// A flood of packets that are each refused (no backend, or the reject
// share; TCP and UDP, all services alike) sends no more rejects than a
// CPU's bucket holds; the rest are dropped and counted as reject limit.
// As time passes (here: as the bucket's state says it did) rejects resume,
// one per interval.
func TestRejectsAreRateLimited(t *testing.T) {
	// An hour per reject: no test runs long enough to earn one.
	const interval, burst, flood = uint64(time.Hour), 5, 64
	onOneCPU(t)
	d := newDatapathWith(t, loadOptions{reject: &rejectLimit{interval: interval, burst: burst * interval}})
	tcpSvc := service{id: 1, vip: vip4, proto: protoTCP}
	udpSvc := service{id: 2, vip: vip4, proto: protoUDP}
	// A service whose table is all reject share (backend 0).
	shareSvc := service{id: 6, vip: vip6, proto: protoTCP, backends: []backend{be6a}, table: make([]uint32, testMaglevN)}
	for _, s := range []service{tcpSvc, udpSvc, shareSvc} {
		d.addService(s)
	}
	refused := func(i int) (segment, []byte) {
		switch i % 3 {
		case 0:
			s := syn(client4, vip4).sport(uint16(10000 + i))
			return s, rst(s)
		case 1:
			s := udp(client4, vip4, "q").sport(uint16(10000 + i))
			return s, portUnreachable(s, s.frame())
		default:
			s := syn(client6, vip6).sport(uint16(10000 + i))
			return s, rst(s)
		}
	}
	// send sends refused packets from..to-1, and returns how many were
	// answered (each with its reject) and dropped.
	send := func(from, to int) (rejects, drops int) {
		for i := from; i < to; i++ {
			s, want := refused(i)
			verdict, out := d.run(s.frame())
			switch verdict {
			case verdictRedirect:
				rejects++
				if !bytes.Equal(out, want) {
					t.Errorf("packet %d: the reject differs\n got: %x\nwant: %x", i, out, want)
				}
			case verdictDrop:
				drops++
			default:
				t.Fatalf("packet %d: verdict %d", i, int32(verdict))
			}
		}
		return rejects, drops
	}
	perService := func() map[uint32][2]uint64 {
		m := map[uint32][2]uint64{}
		for _, id := range []uint32{1, 2, 6} {
			st := d.stats(id)
			m[id] = [2]uint64{st.Drops[dropNoBackend], st.Drops[dropRejectLimit]}
		}
		return m
	}

	if r, n := send(0, flood); r != burst || n != flood-burst {
		t.Fatalf("flood of %d: %d rejects and %d drops, want %d and %d", flood, r, n, burst, flood-burst)
	}
	// Rejects for packets 0..4: services 1, 2, 6, 1, 2.
	want := map[uint32][2]uint64{1: {2, 20}, 2: {2, 19}, 6: {1, 20}}
	if got := perService(); !equalCounts(got, want) {
		t.Errorf("counters (no backend, reject limit) by service: %v, want %v", got, want)
	}

	// Two intervals later, as the buckets see it: two more rejects.
	buckets := d.rejectBuckets()
	for i := range buckets {
		if buckets[i].Tat != 0 {
			buckets[i].Tat -= 2 * interval
		}
	}
	d.must(d.objs.L4xdsRejectBucket.Put(uint32(0), buckets), "reject buckets")
	if r, n := send(flood, flood+10); r != 2 || n != 8 {
		t.Errorf("two intervals later: %d rejects and %d drops, want 2 and 8", r, n)
	}

	// A RST is never answered, and takes nothing from the bucket: it is
	// counted as no backend, even with the bucket empty.
	rstSeg := syn(client4, vip4).withFlags(tcpRST)
	if verdict, _ := d.run(rstSeg.frame()); verdict != verdictDrop {
		t.Errorf("RST: verdict %d, want drop", int32(verdict))
	}
	// Rejects for packets 64 and 65 went to services 2 and 6.
	want = map[uint32][2]uint64{1: {2 + 1, 20 + 3}, 2: {3, 19 + 3}, 6: {2, 20 + 2}}
	if got := perService(); !equalCounts(got, want) {
		t.Errorf("counters (no backend, reject limit) by service: %v, want %v", got, want)
	}
}

func equalCounts(a, b map[uint32][2]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// With a rate of 0 no reject is sent at all: every refused packet is
// dropped and counted as reject limit.
func TestNoRejectsAtRateZero(t *testing.T) {
	d := newDatapathWith(t, loadOptions{reject: &rejectLimit{}})
	d.addService(service{id: 1, vip: vip4, proto: protoTCP})
	d.addService(service{id: 2, vip: vip4, proto: protoUDP})
	runSteps(t, d, []step{
		drop("syn", syn(client4, vip4).frame()),
		drop("datagram", udp(client4, vip4, "q").frame()),
		drop("rst", syn(client4, vip4).withFlags(tcpRST).frame()),
	})
	wantStats(t, d, 1, 0, 0, map[int]uint64{dropRejectLimit: 1, dropNoBackend: 1})
	wantStats(t, d, 2, 0, 0, map[int]uint64{dropRejectLimit: 1})
}

// The bucket map is pinned: an agent restarted with a smaller limit finds
// the buckets as the previous one left them, whose tat may be further
// ahead than the new burst could ever take it (a burst of a million
// rejects at 10 a second is a day). Such a bucket is the new limit's
// empty one, from which rejects resume one interval later, not a day.
func TestRejectBucketOfALargerLimitIsTakenAsEmpty(t *testing.T) {
	const interval, burst = uint64(time.Minute), 5 * uint64(time.Minute)
	onOneCPU(t)
	d := newDatapathWith(t, loadOptions{reject: &rejectLimit{interval: interval, burst: burst}})
	d.addService(service{id: 1, vip: vip4, proto: protoTCP})
	buckets := d.rejectBuckets()
	for i := range buckets {
		buckets[i].Tat = monotonicNow(t) + uint64(24*time.Hour)
	}
	d.must(d.objs.L4xdsRejectBucket.Put(uint32(0), buckets), "reject buckets")

	s := syn(client4, vip4)
	if verdict, _ := d.run(s.frame()); verdict != verdictDrop {
		t.Fatalf("SYN on a bucket a day ahead: verdict %d, want drop (the bucket is empty)", int32(verdict))
	}
	// One interval later, as the buckets see it: a reject.
	buckets = d.rejectBuckets()
	for i := range buckets {
		buckets[i].Tat -= interval
	}
	d.must(d.objs.L4xdsRejectBucket.Put(uint32(0), buckets), "reject buckets")
	if verdict, out := d.run(s.sport(40001).frame()); verdict != verdictRedirect || !bytes.Equal(out, rst(s.sport(40001))) {
		t.Errorf("SYN one interval later: verdict %d, want the reject", int32(verdict))
	}
	wantStats(t, d, 1, 0, 0, map[int]uint64{dropRejectLimit: 1, dropNoBackend: 1})
}
