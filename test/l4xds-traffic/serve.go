// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// maxLine is the longest line a TCP server echoes: enough for probe --size
// up to 1 MiB (bufio.Scanner stops at 64 KiB by default).
const maxLine = 1 << 20

func serveCommand() *cobra.Command {
	var name string
	var tcp, udp, udpPadded []string
	cmd := &cobra.Command{
		Use:   "serve --name NAME [--tcp ADDR]... [--udp ADDR]... [--udp-padded ADDR]...",
		Short: "Answer each TCP connection and UDP datagram with NAME",
		Long: `Answer each TCP connection with a line "NAME", then every line received with
"NAME LINE" (an echo that shows which backend holds a long-lived connection),
and each UDP datagram with "NAME". ADDR ":53" listens on IPv4 and IPv6.
On a --udp-padded address the answer is as long as the datagram: "NAME",
a newline, then the datagram's own bytes after that many bytes, so that a
large datagram gets an equally large (fragmented) answer that still names
the backend, and the prober can check every byte (probe --size).
Prints "ready" once every address is bound.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" || strings.ContainsAny(name, " \n") {
				return fmt.Errorf("--name %q: want one word", name)
			}
			if len(tcp)+len(udp)+len(udpPadded) == 0 {
				return errors.New("nothing to serve: give --tcp, --udp or --udp-padded addresses")
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return serve(ctx, name, tcp, udp, udpPadded)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "Name to answer with (one word)")
	cmd.Flags().StringArrayVar(&tcp, "tcp", nil, "TCP address to listen on (repeatable)")
	cmd.Flags().StringArrayVar(&udp, "udp", nil, "UDP address to listen on (repeatable)")
	cmd.Flags().StringArrayVar(&udpPadded, "udp-padded", nil, "UDP address whose answers are padded to the datagram's size (repeatable)")
	return cmd
}

func serve(ctx context.Context, name string, tcp, udp, udpPadded []string) error {
	var closers []func() error
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	errs := make(chan error, len(tcp)+len(udp)+len(udpPadded))
	for _, addr := range tcp {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		closers = append(closers, l.Close)
		go func() { errs <- serveTCP(l, name) }()
	}
	for _, s := range []struct {
		addrs  []string
		padded bool
	}{{udp, false}, {udpPadded, true}} {
		for _, addr := range s.addrs {
			c, err := net.ListenPacket("udp", addr)
			if err != nil {
				return err
			}
			closers = append(closers, c.Close)
			go func() { errs <- serveUDP(c, name, s.padded) }()
		}
	}
	fmt.Println("ready")
	select {
	case <-ctx.Done():
		return nil
	case err := <-errs:
		return err
	}
}

func serveTCP(l net.Listener, name string) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return fmt.Errorf("tcp %s: %w", l.Addr(), err)
		}
		go func() {
			defer c.Close()
			if _, err := fmt.Fprintln(c, name); err != nil {
				return
			}
			lines := bufio.NewScanner(c)
			lines.Buffer(nil, maxLine)
			for lines.Scan() {
				if _, err := fmt.Fprintln(c, name, lines.Text()); err != nil {
					return
				}
			}
		}()
	}
}

func serveUDP(c net.PacketConn, name string, padded bool) error {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("udp %s: %w", c.LocalAddr(), err)
		}
		answer := []byte(name)
		if padded {
			answer = padAnswer(name, buf[:n])
		}
		// A failed answer (the client went away) is the client's concern.
		c.WriteTo(answer, from)
	}
}

// padAnswer is the answer of a --udp-padded address to datagram: NAME and a
// newline over the datagram's first bytes, the rest of it unchanged. A
// datagram too short to hold the name gets the name alone.
func padAnswer(name string, datagram []byte) []byte {
	head := name + "\n"
	if len(datagram) < len(head) {
		return []byte(name)
	}
	answer := make([]byte, len(datagram))
	copy(answer, datagram)
	copy(answer, head)
	return answer
}

// greeting reads the line a TCP server sends first: its name.
func greeting(r *bufio.Reader) (string, error) {
	name, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(name), nil
}
