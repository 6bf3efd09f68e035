// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

func holdCommand() *cobra.Command {
	var (
		to                string
		interval, timeout time.Duration
		count             int
	)
	cmd := &cobra.Command{
		Use:   "hold --to ADDR [--interval D]",
		Short: "Keep one TCP connection to ADDR and echo over it at an interval",
		Long: `Keep one TCP connection to ADDR (a serve --tcp address or a VIP in front of
them) and send one line every interval. Prints "connected NAME", then one
line per echo: "ok NAME SEQ", or "fail SEQ: ERROR" and exits 1 at the first
failure. Ends cleanly on SIGINT/SIGTERM or after --count echoes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return hold(ctx, to, interval, timeout, count)
		},
	}
	f := cmd.Flags()
	f.StringVar(&to, "to", "", "TCP address, host:port ([v6]:port)")
	f.DurationVar(&interval, "interval", 200*time.Millisecond, "Time between echoes")
	f.DurationVar(&timeout, "timeout", 5*time.Second, "Time an echo may take")
	f.IntVar(&count, "count", 0, "Stop after this many echoes (0: until signalled)")
	return cmd
}

func hold(ctx context.Context, to string, interval, timeout time.Duration, count int) error {
	c, err := net.DialTimeout("tcp", to, timeout)
	if err != nil {
		fmt.Printf("fail 0: %v\n", err)
		return errTrafficFailed{}
	}
	defer c.Close()
	r := bufio.NewReader(c)
	c.SetDeadline(time.Now().Add(timeout))
	name, err := greeting(r)
	if err != nil {
		fmt.Printf("fail 0: %v\n", err)
		return errTrafficFailed{}
	}
	fmt.Printf("connected %s\n", name)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for seq := 1; count == 0 || seq <= count; seq++ {
		select {
		case <-ctx.Done():
			fmt.Printf("stopped after %d echoes\n", seq-1)
			return nil
		case <-tick.C:
		}
		c.SetDeadline(time.Now().Add(timeout))
		if _, err := fmt.Fprintf(c, "%d\n", seq); err != nil {
			fmt.Printf("fail %d: %v\n", seq, err)
			return errTrafficFailed{}
		}
		line, err := r.ReadString('\n')
		if err != nil {
			fmt.Printf("fail %d: %v\n", seq, err)
			return errTrafficFailed{}
		}
		if want := fmt.Sprintf("%s %d\n", name, seq); line != want {
			fmt.Printf("fail %d: answer %q, want %q\n", seq, line, want)
			return errTrafficFailed{}
		}
		fmt.Printf("ok %s %d\n", name, seq)
	}
	return nil
}
