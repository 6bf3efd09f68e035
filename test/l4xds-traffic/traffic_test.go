// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/l4xds/l4xds/test/ports"
)

// Serve and probe over loopback: answers are counted by name, and a closed
// port fails with the kind the tests and the demo look for.
func TestProbeCountsAnswersAndClassifiesFailures(t *testing.T) {
	l, c := listenTCP(t), listenUDP(t)
	go serveTCP(l, "tcp-server")
	go serveUDP(c, "udp-server", false)
	closedTCP, closedUDP := closedPort(t, "tcp"), closedPort(t, "udp")

	for _, tc := range []struct {
		name, to, proto string
		answered        map[string]int
		failed          map[string]int
	}{
		{"tcp answered", l.Addr().String(), "tcp", map[string]int{"tcp-server": 20}, map[string]int{}},
		{"udp answered", c.LocalAddr().String(), "udp", map[string]int{"udp-server": 20}, map[string]int{}},
		{"tcp refused", closedTCP, "tcp", map[string]int{}, map[string]int{kindRefused: 20}},
		{"udp ICMP unreachable", closedUDP, "udp", map[string]int{}, map[string]int{kindUnreachable: 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := probe(tc.to, tc.proto, 20, 4, 0, 2*time.Second, 0)
			if !maps.Equal(r.Backends, tc.answered) || !maps.Equal(r.Errors, tc.failed) {
				var out bytes.Buffer
				r.print(&out, nil)
				t.Errorf("got %s", out.String())
			}
		})
	}
}

// closedPort is a loopback address nothing listens on, and no flow's own
// source port.
func closedPort(t *testing.T, proto string) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", ports.Free(t, proto, 1)[0])
}

// A closed port in the kernel's ephemeral range may become a flow's own
// source port, and a UDP flow to itself reads its own datagram back.
func TestClosedPortIsNoFlowsSourcePort(t *testing.T) {
	lo, err := ports.EphemeralFirst()
	if err != nil {
		t.Skip(err)
	}
	for _, proto := range []string{"tcp", "udp"} {
		for range 20 {
			_, p, _ := net.SplitHostPort(closedPort(t, proto))
			if n, _ := strconv.Atoi(p); n >= lo {
				t.Fatalf("closed %s port %d is in the ephemeral range, from %d", proto, n, lo)
			}
		}
	}
}

func TestHoldEchoesOverOneConnection(t *testing.T) {
	l := listenTCP(t)
	go serveTCP(l, "b0")
	if err := hold(t.Context(), l.Addr().String(), time.Millisecond, time.Second, 3); err != nil {
		t.Fatal(err)
	}
}

func TestReportShowsTheExpectedSplit(t *testing.T) {
	backends, err := parseBackends([]string{"a=70", "b=30", "c=10:terminating"})
	if err != nil {
		t.Fatal(err)
	}
	r := &Report{To: "10.1.2.7:7777", Proto: "udp", Flows: 100, Answered: 100,
		Backends: map[string]int{"a": 69, "b": 30, "x": 1}}
	var out bytes.Buffer
	r.print(&out, backends)
	for _, want := range []string{
		"a                    70  active            70.0%      69   69.0%",
		"b                    30  active            30.0%      30   30.0%",
		"c                    10  terminating        0.0%       0    0.0%",
		"x                     -  not configured     0.0%       1    1.0%",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	for _, bad := range []string{"a", "a=", "=1", "a=x", "a=-1"} {
		if _, err := parseBackends([]string{bad}); err == nil {
			t.Errorf("--backend %q accepted", bad)
		}
	}
}

// Every command that reports takes -o text or json, and refuses anything
// else before it sends a packet.
func TestOutputFormatIsCheckedWhenParsed(t *testing.T) {
	for _, cmd := range []*cobra.Command{probeCommand(), loadCommand(), dnsCommand()} {
		cmd.SetArgs([]string{"-o", "yaml"})
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), `invalid argument "yaml" for "-o, --output" flag: want text or json`) {
			t.Errorf("%s -o yaml: %v, want the flag's error", cmd.Name(), err)
		}
	}
}

// With --source-port, each flow has a port of its own: the kernel's choice
// may give a closed flow's port to a later one, and two flows then share
// one 5-tuple (and one conntrack entry of the load balancer).
func TestProbeSourcePortGivesEachFlowItsOwnPort(t *testing.T) {
	const flows = 50
	c := listenUDP(t)
	var (
		mu   sync.Mutex
		sent = map[int]int{}
	)
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			mu.Lock()
			sent[from.(*net.UDPAddr).Port]++
			mu.Unlock()
			c.WriteTo([]byte("b0"), from)
		}
	}()
	first := ports.Consecutive(t, "udp", flows)
	r := probe(c.LocalAddr().String(), "udp", flows, 16, 0, 2*time.Second, first)
	if r.Answered != flows {
		var out bytes.Buffer
		r.print(&out, nil)
		t.Fatalf("got %s", out.String())
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range flows {
		if sent[first+i] != 1 {
			t.Errorf("port %d sent %d datagrams, want 1 (all: %v)", first+i, sent[first+i], sent)
		}
	}
	if len(sent) != flows {
		t.Errorf("%d source ports for %d flows from %d: %v", len(sent), flows, first, sent)
	}

	if err := checkSourcePorts(65500, flows); err == nil || !strings.Contains(err.Error(), "--source-port 65500: the 50 flows need ports 65500 to 65549") {
		t.Errorf("--source-port beyond 65535: %v", err)
	}
}
