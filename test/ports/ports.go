// SPDX-License-Identifier: Apache-2.0

// Package ports picks ports for tests below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range). The kernel gives none of them to a socket
// that did not ask for one, so a port found free stays free until the test
// binds it, and a closed port stays closed: it is never a connection's own
// source port (a UDP flow to its own port reads its datagram back, and a
// TCP one connects to itself).
package ports

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// first is the lowest port handed out: below it are the well-known and
// registered ports that services on the host may hold.
const first = 10000

var (
	mu    sync.Mutex
	given = map[int]bool{} // not handed out twice in one test binary
)

// EphemeralFirst is the first port of the kernel's ephemeral range.
func EphemeralFirst() (int, error) {
	const path = "/proc/sys/net/ipv4/ip_local_port_range"
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, fmt.Errorf("%s: %q, want two ports", path, b)
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	if lo < first+1000 {
		return 0, fmt.Errorf("%s: the ephemeral range starts at %d, leaving no room above %d for the tests' ports", path, lo, first)
	}
	return lo, nil
}

// Free returns n ports that are free now on every address for network
// ("tcp" or "udp"), none handed out before in this test binary.
func Free(tb testing.TB, network string, n int) []int {
	tb.Helper()
	var ports []int
	for range n {
		ports = append(ports, Consecutive(tb, network, 1))
	}
	return ports
}

// Consecutive returns the first of n consecutive ports that are free now,
// as Free's are.
func Consecutive(tb testing.TB, network string, n int) int {
	tb.Helper()
	lo, err := EphemeralFirst()
	if err != nil {
		tb.Fatal(err)
	}
	if n < 1 || n > lo-first {
		tb.Fatalf("%d consecutive ports: want 1 to %d", n, lo-first)
	}
	mu.Lock()
	defer mu.Unlock()
	for range 1000 {
		p := first + rand.IntN(lo-first-n+1)
		if free(network, p, n) {
			for i := range n {
				given[p+i] = true
			}
			return p
		}
	}
	tb.Fatalf("no %d consecutive free %s ports found between %d and %d", n, network, first, lo)
	return 0
}

// free tells whether ports p to p+n-1 are free for network and were not
// handed out before. The caller holds mu.
func free(network string, p, n int) bool {
	for q := p; q < p+n; q++ {
		if given[q] || !bindable(network, q) {
			return false
		}
	}
	return true
}

func bindable(network string, p int) bool {
	addr := ":" + strconv.Itoa(p)
	if network == "udp" {
		c, err := net.ListenPacket("udp", addr)
		if err != nil {
			return false
		}
		return c.Close() == nil
	}
	l, err := net.Listen(network, addr)
	if err != nil {
		return false
	}
	return l.Close() == nil
}
