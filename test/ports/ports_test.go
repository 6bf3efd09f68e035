// SPDX-License-Identifier: Apache-2.0

package ports

import (
	"net"
	"strconv"
	"testing"
)

func TestPortsAreFreeBelowTheEphemeralRangeAndNeverGivenTwice(t *testing.T) {
	lo, err := EphemeralFirst()
	if err != nil {
		t.Skip(err)
	}
	seen := map[int]bool{}
	check := func(network string, p int) {
		t.Helper()
		if p < first || p >= lo {
			t.Errorf("%s port %d, want %d to %d", network, p, first, lo-1)
		}
		if seen[p] {
			t.Errorf("%s port %d handed out twice", network, p)
		}
		seen[p] = true
		if !bindable(network, p) {
			t.Errorf("%s port %d is not free", network, p)
		}
	}
	for _, network := range []string{"tcp", "udp"} {
		for _, p := range Free(t, network, 50) {
			check(network, p)
		}
		p := Consecutive(t, network, 20)
		for i := range 20 {
			check(network, p+i)
		}
	}
}

func TestATakenPortIsNotFree(t *testing.T) {
	l, err := net.Listen("tcp", ":"+strconv.Itoa(Free(t, "tcp", 1)[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if bindable("tcp", l.Addr().(*net.TCPAddr).Port) {
		t.Errorf("%s is bound and bindable", l.Addr())
	}
}
