// SPDX-License-Identifier: Apache-2.0

package dbg

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/l4xds/l4xds/pkg/datapath"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

func svcEntry(fe string, id, count uint32) datapath.ServiceEntry {
	a, err := lb.ParseL3n4Addr(fe)
	if err != nil {
		panic(err)
	}
	return datapath.ServiceEntry{Frontend: a, ID: id, Count: count}
}

// single makes s a service of one backend for new flows, named by its entry.
func single(s datapath.ServiceEntry, backend uint32) datapath.ServiceEntry {
	s.Backend = backend
	return s
}

func beEntry(id uint32, addr string, state lb.BackendState, svc uint32) datapath.BackendEntry {
	return datapath.BackendEntry{ID: id, Address: netip.MustParseAddrPort(addr), State: state, ServiceID: svc}
}

// table builds a Maglev table: n slots of each id, in turn.
func maglevTable(slots map[uint32]int) []uint32 {
	var out []uint32
	for id := uint32(0); len(slots) > 0; id++ {
		if n, ok := slots[id]; ok {
			for range n {
				out = append(out, id)
			}
			delete(slots, id)
		}
	}
	return out
}

func TestLBListPrintsServicesByFrontendWithTheirShares(t *testing.T) {
	db := svcEntry("10.1.2.3:3306/TCP", 2, 2)
	db.SourceRanges, db.Affinity, db.AffinityTimeout = true, true, 3*time.Hour
	var dbStats datapath.Stats
	dbStats.Packets, dbStats.Bytes = 1200, 96000
	dbStats.Drops[datapath.DropSourceRange] = 3
	var uncharged datapath.Stats
	uncharged.Drops[datapath.DropUnknownPort] = 5

	for _, c := range []struct {
		name string
		in   lbMaps
		want string
	}{
		{
			name: "weights 70/30, a draining backend, ranges, affinity and counters",
			in: lbMaps{
				services: []datapath.ServiceEntry{db},
				backends: []datapath.BackendEntry{
					beEntry(3, "192.168.1.12:3306", lb.BackendStateTerminating, 2),
					beEntry(1, "192.168.1.10:3306", lb.BackendStateActive, 2),
					beEntry(2, "192.168.1.11:3306", lb.BackendStateActive, 2),
				},
				ranges: []datapath.SourceRangeEntry{
					{ServiceID: 2, Prefix: netip.MustParsePrefix("2001:db8::/32")},
					{ServiceID: 2, Prefix: netip.MustParsePrefix("10.0.0.0/8")},
				},
				maglev: map[uint32][]uint32{2: maglevTable(map[uint32]int{1: 715, 2: 306})},
				stats:  map[uint32]datapath.Stats{2: dbStats, 0: uncharged},
			},
			want: `
Frontend            Service   Backend                    State         Slots   Share
10.1.2.3:3306/TCP   2         192.168.1.10:3306 (id 1)   active        715     70.0%
                              192.168.1.11:3306 (id 2)   active        306     30.0%
                              192.168.1.12:3306 (id 3)   terminating   0       0.0%
                              source ranges: 10.0.0.0/8, 2001:db8::/32
                              session affinity: 3h0m0s
                              1200 packets, 96000 bytes, drops: 3 source range
1 service, 3 backends; drops to a VIP charged to no service: 5 unknown port
`,
		},
		{
			name: "sorted by frontend; no backend for new flows stands out",
			in: lbMaps{
				services: []datapath.ServiceEntry{
					svcEntry("[2001:db8::1]:53/UDP", 4, 1),
					svcEntry("10.1.2.53:53/UDP", 3, 0),
					svcEntry("10.1.2.53:53/TCP", 5, 1),
				},
				backends: []datapath.BackendEntry{
					beEntry(7, "192.168.1.10:53", lb.BackendStateQuarantined, 3),
					beEntry(8, "[2001:db8::10]:53", lb.BackendStateActive, 4),
					beEntry(9, "192.168.1.10:53", lb.BackendStateActive, 5),
				},
				maglev: map[uint32][]uint32{4: maglevTable(map[uint32]int{8: 7}), 5: maglevTable(map[uint32]int{9: 7})},
				stats:  map[uint32]datapath.Stats{},
			},
			want: `
Frontend               Service   Backend                    State         Slots   Share
10.1.2.53:53/TCP       5         192.168.1.10:53 (id 9)     active        7       100.0%
                                 0 packets, 0 bytes, drops: none
10.1.2.53:53/UDP       3         ! no backend takes new flows: new connections are rejected (TCP RST, ICMP port unreachable)
                                 192.168.1.10:53 (id 7)     quarantined   0       0.0%
                                 0 packets, 0 bytes, drops: none
[2001:db8::1]:53/UDP   4         [2001:db8::10]:53 (id 8)   active        7       100.0%
                                 0 packets, 0 bytes, drops: none
3 services, 3 backends
`,
		},
		{
			name: "a reject share: slots of backend 0",
			in: lbMaps{
				services: []datapath.ServiceEntry{svcEntry("10.1.2.6:53/UDP", 8, 1)},
				backends: []datapath.BackendEntry{beEntry(14, "192.168.1.30:53", lb.BackendStateActive, 8)},
				maglev:   map[uint32][]uint32{8: maglevTable(map[uint32]int{14: 715, 0: 306})},
				stats:    map[uint32]datapath.Stats{},
			},
			want: `
Frontend          Service   Backend                      State    Slots   Share
10.1.2.6:53/UDP   8         192.168.1.30:53 (id 14)      active   715     70.0%
                            reject (new flows refused)            306     30.0%
                            0 packets, 0 bytes, drops: none
1 service, 1 backend
`,
		},
		{
			name: "one backend: named by the service entry, no Maglev table",
			in: lbMaps{
				services: []datapath.ServiceEntry{
					single(svcEntry("10.1.2.4:80/TCP", 6, 1), 11),
					single(svcEntry("10.1.2.5:80/TCP", 7, 1), 99),
				},
				backends: []datapath.BackendEntry{
					beEntry(11, "192.168.1.20:80", lb.BackendStateActive, 6),
					beEntry(12, "192.168.1.21:80", lb.BackendStateTerminating, 6),
					beEntry(13, "192.168.1.22:80", lb.BackendStateActive, 7),
				},
				stats: map[uint32]datapath.Stats{},
			},
			want: `
Frontend          Service   Backend                   State         Slots   Share
10.1.2.4:80/TCP   6         192.168.1.20:80 (id 11)   active        0       100.0%
                            192.168.1.21:80 (id 12)   terminating   0       0.0%
                            0 packets, 0 bytes, drops: none
10.1.2.5:80/TCP   7         ! the service's one backend id 99 is not one of its backends: its new flows are dropped
                            192.168.1.22:80 (id 13)   active        0       0.0%
                            0 packets, 0 bytes, drops: none
2 services, 3 backends
`,
		},
		{
			name: "maps that disagree",
			in: lbMaps{
				services: []datapath.ServiceEntry{svcEntry("10.1.2.3:80/TCP", 2, 2)},
				backends: []datapath.BackendEntry{
					beEntry(1, "192.168.1.10:80", lb.BackendStateActive, 2),
					beEntry(5, "192.168.1.99:80", lb.BackendStateActive, 42),
				},
				ranges:    []datapath.SourceRangeEntry{{ServiceID: 2, Prefix: netip.MustParsePrefix("10.0.0.0/8")}},
				maglev:    map[uint32][]uint32{2: maglevTable(map[uint32]int{1: 3, 6: 4})},
				maglevIDs: []uint32{9, 2},
				stats:     map[uint32]datapath.Stats{},
			},
			want: `
Frontend          Service   Backend                  State    Slots   Share
10.1.2.3:80/TCP   2         ! source ranges 10.0.0.0/8 in the map but not enforced
                            ! 4 Maglev slots name backend id 6, which is not one of this service's: its new flows are rejected
                            192.168.1.10:80 (id 1)   active   3       42.9%
                            0 packets, 0 bytes, drops: none
1 service, 1 backend
! backend 192.168.1.99:80 (id 5, active) belongs to service 42, which is not in the map
! a Maglev table of service 9, which is not in the map
`,
		},
		{
			name: "empty maps",
			in:   lbMaps{stats: map[uint32]datapath.Stats{}},
			want: `
Frontend   Service   Backend   State   Slots   Share
0 services, 0 backends
`,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := printLBList(&out, newLBList(c.in)); err != nil {
				t.Fatal(err)
			}
			if want := strings.TrimPrefix(c.want, "\n"); out.String() != want {
				t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
			}
		})
	}
}

