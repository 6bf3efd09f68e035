// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unsafe"

	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// be parses "addr:port[/state][,w=N][,p=N]".
func be(s string) *lb.Backend {
	fields := strings.Split(s, ",")
	addr, state, _ := strings.Cut(fields[0], "/")
	b := &lb.Backend{BackendParams: lb.BackendParams{Weight: 1}}
	a, err := lb.ParseL3n4Addr(addr)
	if err != nil {
		panic(err)
	}
	b.Address = a
	if state != "" {
		if b.State, err = lb.ParseBackendState(state); err != nil {
			panic(err)
		}
	}
	for _, f := range fields[1:] {
		var n int
		switch {
		case strings.HasPrefix(f, "w="):
			fmt.Sscan(f[2:], &n)
			b.Weight = uint16(n)
		case strings.HasPrefix(f, "p="):
			fmt.Sscan(f[2:], &n)
			b.Priority = uint32(n)
		}
	}
	return b
}

// show prints the desired backends as "addr[*]" (* = usable).
func (d desiredService) show() string {
	var out []string
	for _, b := range d.backends {
		s := b.addr.String()
		if b.usable {
			s += "*"
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

func TestDesireFiltersTheFamilyAndPicksTheUsableBackends(t *testing.T) {
	for _, c := range []struct {
		name     string
		vip      string
		backends []string
		want     string
		usable   int
	}{
		{"all active", "10.0.0.1:80/TCP", []string{"192.168.1.10:80", "192.168.1.11:80"},
			"192.168.1.10:80* 192.168.1.11:80*", 2},
		{"IPv4 VIP keeps IPv4 backends", "10.0.0.1:80/TCP", []string{"192.168.1.10:80", "[2001:db8::10]:80"},
			"192.168.1.10:80*", 1},
		{"IPv6 VIP keeps IPv6 backends", "[2001:db8::1]:80/TCP", []string{"192.168.1.10:80", "[2001:db8::10]:80"},
			"[2001:db8::10]:80*", 1},
		{"draining and unhealthy take no new flows", "10.0.0.1:80/TCP",
			[]string{"192.168.1.10:80/terminating", "192.168.1.11:80/quarantined", "192.168.1.12:80/maintenance", "192.168.1.13:80"},
			"192.168.1.10:80 192.168.1.11:80 192.168.1.12:80 192.168.1.13:80*", 1},
		{"weight 0 takes no new flows", "10.0.0.1:80/TCP", []string{"192.168.1.10:80,w=0", "192.168.1.11:80,w=3"},
			"192.168.1.10:80 192.168.1.11:80*", 1},
		{"lowest priority with an active backend", "10.0.0.1:80/TCP",
			[]string{"192.168.1.10:80/quarantined", "192.168.1.11:80,p=1", "192.168.1.12:80,p=1", "192.168.1.13:80,p=2"},
			"192.168.1.10:80 192.168.1.11:80* 192.168.1.12:80* 192.168.1.13:80", 2},
		{"priority 0 back", "10.0.0.1:80/TCP", []string{"192.168.1.10:80", "192.168.1.11:80,p=1"},
			"192.168.1.10:80* 192.168.1.11:80", 1},
		{"none usable", "10.0.0.1:80/TCP", []string{"192.168.1.10:80/terminating", "[2001:db8::10]:80"},
			"192.168.1.10:80", 0},
		{"no backends", "10.0.0.1:80/TCP", nil, "", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &lb.Frontend{FrontendParams: lb.FrontendParams{Address: fe(c.vip)}, Service: &lb.Service{}}
			for _, s := range c.backends {
				f.Backends = append(f.Backends, be(s))
			}
			d := desire(f)
			if got := d.show(); got != c.want || d.usable != c.usable {
				t.Errorf("backends %q (%d usable), want %q (%d usable)", got, d.usable, c.want, c.usable)
			}
			if d.flags != 0 || len(d.ranges) != 0 {
				t.Errorf("flags %b ranges %v for a service without ranges or affinity", d.flags, d.ranges)
			}
		})
	}
}

func TestDesireFlagsRangesAndAffinity(t *testing.T) {
	for _, c := range []struct {
		name     string
		svc      *lb.Service
		flags    uint32
		timeout  uint32
		ranges   string
		backends string
	}{
		{"none", &lb.Service{}, 0, 0, "[]", ""},
		{"no service", nil, 0, 0, "[]", ""},
		{"source ranges, masked and once",
			&lb.Service{SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.1.2.3/8"), netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("::ffff:10.0.0.0/104")}},
			svcFlagSourceRanges, 0, "[10.0.0.0/8 2001:db8::/32]", ""},
		{"affinity", &lb.Service{SessionAffinity: true, SessionAffinityTimeout: 3 * time.Hour}, svcFlagAffinity, 10800, "[]", ""},
		{"affinity rounds up", &lb.Service{SessionAffinity: true, SessionAffinityTimeout: 1500 * time.Millisecond}, svcFlagAffinity, 2, "[]", ""},
		{"affinity of at least a second", &lb.Service{SessionAffinity: true}, svcFlagAffinity, 1, "[]", ""},
		{"both", &lb.Service{SessionAffinity: true, SessionAffinityTimeout: time.Minute, SourceRanges: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}},
			svcFlagSourceRanges | svcFlagAffinity, 60, "[192.0.2.0/24]", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := desire(&lb.Frontend{FrontendParams: lb.FrontendParams{Address: fe("10.0.0.1:80/TCP")}, Service: c.svc})
			if d.flags != c.flags || d.affinityTimeout != c.timeout || fmt.Sprint(d.ranges) != c.ranges {
				t.Errorf("flags %b timeout %d ranges %v, want %b %d %s", d.flags, d.affinityTimeout, d.ranges, c.flags, c.timeout, c.ranges)
			}
		})
	}
}

func TestTheUsableBackendsAreTheActiveOnesOfNonZeroWeight(t *testing.T) {
	f := &lb.Frontend{FrontendParams: lb.FrontendParams{Address: fe("10.0.0.1:80/TCP")}}
	f.Backends = []*lb.Backend{be("192.168.1.10:80,w=70"), be("192.168.1.11:80/terminating"), be("192.168.1.12:80,w=30"), be("192.168.1.13:80,w=0")}
	d := desire(f)
	var usable []string
	for _, b := range d.backends {
		if b.usable {
			usable = append(usable, fmt.Sprintf("%s w=%d", b.addr, b.weight))
		}
	}
	if want := "[192.168.1.10:80 w=70 192.168.1.12:80 w=30]"; fmt.Sprint(usable) != want || d.usable != 2 {
		t.Errorf("usable backends %v (%d), want %s", usable, d.usable, want)
	}
}

// bytesOf returns the memory of v, as the kernel sees it.
func bytesOf[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

// bytes16 is b followed by zeros, 16 bytes.
func bytes16(b ...byte) []byte { return append(b, make([]byte, 16-len(b))...) }

func TestEncodingMatchesTheMapContract(t *testing.T) {
	key, err := svcKeyToBPF(fe("10.1.2.3:3306/TCP"))
	if err != nil {
		t.Fatal(err)
	}
	// ::ffff:10.1.2.3, port 3306 in network order, IPPROTO_TCP, pad.
	want := []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3, 0x0c, 0xea, 6, 0}
	if got := bytesOf(&key); string(got) != string(want) {
		t.Errorf("service key bytes % x, want % x", got, want)
	}
	for _, s := range []string{"10.1.2.3:3306/TCP", "[2001:db8::1]:53/UDP", "0.0.0.0:1/UDP"} {
		k, _ := svcKeyToBPF(fe(s))
		if back, err := svcKeyFromBPF(k); err != nil || back != fe(s) {
			t.Errorf("service key %s round trip: %s, %v", s, back, err)
		}
	}
	if _, err := svcKeyToBPF(lb.L3n4Addr{Addr: netip.MustParseAddr("10.0.0.1"), Port: 1}); err == nil {
		t.Error("a frontend without protocol encodes")
	}

	for _, c := range []struct {
		prefix    string
		prefixlen uint32
		family    uint32
		addr      []byte // the key's 16 address bytes
	}{
		// The service (32 bits) and the family (32) come before the
		// address: no prefix of one family covers the other's.
		{"10.1.2.0/24", 32 + 32 + 24, familyIPv4, bytes16(10, 1, 2, 0)},
		{"0.0.0.0/0", 32 + 32, familyIPv4, bytes16()},
		{"2001:db8::/32", 32 + 32 + 32, familyIPv6, bytes16(0x20, 0x01, 0x0d, 0xb8)},
		{"::/0", 32 + 32, familyIPv6, bytes16()},
		{"::ffff:10.0.0.0/104", 32 + 32 + 8, familyIPv4, bytes16(10)}, // IPv4-mapped IPv6 is IPv4, as in Kubernetes
	} {
		p := netip.MustParsePrefix(c.prefix)
		k := srcRangeToBPF(7, p)
		if k.Prefixlen != c.prefixlen || k.SvcId != 7 || k.Family != c.family {
			t.Errorf("%s: prefixlen %d svc %d family %d, want %d 7 %d", p, k.Prefixlen, k.SvcId, k.Family, c.prefixlen, c.family)
		}
		if got := bytesOf(&k)[12:]; string(got) != string(c.addr) {
			t.Errorf("%s: address bytes % x, want % x", p, got, c.addr)
		}
		back, err := srcRangeFromBPF(k)
		want := p
		if p.Addr().Is4In6() {
			want = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if err != nil || back != want {
			t.Errorf("%s: round trip %s, %v; want %s", p, back, err, want)
		}
	}

	b := backendToBPF(3, netip.MustParseAddrPort("192.168.1.10:3306"), lb.BackendStateTerminating)
	raw := bytesOf(&b)
	if got := binary.BigEndian.Uint16(raw[16:]); got != 3306 || raw[18] != 1 || backendAddrFromBPF(b).String() != "192.168.1.10:3306" {
		t.Errorf("backend bytes % x", raw)
	}
}
