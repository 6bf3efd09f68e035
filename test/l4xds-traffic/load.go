// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/spf13/cobra"
)

// Load modes.
const (
	modeRR      = "rr"      // UDP: request/answer, a window of requests in flight per socket
	modeConnect = "connect" // TCP: connect, read the greeting, close; again
	modeStream  = "stream"  // TCP: stream lines and read their echo
)

// LoadReport is what load prints with -o json.
type LoadReport struct {
	To      string  `json:"to"`
	Proto   string  `json:"proto"`
	Mode    string  `json:"mode"`
	Conns   int     `json:"conns"`
	Size    int     `json:"size"`
	Seconds float64 `json:"seconds"` // measured, from the first flow's start to the last one's end
	// Answered counts UDP answers, Connections completed TCP connections
	// (greeting read), Bytes the payload bytes that came back.
	Answered    int64 `json:"answered"`
	Connections int64 `json:"connections"`
	Bytes       int64 `json:"bytes"`
	// Lost counts UDP datagrams unanswered after --timeout (each is
	// replaced by a new one).
	Lost          int64   `json:"lost"`
	PacketsPerSec float64 `json:"packets_per_sec"` // UDP answers per second
	ConnsPerSec   float64 `json:"conns_per_sec"`
	BitsPerSec    float64 `json:"bits_per_sec"` // payload that came back
	// Backends counts answers (rr), connections (connect) or streams
	// (stream) by the answering backend's serve --name.
	Backends map[string]int64  `json:"backends"`
	Errors   map[string]int    `json:"errors"`
	Examples map[string]string `json:"examples,omitempty"`
}

