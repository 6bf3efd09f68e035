// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

// Kinds of failed flows.
const (
	kindRefused     = "connection refused" // TCP: a RST answered the SYN
	kindUnreachable = "ICMP unreachable"   // UDP: ICMP port unreachable (ECONNREFUSED on a connected socket)
	kindHost        = "host unreachable"
	kindNetwork     = "network unreachable"
	kindTimeout     = "timeout"
	kindReset       = "connection reset"
	kindNoAnswer    = "closed without answer"
	kindShort       = "short answer"   // --size: fewer bytes than sent (or than the TCP echo needs)
	kindGarbled     = "garbled answer" // --size: wrong length or bytes, no backend name
	kindOther       = "other"
)

// Report is what probe prints with -o json.
type Report struct {
	To       string `json:"to"`
	Proto    string `json:"proto"`
	Flows    int    `json:"flows"`
	Size     int    `json:"size,omitempty"` // bytes of each request (--size; 0: small)
	Answered int    `json:"answered"`
	// Backends counts the flows each backend (by its serve --name) answered.
	Backends map[string]int `json:"backends"`
	// Errors counts failed flows by kind; Examples holds one message each.
	Errors   map[string]int    `json:"errors"`
	Examples map[string]string `json:"examples,omitempty"`
}

func probeCommand() *cobra.Command {
	var (
		to, proto         string
		flows, conc, size int
		sourcePort        int
		timeout           time.Duration
		configured        []string
		output            = outputText
	)
	cmd := &cobra.Command{
		Use:   "probe --to ADDR --proto tcp|udp [--flows N]",
		Short: "Open N new flows to ADDR and count the backends that answered",
		Long: `Open N new flows to ADDR, each from a new socket (so a new source port):
TCP connects and reads the server's name; UDP sends a datagram on a connected
socket and reads the answer. Prints the flows per backend and the failures by
kind: "connection refused", "ICMP unreachable", "timeout", ...
With --size N, UDP sends an N-byte datagram (to a serve --udp-padded
address, which answers with as many bytes) and TCP sends an N-byte line
after the name (which serve echoes after "NAME "); every byte of the answer
is checked, and a flow whose answer is cut short or differs fails as
"short answer" or "garbled answer".
With --source-port P, flow i is sent from port P+i: the flows are N distinct
5-tuples for certain (kernel-chosen ports may repeat once a flow's socket is
closed), for tests that count the datapath's state per flow.
With --backend NAME=WEIGHT[:STATE] for each configured backend, the text
report shows every backend's expected share of new flows beside the measured
one (only active backends expect new flows).
Exits 1 when a flow failed (after printing the report).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if proto != "tcp" && proto != "udp" {
				return fmt.Errorf("--proto %q: want tcp or udp", proto)
			}
			if _, _, err := net.SplitHostPort(to); err != nil {
				return fmt.Errorf("--to %q: %w", to, err)
			}
			if flows < 1 || conc < 1 {
				return errors.New("--flows and --concurrency must be at least 1")
			}
			if size < 0 || size > maxLine {
				return fmt.Errorf("--size %d: want 0 (small default) to %d bytes", size, maxLine)
			}
			if err := checkSourcePorts(sourcePort, flows); err != nil {
				return err
			}
			backends, err := parseBackends(configured)
			if err != nil {
				return err
			}
			r := probe(to, proto, flows, conc, size, timeout, sourcePort)
			report(output, r, func(w io.Writer) { r.print(w, backends) })
			if r.Answered < r.Flows {
				return errTrafficFailed{}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&to, "to", "", "Address to probe, host:port ([v6]:port)")
	f.StringVar(&proto, "proto", "tcp", "tcp or udp")
	f.IntVar(&flows, "flows", 100, "Number of new flows")
	f.IntVar(&conc, "concurrency", 16, "Flows in flight at once")
	f.IntVar(&size, "size", 0, "Request size in bytes, answered in full and checked (0: a small request, the name as answer)")
	f.DurationVar(&timeout, "timeout", time.Second, "Time a flow may take")
	f.IntVar(&sourcePort, "source-port", 0, "Send flow i from port P+i (0: ports the kernel picks, which may repeat)")
	f.VarP(&output, "output", "o", "text or json")
	f.StringArrayVar(&configured, "backend", nil, "A configured backend, NAME=WEIGHT[:STATE] (repeatable; STATE default active)")
	return cmd
}

// checkSourcePorts checks that --source-port leaves room for the flows.
func checkSourcePorts(first, flows int) error {
	if first != 0 && (first < 1 || first+flows-1 > 65535) {
		return fmt.Errorf("--source-port %d: the %d flows need ports %d to %d, want 1 to 65535", first, flows, first, first+flows-1)
	}
	return nil
}

// probe opens the flows; with sourcePort, flow i from port sourcePort+i.
func probe(to, proto string, flows, conc, size int, timeout time.Duration, sourcePort int) *Report {
	r := &Report{To: to, Proto: proto, Flows: flows, Size: size,
		Backends: map[string]int{}, Errors: map[string]int{}, Examples: map[string]string{}}
	var mu sync.Mutex
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(conc, flows) {
		wg.Go(func() {
			for i := range work {
				port := 0
				if sourcePort != 0 {
					port = sourcePort + i
				}
				name, err := flow(to, proto, size, timeout, port)
				mu.Lock()
				if err != nil {
					kind := errorKind(proto, err)
					r.Errors[kind]++
					if _, ok := r.Examples[kind]; !ok {
						r.Examples[kind] = err.Error()
					}
				} else {
					r.Answered++
					r.Backends[name]++
				}
				mu.Unlock()
			}
		})
	}
	for i := range flows {
		work <- i
	}
	close(work)
	wg.Wait()
	return r
}

// flow opens one new flow, from port sport if not 0, and returns the name
// of the backend that answered.
func flow(to, proto string, size int, timeout time.Duration, sport int) (string, error) {
	d := net.Dialer{Timeout: timeout}
	if sport != 0 {
		if proto == "tcp" {
			d.LocalAddr = &net.TCPAddr{Port: sport}
		} else {
			d.LocalAddr = &net.UDPAddr{Port: sport}
		}
	}
	c, err := d.Dial(proto, to)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	switch {
	case proto == "tcp" && size > 0:
		return sizedTCP(c, size)
	case proto == "tcp":
		return greeting(bufio.NewReader(c))
	case size > 0:
		return sizedUDP(c, size)
	}
	if _, err := c.Write([]byte("probe")); err != nil {
		return "", err
	}
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

func errorKind(proto string, err error) string {
	var ne net.Error
	var ae *answerError
	switch {
	case errors.As(err, &ae):
		return ae.kind
	case errors.Is(err, syscall.ECONNREFUSED):
		if proto == "udp" {
			return kindUnreachable
		}
		return kindRefused
	case errors.Is(err, syscall.EHOSTUNREACH):
		return kindHost
	case errors.Is(err, syscall.ENETUNREACH):
		return kindNetwork
	case errors.Is(err, syscall.ECONNRESET):
		return kindReset
	case errors.Is(err, io.EOF):
		return kindNoAnswer
	case errors.As(err, &ne) && ne.Timeout():
		return kindTimeout
	}
	return kindOther
}

// backend is a configured backend given with --backend: what the split
// should look like.
type backend struct {
	name   string
	weight int
	state  string
}

func parseBackends(specs []string) ([]backend, error) {
	var bs []backend
	for _, spec := range specs {
		name, rest, ok := strings.Cut(spec, "=")
		weight, state, _ := strings.Cut(rest, ":")
		b := backend{name: name, state: cmp.Or(state, "active")}
		var err error
		if b.weight, err = strconv.Atoi(weight); !ok || name == "" || err != nil || b.weight < 0 {
			return nil, fmt.Errorf("--backend %q: want NAME=WEIGHT[:STATE]", spec)
		}
		bs = append(bs, b)
	}
	return bs, nil
}

func (r *Report) print(w io.Writer, configured []backend) {
	sized := ""
	if r.Size > 0 {
		sized = fmt.Sprintf(" of %d bytes", r.Size)
	}
	fmt.Fprintf(w, "%s %s: %d flows%s, %d answered, %d failed\n", r.Proto, r.To, r.Flows, sized, r.Answered, r.Flows-r.Answered)
	share := func(n, of int) string {
		if of == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
	}
	if len(configured) == 0 {
		for _, name := range slices.Sorted(maps.Keys(r.Backends)) {
			fmt.Fprintf(w, "  %-16s %6d  %6s\n", name, r.Backends[name], share(r.Backends[name], r.Flows))
		}
	} else {
		active := 0
		for _, b := range configured {
			if b.state == "active" {
				active += b.weight
			}
		}
		fmt.Fprintf(w, "  %-16s %6s  %-14s %8s  %6s  %6s\n", "backend", "weight", "state", "expected", "flows", "share")
		listed := map[string]bool{}
		for _, b := range configured {
			listed[b.name] = true
			expect := 0
			if b.state == "active" {
				expect = b.weight
			}
			fmt.Fprintf(w, "  %-16s %6d  %-14s %8s  %6d  %6s\n", b.name, b.weight, b.state, share(expect, active), r.Backends[b.name], share(r.Backends[b.name], r.Flows))
		}
		for _, name := range slices.Sorted(maps.Keys(r.Backends)) {
			if !listed[name] {
				fmt.Fprintf(w, "  %-16s %6s  %-14s %8s  %6d  %6s\n", name, "-", "not configured", "0.0%", r.Backends[name], share(r.Backends[name], r.Flows))
			}
		}
	}
	for _, kind := range slices.Sorted(maps.Keys(r.Errors)) {
		fmt.Fprintf(w, "  failed: %-22s %6d  (%s)\n", kind, r.Errors[kind], r.Examples[kind])
	}
}
