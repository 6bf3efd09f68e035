// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/binary"
	"io"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// answerA answers a query with one A record, 10.96.0.1.
func answerA(t *testing.T, query []byte) []byte {
	var m dnsmessage.Message
	if err := m.Unpack(query); err != nil {
		t.Errorf("server: %v", err)
		return nil
	}
	m.Response = true
	m.Answers = []dnsmessage.Resource{{
		Header: dnsmessage.ResourceHeader{Name: m.Questions[0].Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 30},
		Body:   &dnsmessage.AResource{A: [4]byte{10, 96, 0, 1}},
	}}
	out, err := m.Pack()
	if err != nil {
		t.Errorf("server: %v", err)
	}
	return out
}

// A query over each protocol to a DNS server on loopback, and one to a
// closed port.
func TestQueryA(t *testing.T) {
	udp := listenUDP(t)
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := udp.ReadFrom(buf)
			if err != nil {
				return
			}
			udp.WriteTo(answerA(t, buf[:n]), from)
		}
	}()
	tcp := listenTCP(t)
	go func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			var n uint16
			binary.Read(c, binary.BigEndian, &n)
			q := make([]byte, n)
			io.ReadFull(c, q)
			a := answerA(t, q)
			c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(a))), a...))
			c.Close()
		}
	}()
	for proto, server := range map[string]string{"udp": udp.LocalAddr().String(), "tcp": tcp.Addr().String()} {
		rcode, addrs, err := queryA(server, proto, "kubernetes.default.svc.cluster.local", 2*time.Second)
		if err != nil || rcode != "RCodeSuccess" || !slices.Equal(addrs, []string{"10.96.0.1"}) {
			t.Errorf("%s: %s %v %v, want RCodeSuccess [10.96.0.1]", proto, rcode, addrs, err)
		}
	}
	if _, _, err := queryA(closedPort(t, "udp"), "udp", "example.com", 2*time.Second); err == nil || errorKind("udp", err) != kindUnreachable {
		t.Errorf("closed port: %v, want %s", err, kindUnreachable)
	}
}