func loadCommand() *cobra.Command {
	var (
		to, proto, mode     string
		conns, size, window int
		duration, timeout   time.Duration
		output              = outputText
	)
	cmd := &cobra.Command{
		Use:   "load --to ADDR --proto udp|tcp [--mode rr|connect|stream] [--duration D]",
		Short: "Send as much traffic to ADDR as it answers for a while, and report the rates",
		Long: `Load ADDR (a serve address or a VIP in front of them) from --conns flows at
once for --duration, and report the rates:
  udp, mode rr       each socket keeps --window datagrams of --size bytes in
                     flight and sends one more per answer: answers per second;
  tcp, mode connect  each worker connects, reads the greeting (the backend's
                     name) and closes with a reset (no TIME_WAIT), again and
                     again: connections per second;
  tcp, mode stream   each connection streams lines of --size bytes and reads
                     their echo: bits per second of echo.
Answers are counted by the name of the backend that gave them. Exits 1 when
nothing was answered at all.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if mode == "" {
				mode = map[string]string{"udp": modeRR, "tcp": modeConnect}[proto]
			}
			switch {
			case proto == "udp" && mode == modeRR, proto == "tcp" && (mode == modeConnect || mode == modeStream):
			default:
				return fmt.Errorf("--proto %q --mode %q: want udp rr, tcp connect or tcp stream", proto, mode)
			}
			if _, _, err := net.SplitHostPort(to); err != nil {
				return fmt.Errorf("--to %q: %w", to, err)
			}
			if conns < 1 || window < 1 || duration <= 0 || timeout <= 0 {
				return errors.New("--conns and --window must be at least 1, --duration and --timeout positive")
			}
			if size == 0 {
				size = map[string]int{modeRR: 64, modeStream: 64 << 10}[mode]
			}
			if size < 0 || size > maxLine-64 || (mode == modeRR && size > 65507) {
				return fmt.Errorf("--size %d: out of range for %s %s", size, proto, mode)
			}
			r := load(to, proto, mode, conns, size, window, duration, timeout)
			report(output, r, func(w io.Writer) { r.print(w) })
			if r.Answered+r.Connections+r.Bytes == 0 {
				return errTrafficFailed{}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&to, "to", "", "Address to load, host:port ([v6]:port)")
	f.StringVar(&proto, "proto", "udp", "udp or tcp")
	f.StringVar(&mode, "mode", "", "rr (udp), connect or stream (tcp); default rr for udp, connect for tcp")
	f.IntVar(&conns, "conns", 8, "Flows at once: UDP sockets, TCP workers or TCP connections")
	f.IntVar(&size, "size", 0, "Bytes per UDP datagram or TCP line (default 64 for rr, 64 KiB for stream)")
	f.IntVar(&window, "window", 16, "UDP datagrams in flight per socket")
	f.DurationVar(&duration, "duration", 5*time.Second, "How long to load")
	f.DurationVar(&timeout, "timeout", 250*time.Millisecond, "Time an answer, connection or greeting may take")
	f.VarP(&output, "output", "o", "text or json")
	return cmd
}

// loadCounts is one flow's share of a LoadReport.
type loadCounts struct {
	answered, connections, bytes, lost int64
	backends                           map[string]*int64
	errors                             map[string]int
	examples                           map[string]string
}

func (c *loadCounts) backend(name []byte) {
	if n, ok := c.backends[string(name)]; ok {
		*n++
		return
	}
	n := int64(1)
	c.backends[string(name)] = &n
}

func (c *loadCounts) fail(proto string, err error) {
	kind := errorKind(proto, err)
	c.errors[kind]++
	if _, ok := c.examples[kind]; !ok {
		c.examples[kind] = err.Error()
	}
}

func load(to, proto, mode string, conns, size, window int, duration, timeout time.Duration) *LoadReport {
	r := &LoadReport{To: to, Proto: proto, Mode: mode, Conns: conns, Size: size,
		Backends: map[string]int64{}, Errors: map[string]int{}, Examples: map[string]string{}}
	start := time.Now()
	end := start.Add(duration)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			c := &loadCounts{backends: map[string]*int64{}, errors: map[string]int{}, examples: map[string]string{}}
			switch mode {
			case modeRR:
				loadRR(c, to, size, window, end, timeout)
			case modeConnect:
				loadConnect(c, to, end, timeout)
			case modeStream:
				loadStream(c, to, size, end, timeout)
			}
			mu.Lock()
			defer mu.Unlock()
			r.Answered += c.answered
			r.Connections += c.connections
			r.Bytes += c.bytes
			r.Lost += c.lost
			for name, n := range c.backends {
				r.Backends[name] += *n
			}
			for kind, n := range c.errors {
				r.Errors[kind] += n
				if _, ok := r.Examples[kind]; !ok {
					r.Examples[kind] = c.examples[kind]
				}
			}
		})
	}
	wg.Wait()
	r.Seconds = time.Since(start).Seconds()
	r.PacketsPerSec = float64(r.Answered) / r.Seconds
	r.ConnsPerSec = float64(r.Connections) / r.Seconds
	r.BitsPerSec = float64(r.Bytes) * 8 / r.Seconds
	return r
}

// loadRR keeps window datagrams in flight on one connected socket until
// end: one more for each answer, and one for each datagram still
// unanswered after timeout (lost: UDP has no retransmission), so that a
// loss does not shrink the window for the rest of the run.
func loadRR(c *loadCounts, to string, size, window int, end time.Time, timeout time.Duration) {
	conn, err := net.Dial("udp", to)
	if err != nil {
		c.fail("udp", err)
		return
	}
	defer conn.Close()
	req := filler(size)
	buf := make([]byte, 2048)
	var sent, lost int64
	send := func(n int64) bool {
		for range n {
			if _, err := conn.Write(req); err != nil {
				c.fail("udp", err)
				return false
			}
			sent++
		}
		return true
	}
	// Every timeout (a tick), what was sent before the previous tick and
	// is still unanswered counts as lost. The read deadline is the next
	// tick: a deadline per datagram would cost a timer update each.
	var sentByLastTick int64
	tick := time.Now()
	need := int64(window)
	for now := tick; now.Before(end); now = time.Now() {
		if !now.Before(tick) {
			if l := sentByLastTick - c.answered - lost; l > 0 {
				lost += l
				need += l
			}
			sentByLastTick = sent
			tick = now.Add(timeout)
			if tick.After(end) {
				tick = end
			}
			conn.SetReadDeadline(tick)
		}
		if need > 0 && !send(need) {
			// An ICMP error (no backend): wait a little, then again.
			time.Sleep(10 * time.Millisecond)
			need = int64(window) - (sent - c.answered - lost)
			continue
		}
		need = 0
		n, err := conn.Read(buf)
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			continue
		case err != nil:
			c.fail("udp", err)
			continue
		}
		c.answered++
		c.bytes += int64(n)
		c.backend(buf[:n])
		need = 1
	}
	c.lost = lost
}

// loadConnect opens connections one after the other until end.
func loadConnect(c *loadCounts, to string, end time.Time, timeout time.Duration) {
	for time.Now().Before(end) {
		conn, err := net.DialTimeout("tcp", to, timeout)
		if err != nil {
			c.fail("tcp", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		conn.SetDeadline(time.Now().Add(timeout))
		name, err := greeting(bufio.NewReader(conn))
		// A reset instead of a FIN: no TIME_WAIT, so the client's ports
		// last through the run.
		conn.(*net.TCPConn).SetLinger(0)
		conn.Close()
		if err != nil {
			c.fail("tcp", err)
			continue
		}
		c.connections++
		c.bytes += int64(len(name) + 1)
		c.backend([]byte(name))
	}
}

// loadStream streams lines of size bytes over one connection until end and
// counts the echo that comes back.
func loadStream(c *loadCounts, to string, size int, end time.Time, timeout time.Duration) {
	conn, err := net.DialTimeout("tcp", to, timeout)
	if err != nil {
		c.fail("tcp", err)
		return
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(timeout))
	r := bufio.NewReaderSize(conn, 256<<10)
	name, err := greeting(r)
	if err != nil {
		c.fail("tcp", err)
		return
	}
	c.connections++
	c.backend([]byte(name))
	line := append(filler(size), '\n')
	conn.SetDeadline(end)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := conn.Write(line); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 256<<10)
	for {
		n, err := r.Read(buf)
		c.bytes += int64(n)
		if err != nil {
			var ne net.Error
			if !(errors.As(err, &ne) && ne.Timeout()) && !errors.Is(err, io.EOF) {
				c.fail("tcp", err)
			}
			break
		}
	}
	<-done
}

func (r *LoadReport) print(w io.Writer) {
	fmt.Fprintf(w, "%s %s %s: %d flows of %d bytes for %.1f s\n", r.Proto, r.Mode, r.To, r.Conns, r.Size, r.Seconds)
	switch r.Mode {
	case modeRR:
		fmt.Fprintf(w, "  %d answered: %.0f packets/s, %d lost\n", r.Answered, r.PacketsPerSec, r.Lost)
	case modeConnect:
		fmt.Fprintf(w, "  %d connections: %.0f connections/s\n", r.Connections, r.ConnsPerSec)
	case modeStream:
		fmt.Fprintf(w, "  %d bytes echoed: %.3f Gbit/s\n", r.Bytes, r.BitsPerSec/1e9)
	}
	for _, name := range slices.Sorted(maps.Keys(r.Backends)) {
		fmt.Fprintf(w, "  %-16s %10d\n", name, r.Backends[name])
	}
	for _, kind := range slices.Sorted(maps.Keys(r.Errors)) {
		fmt.Fprintf(w, "  failed: %-22s %6d  (%s)\n", kind, r.Errors[kind], r.Examples[kind])
	}
}
