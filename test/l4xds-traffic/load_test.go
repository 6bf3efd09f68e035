// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"testing"
	"time"
)

// Load over loopback: every mode gets answers, all counted by the
// server's name, and rates that follow from the counts.
func TestLoadModes(t *testing.T) {
	l, c := listenTCP(t), listenUDP(t)
	go serveTCP(l, "tcp-server")
	go serveUDP(c, "udp-server", false)

	for _, tc := range []struct {
		to, proto, mode string
		server          string
		count           func(r *LoadReport) int64
		rate            func(r *LoadReport) float64
	}{
		{c.LocalAddr().String(), "udp", modeRR, "udp-server",
			func(r *LoadReport) int64 { return r.Answered }, func(r *LoadReport) float64 { return r.PacketsPerSec }},
		{l.Addr().String(), "tcp", modeConnect, "tcp-server",
			func(r *LoadReport) int64 { return r.Connections }, func(r *LoadReport) float64 { return r.ConnsPerSec }},
		{l.Addr().String(), "tcp", modeStream, "tcp-server",
			func(r *LoadReport) int64 { return r.Connections }, func(r *LoadReport) float64 { return r.BitsPerSec }},
	} {
		t.Run(tc.proto+" "+tc.mode, func(t *testing.T) {
			r := load(tc.to, tc.proto, tc.mode, 2, 1024, 4, 300*time.Millisecond, time.Second)
			var out bytes.Buffer
			r.print(&out)
			if len(r.Errors) > 0 || tc.count(r) == 0 || r.Bytes == 0 {
				t.Fatalf("nothing or errors:\n%s", out.String())
			}
			if len(r.Backends) != 1 || r.Backends[tc.server] != tc.count(r) {
				t.Errorf("backends %v, want all %d counted as %s:\n%s", r.Backends, tc.count(r), tc.server, out.String())
			}
			if r.Seconds < 0.3 || tc.rate(r) <= 0 {
				t.Errorf("%.3f s, rate %f:\n%s", r.Seconds, tc.rate(r), out.String())
			}
			if tc.mode == modeStream && r.Bytes < 1024 {
				t.Errorf("stream echoed %d bytes, not one line of 1024:\n%s", r.Bytes, out.String())
			}
		})
	}
}

// A port nobody serves: nothing answered, and the failure is named.
func TestLoadFailsWithoutServer(t *testing.T) {
	r := load(closedPort(t, "tcp"), "tcp", modeConnect, 1, 0, 1, 100*time.Millisecond, time.Second)
	if r.Connections != 0 || r.Errors[kindRefused] == 0 {
		t.Errorf("connections %d, errors %v; want none, and connection refused", r.Connections, r.Errors)
	}
}

// A server that leaves every other datagram unanswered: the lost ones are
// counted and replaced, so the window never runs dry and answers keep
// coming for the whole run.
func TestLoadReplacesLostDatagrams(t *testing.T) {
	c := listenUDP(t)
	go func() {
		buf := make([]byte, 2048)
		for i := 0; ; i++ {
			_, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			if i%2 == 0 {
				c.WriteTo([]byte("lossy"), from)
			}
		}
	}()
	r := load(c.LocalAddr().String(), "udp", modeRR, 1, 64, 4, time.Second, 20*time.Millisecond)
	var out bytes.Buffer
	r.print(&out)
	// Without replacement the window of 4 would be gone after about 8
	// answers; with it, a few come back every 20 ms tick.
	if r.Lost == 0 || r.Answered < 40 || r.Backends["lossy"] != r.Answered {
		t.Errorf("want answers all from lossy, many of them, and lost datagrams counted:\n%s", out.String())
	}
}
