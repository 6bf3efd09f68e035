// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/net/dns/dnsmessage"
)

// DNSReport is what dns prints with -o json.
type DNSReport struct {
	Server  string   `json:"server"`
	Proto   string   `json:"proto"`
	Name    string   `json:"name"`
	RCode   string   `json:"rcode,omitempty"`
	Answers []string `json:"answers"` // the A records' addresses, in order
	Error   string   `json:"error,omitempty"`
}

func dnsCommand() *cobra.Command {
	var (
		server, proto, name string
		timeout             time.Duration
		output              = outputText
	)
	cmd := &cobra.Command{
		Use:   "dns --server ADDR --name NAME [--proto udp|tcp]",
		Short: "Ask a DNS server for the A records of NAME and print the answers",
		Long: `Send one DNS query for the A records of NAME to ADDR (host:port), over UDP
or TCP (the message prefixed with its length), and print the addresses
answered. It proves that a real DNS server behind a VIP answers real
queries, on both protocols of port 53.
Exits 1 when the query fails or the answer is not RCodeSuccess (NOERROR)
with an A record.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if proto != "tcp" && proto != "udp" {
				return fmt.Errorf("--proto %q: want tcp or udp", proto)
			}
			if _, _, err := net.SplitHostPort(server); err != nil {
				return fmt.Errorf("--server %q: %w", server, err)
			}
			r := &DNSReport{Server: server, Proto: proto, Name: name, Answers: []string{}}
			rcode, answers, err := queryA(server, proto, name, timeout)
			r.RCode, r.Answers = rcode, append(r.Answers, answers...)
			if err != nil {
				r.Error = err.Error()
			}
			report(output, r, func(w io.Writer) { r.print(w) })
			if err != nil || rcode != dnsmessage.RCodeSuccess.String() || len(answers) == 0 {
				return errTrafficFailed{}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&server, "server", "", "DNS server, host:port ([v6]:port)")
	f.StringVar(&proto, "proto", "udp", "udp or tcp")
	f.StringVar(&name, "name", "", "Name to resolve (A records)")
	f.DurationVar(&timeout, "timeout", 2*time.Second, "Time the query may take")
	f.VarP(&output, "output", "o", "text or json")
	cmd.MarkFlagRequired("server")
	cmd.MarkFlagRequired("name")
	return cmd
}

func (r *DNSReport) print(w io.Writer) {
	if r.Error != "" {
		fmt.Fprintf(w, "%s A? via %s/%s: failed: %s\n", r.Name, r.Server, r.Proto, r.Error)
		return
	}
	fmt.Fprintf(w, "%s A? via %s/%s: %s %s\n", r.Name, r.Server, r.Proto, r.RCode, strings.Join(r.Answers, " "))
}

// queryA asks server for the A records of name, and returns the answer's
// rcode and addresses.
func queryA(server, proto, name string, timeout time.Duration) (string, []string, error) {
	qname, err := dnsmessage.NewName(dnsName(name))
	if err != nil {
		return "", nil, fmt.Errorf("name %q: %w", name, err)
	}
	id := uint16(rand.Uint32())
	q := dnsmessage.Question{Name: qname, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}
	msg, err := (&dnsmessage.Message{Header: dnsmessage.Header{ID: id, RecursionDesired: true}, Questions: []dnsmessage.Question{q}}).Pack()
	if err != nil {
		return "", nil, fmt.Errorf("packing the query: %w", err)
	}
	c, err := net.DialTimeout(proto, server, timeout)
	if err != nil {
		return "", nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	answer, err := exchange(c, proto, msg)
	if err != nil {
		return "", nil, err
	}
	var m dnsmessage.Message
	if err := m.Unpack(answer); err != nil {
		return "", nil, fmt.Errorf("unpacking the answer: %w", err)
	}
	if m.ID != id || !m.Response || len(m.Questions) != 1 || m.Questions[0] != q {
		return "", nil, fmt.Errorf("the answer (id %d, %d questions) is not to the query (id %d)", m.ID, len(m.Questions), id)
	}
	var addrs []string
	for _, a := range m.Answers {
		if rr, ok := a.Body.(*dnsmessage.AResource); ok {
			addrs = append(addrs, net.IP(rr.A[:]).String())
		}
	}
	return m.RCode.String(), addrs, nil
}

// exchange sends a DNS message and reads the answer: one datagram over
// UDP, a length-prefixed message over TCP (RFC 1035 4.2.2).
func exchange(c net.Conn, proto string, msg []byte) ([]byte, error) {
	if proto == "udp" {
		if _, err := c.Write(msg); err != nil {
			return nil, err
		}
		buf := make([]byte, 65535)
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...)); err != nil {
		return nil, err
	}
	var n uint16
	if err := binary.Read(c, binary.BigEndian, &n); err != nil {
		return nil, fmt.Errorf("reading the answer's length: %w", err)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(c, buf); err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	return buf, nil
}

// dnsName makes name fully qualified: the query is for exactly this name,
// no search list.
func dnsName(name string) string {
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	return name
}
