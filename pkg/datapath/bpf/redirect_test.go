// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A translated packet goes straight to its next hop (fib_forward): what
// the FIB of the namespace BPF_PROG_RUN runs in says decides between
// TCX_REDIRECT with the TTL or hop limit one lower, and TCX_NEXT with the
// packet as the stack would get it before.

// routedNetns creates a network namespace that forwards and has routes to
// the tests' clients (198.51.100.0/24, 2001:db8:1::/64) and backends
// (10.1.0.0/24, fd00::/64) through two veth pairs, and no default route.
// It is deleted when the test ends.
func routedNetns(tb testing.TB) string {
	tb.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skipf("needs ip(8) from iproute2: %v", err)
	}
	b := make([]byte, 3)
	rand.Read(b)
	ns := "l4xbpf" + hex.EncodeToString(b)
	ip := func(args ...string) {
		tb.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			tb.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", ns)
	tb.Cleanup(func() { exec.Command("ip", "netns", "delete", ns).Run() })
	sysctl := "echo 1 > /proc/sys/net/ipv4/ip_forward; echo 1 > /proc/sys/net/ipv6/conf/all/forwarding"
	if out, err := exec.Command("ip", "netns", "exec", ns, "sh", "-ec", sysctl).CombinedOutput(); err != nil {
		tb.Fatalf("forwarding in %s: %v: %s", ns, err, out)
	}
	ip("-n", ns, "link", "set", "lo", "up")
	for _, l := range []struct{ dev, v4, v6 string }{
		{"lan", "10.1.0.254/24", "fd00::fe/64"},
		{"wan", "198.51.100.254/24", "2001:db8:1::fe/64"},
	} {
		ip("-n", ns, "link", "add", l.dev, "type", "veth", "peer", "name", l.dev+"p")
		ip("-n", ns, "link", "set", l.dev+"p", "up")
		ip("-n", ns, "link", "set", l.dev, "up")
		ip("-n", ns, "addr", "add", l.v4, "dev", l.dev)
		ip("-n", ns, "addr", "add", l.v6, "dev", l.dev, "nodad")
	}
	return ns
}

// inNetns runs fn on a thread that has entered namespace ns (BPF_PROG_RUN
// runs the program in the namespace of the calling thread).
func inNetns(tb testing.TB, ns string, fn func()) {
	tb.Helper()
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		tb.Fatal(err)
	}
	defer orig.Close()
	target, err := os.Open(filepath.Join("/run/netns", ns))
	if err != nil {
		tb.Fatal(err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		tb.Fatalf("enter %s: %v", ns, err)
	}
	defer func() {
		// A thread that cannot go back stays locked: Go ends it with the
		// goroutine instead of reusing it.
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			tb.Errorf("leave %s: %v", ns, err)
			return
		}
		runtime.UnlockOSThread()
	}()
	fn()
}

func TestForwardToNextHop(t *testing.T) {
	d := newDatapathWith(t, loadOptions{fibRedirect: true})
	ns := routedNetns(t)
	unrouted4 := backend{id: 21, addr: netip.MustParseAddrPort("10.9.9.9:8080")}
	unrouted6 := backend{id: 22, addr: netip.MustParseAddrPort("[fd09::9]:8080")}
	d.addService(service{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}})
	d.addService(service{id: 2, vip: vip4, proto: protoUDP, backends: []backend{unrouted4}})
	d.addService(service{id: 6, vip: vip6, proto: protoTCP, backends: []backend{be6a}})
	d.addService(service{id: 7, vip: vip6, proto: protoUDP, backends: []backend{unrouted6}})

	ttl := func(s segment, ttl uint8) segment { s.ttl = ttl; return s }
	data := func(src, dst netip.AddrPort) segment {
		return segment{src: src, dst: dst, proto: protoTCP, flags: tcpACK, seq: 1001, ack: 5001, payload: []byte("data")}
	}
	for _, fam := range []struct {
		name              string
		client, vip       netip.AddrPort
		backend, unrouted netip.AddrPort
	}{
		{"IPv4", client4, vip4, be4a.addr, unrouted4.addr},
		{"IPv6", client6, vip6, be6a.addr, unrouted6.addr},
	} {
		t.Run(fam.name, func(t *testing.T) {
			fwd := data(fam.client, fam.vip)
			answer := data(fam.backend, fam.client)
			lastHop := ttl(data(netip.AddrPortFrom(fam.client.Addr(), 40001), fam.vip), 1)
			toUnrouted := udp(fam.client, fam.vip, "hello")
			steps := []step{
				{name: "to the backend's next hop, TTL down by one", in: syn(fam.client, fam.vip).frame(),
					verdict: verdictRedirect, want: ttl(syn(fam.client, fam.backend), 63).frame()},
				{name: "the flow's next packet too", in: fwd.frame(),
					verdict: verdictRedirect, want: ttl(fwd.to(fam.backend), 63).frame()},
				{name: "the backend's answer to the client's next hop", in: answer.frame(),
					verdict: verdictRedirect, want: ttl(answer.from(fam.vip), 63).frame()},
				{name: "TTL 1 is the stack's, which sends time exceeded", in: lastHop.frame(),
					verdict: verdictNext, want: lastHop.to(fam.backend).frame()},
				{name: "a backend with no route is the stack's", in: toUnrouted.frame(),
					verdict: verdictNext, want: toUnrouted.to(fam.unrouted).frame()},
			}
			inNetns(t, ns, func() {
				for _, s := range steps {
					verdict, out := d.run(s.in)
					out = out[:len(s.want)]
					if verdict != s.verdict {
						t.Errorf("%s: verdict %d, want %d", s.name, int32(verdict), int32(s.verdict))
					}
					if string(out) != string(s.want) {
						t.Errorf("%s:\n got %x\nwant %x", s.name, out, s.want)
					}
					verifyChecksums(t, s.name, out)
				}
			})
		})
	}
}

// Without fib_redirect (the harness's default), the same packets in the
// same namespace go on to the stack untouched but for the translation.
func TestForwardToNextHopOff(t *testing.T) {
	d := newDatapath(t)
	ns := routedNetns(t)
	d.addService(service{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}})
	inNetns(t, ns, func() {
		verdict, out := d.run(syn(client4, vip4).frame())
		want := syn(client4, be4a.addr).frame()
		if verdict != verdictNext || string(out[:len(want)]) != string(want) {
			t.Errorf("verdict %d, packet %x; want TCX_NEXT and %x", int32(verdict), out[:len(want)], want)
		}
	})
}