func TestLBListJSONHasEveryField(t *testing.T) {
	s := svcEntry("10.1.2.3:3306/TCP", 2, 1)
	s.SourceRanges = true
	list := newLBList(lbMaps{
		services: []datapath.ServiceEntry{s},
		backends: []datapath.BackendEntry{beEntry(1, "192.168.1.10:3306", lb.BackendStateActive, 2)},
		maglev:   map[uint32][]uint32{2: {1, 1, 1}},
		stats:    map[uint32]datapath.Stats{},
	})
	var out bytes.Buffer
	if err := writeJSON(&out, list); err != nil {
		t.Fatal(err)
	}
	want := `{
  "services": [
    {
      "frontend": "10.1.2.3:3306/TCP",
      "id": 2,
      "sourceRanges": [],
      "takesNewFlows": true,
      "maglevSlots": 3,
      "backends": [
        {
          "address": "192.168.1.10:3306",
          "id": 1,
          "state": "active",
          "slots": 3,
          "share": 100
        }
      ],
      "packets": 0,
      "bytes": 0,
      "problems": [
        "source ranges enforced but none allowed: every client is dropped"
      ]
    }
  ]
}
`
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestCTListPrintsFlowsByFrontendAndClient(t *testing.T) {
	ap := netip.MustParseAddrPort
	now := 10 * time.Hour
	info := pinnedInfo{backends: map[uint32]datapath.BackendEntry{
		1: beEntry(1, "192.168.1.10:3306", lb.BackendStateActive, 2),
		4: beEntry(4, "192.168.1.11:53", lb.BackendStateActive, 3),
	}}
	entries := []datapath.CTEntry{
		{Reply: true, Protocol: lb.TCP, Client: ap("10.0.0.2:40000"), Frontend: ap("10.1.2.3:3306"), Backend: ap("192.168.1.10:3306"),
			BackendID: 1, ServiceID: 2, Closing: true, LastSeen: now - 4*time.Second},
		{Protocol: lb.UDP, Client: ap("10.0.0.2:5353"), Frontend: ap("10.1.2.53:53"), BackendID: 4, ServiceID: 3, LastSeen: now - 90*time.Second},
		{Protocol: lb.TCP, Client: ap("10.0.0.2:40000"), Frontend: ap("10.1.2.3:3306"), BackendID: 1, ServiceID: 2, Closing: true, LastSeen: now - 4*time.Second},
		{Protocol: lb.TCP, Client: ap("10.0.0.1:50000"), Frontend: ap("10.1.2.3:3306"), BackendID: 9, ServiceID: 2, LastSeen: now - time.Minute},
	}
	var out bytes.Buffer
	list := newCTList(entries, info, now)
	if err := printCTList(&out, list); err != nil {
		t.Fatal(err)
	}
	want := `Proto   Client           Frontend        Backend                    Service   Dir       Flags     Expires
TCP     10.0.0.1:50000   10.1.2.3:3306   id 9, not in the map       2         forward   -         in 5h59m
TCP     10.0.0.2:40000   10.1.2.3:3306   192.168.1.10:3306 (id 1)   2         forward   closing   in 6s
TCP     10.0.0.2:40000   10.1.2.3:3306   192.168.1.10:3306 (id 1)   2         reply     closing   in 6s
UDP     10.0.0.2:5353    10.1.2.53:53    192.168.1.11:53 (id 4)     3         forward   -         expired 30s ago
4 entries: 3 forward, 1 reply, 1 expired
`
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
	if f := list.Entries[3]; !f.Expired || f.RemainingSeconds != -30 || f.Backend != "192.168.1.11:53" {
		t.Errorf("expired UDP entry: %+v", f)
	}
}

func TestAffinityListUsesTheServiceTimeout(t *testing.T) {
	now := 10 * time.Hour
	svc := svcEntry("10.1.2.3:3306/TCP", 2, 1)
	svc.Affinity, svc.AffinityTimeout = true, time.Hour
	info := pinnedInfo{
		services: map[uint32]datapath.ServiceEntry{2: svc},
		backends: map[uint32]datapath.BackendEntry{1: beEntry(1, "192.168.1.10:3306", lb.BackendStateActive, 2)},
	}
	list := newAffinityList([]datapath.AffinityEntry{
		{Client: netip.MustParseAddr("10.0.0.2"), ServiceID: 2, BackendID: 1, LastUsed: now - 10*time.Minute},
		{Client: netip.MustParseAddr("10.0.0.3"), ServiceID: 7, BackendID: 3, LastUsed: now - time.Second},
	}, info, now)
	var out bytes.Buffer
	if err := printAffinityList(&out, list); err != nil {
		t.Fatal(err)
	}
	want := `Client     Service                 Backend                    Expires
10.0.0.2   2 (10.1.2.3:3306/TCP)   192.168.1.10:3306 (id 1)   in 50m0s
10.0.0.3   7 (gone)                id 3, not in the map       expired 1s ago
2 entries
`
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestAgeRoundsForPeople(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:                       "0s",
		1500 * time.Millisecond:            "2s",
		5*time.Minute + 3*time.Second:      "5m3s",
		2*time.Hour + 4*time.Minute:        "2h4m",
		76*time.Hour + 20*time.Minute:      "3d4h",
		6*time.Hour - 200*time.Millisecond: "6h0m",
	} {
		if got := age(d); got != want {
			t.Errorf("age(%s) = %s, want %s", d, got, want)
		}
	}
}
