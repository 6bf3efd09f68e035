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

func serveCommand() *cobra.Command {
	var name string
	var tcp, udp []string
	cmd := &cobra.Command{
		Use:   "serve --name NAME [--tcp ADDR]... [--udp ADDR]...",
		Short: "Answer each TCP connection and UDP datagram with NAME",
		Long: `Answer each TCP connection with a line "NAME", then every line received with
"NAME LINE" (an echo that shows which backend holds a long-lived connection),
and each UDP datagram with "NAME". ADDR ":53" listens on IPv4 and IPv6.
Prints "ready" once every address is bound.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" || strings.ContainsAny(name, " \n") {
				return fmt.Errorf("--name %q: want one word", name)
			}
			if len(tcp)+len(udp) == 0 {
				return errors.New("nothing to serve: give --tcp or --udp addresses")
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return serve(ctx, name, tcp, udp)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "Name to answer with (one word)")
	cmd.Flags().StringArrayVar(&tcp, "tcp", nil, "TCP address to listen on (repeatable)")
	cmd.Flags().StringArrayVar(&udp, "udp", nil, "UDP address to listen on (repeatable)")
	return cmd
}

func serve(ctx context.Context, name string, tcp, udp []string) error {
	var closers []func() error
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	errs := make(chan error, len(tcp)+len(udp))
	for _, addr := range tcp {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		closers = append(closers, l.Close)
		go func() { errs <- serveTCP(l, name) }()
	}
	for _, addr := range udp {
		c, err := net.ListenPacket("udp", addr)
		if err != nil {
			return err
		}
		closers = append(closers, c.Close)
		go func() { errs <- serveUDP(c, name) }()
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
			for lines.Scan() {
				if _, err := fmt.Fprintln(c, name, lines.Text()); err != nil {
					return
				}
			}
		}()
	}
}

func serveUDP(c net.PacketConn, name string) error {
	buf := make([]byte, 64<<10)
	for {
		_, from, err := c.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("udp %s: %w", c.LocalAddr(), err)
		}
		// A failed answer (the client went away) is the client's concern.
		c.WriteTo([]byte(name), from)
	}
}
