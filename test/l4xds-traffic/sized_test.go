// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"maps"
	"net"
	"testing"
	"time"
)

// Sized probes over loopback: full answers are counted by name; answers cut
// short or with other bytes fail with their own kind.
func TestSizedProbeChecksTheWholeAnswer(t *testing.T) {
	tcpEcho := listenTCP(t)
	go serveTCP(tcpEcho, "tcp-server")
	padded, plain := listenUDP(t), listenUDP(t)
	go serveUDP(padded, "padded", true)
	go serveUDP(plain, "plain", false)

	// Servers that answer the right length with the wrong bytes, or too
	// little.
	flipped := udpAnswerer(t, func(req []byte) []byte {
		a := padAnswer("flipped", req)
		a[len(a)-1] ^= 1
		return a
	})
	long := udpAnswerer(t, func(req []byte) []byte { return append(padAnswer("long", req), 'x') })
	halfEcho := tcpAnswerer(t, func(echo []byte) []byte { return echo[:len(echo)/2] })
	badEcho := tcpAnswerer(t, func(echo []byte) []byte { return bytes.ToUpper(echo) })

	for _, tc := range []struct {
		name, to, proto string
		size            int
		answered        map[string]int
		failed          map[string]int
	}{
		{"udp 4000 bytes padded", padded.LocalAddr().String(), "udp", 4000, map[string]int{"padded": 10}, map[string]int{}},
		{"udp 16000 bytes padded", padded.LocalAddr().String(), "udp", 16000, map[string]int{"padded": 10}, map[string]int{}},
		{"udp exactly NAME and newline", padded.LocalAddr().String(), "udp", len("padded\n"), map[string]int{"padded": 10}, map[string]int{}},
		{"tcp 64 KiB echoed", tcpEcho.Addr().String(), "tcp", 64 << 10, map[string]int{"tcp-server": 10}, map[string]int{}},
		{"tcp 1 byte echoed", tcpEcho.Addr().String(), "tcp", 1, map[string]int{"tcp-server": 10}, map[string]int{}},
		{"udp unpadded server: short", plain.LocalAddr().String(), "udp", 4000, map[string]int{}, map[string]int{kindShort: 10}},
		{"udp too short for the name: the name alone, garbled", padded.LocalAddr().String(), "udp", 3, map[string]int{}, map[string]int{kindGarbled: 10}},
		{"udp one byte changed: garbled", flipped, "udp", 4000, map[string]int{}, map[string]int{kindGarbled: 10}},
		{"udp one byte too many: garbled", long, "udp", 4000, map[string]int{}, map[string]int{kindGarbled: 10}},
		{"tcp half an echo, then closed: short", halfEcho, "tcp", 64 << 10, map[string]int{}, map[string]int{kindShort: 10}},
		{"tcp other bytes: garbled", badEcho, "tcp", 64 << 10, map[string]int{}, map[string]int{kindGarbled: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := probe(tc.to, tc.proto, 10, 4, tc.size, 2*time.Second, 0)
			if !maps.Equal(r.Backends, tc.answered) || !maps.Equal(r.Errors, tc.failed) {
				var out bytes.Buffer
				r.print(&out, nil)
				t.Errorf("got %s", out.String())
			}
		})
	}
}

func TestPadAnswer(t *testing.T) {
	for _, tc := range []struct {
		name, datagram, want string
	}{
		{"b0", "abcdefgh", "b0\ndefgh"},
		{"b0", "abc", "b0\n"},
		{"b0", "ab", "b0"},
		{"b0", "", "b0"},
	} {
		if got := string(padAnswer(tc.name, []byte(tc.datagram))); got != tc.want {
			t.Errorf("padAnswer(%q, %q) = %q, want %q", tc.name, tc.datagram, got, tc.want)
		}
	}
}

func listenTCP(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func listenUDP(t *testing.T) net.PacketConn {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// udpAnswerer answers every datagram with answer(datagram).
func udpAnswerer(t *testing.T, answer func([]byte) []byte) string {
	c := listenUDP(t)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			c.WriteTo(answer(buf[:n]), from)
		}
	}()
	return c.LocalAddr().String()
}

// tcpAnswerer greets as serve does, then sends answer(the echo serve would
// send) for the first line and closes.
func tcpAnswerer(t *testing.T, answer func([]byte) []byte) string {
	l := listenTCP(t)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte("bad\n"))
				line, err := bufio.NewReaderSize(c, maxLine).ReadBytes('\n')
				if err != nil {
					return
				}
				c.Write(answer(append([]byte("bad "), line...)))
			}()
		}
	}()
	return l.Addr().String()
}
