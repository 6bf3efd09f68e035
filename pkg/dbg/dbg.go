// SPDX-License-Identifier: Apache-2.0

// Package dbg is l4xds-dbg: it inspects a running agent through its API
// socket, the way cilium-dbg inspects the Cilium agent, and the datapath
// through its pinned BPF maps, which works while the agent is down.
package dbg

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/l4xds/l4xds/pkg/api"
)

// Command returns the root command of l4xds-dbg.
func Command() *cobra.Command {
	socket := api.DefaultSocket
	root := &cobra.Command{
		Use:           "l4xds-dbg",
		Short:         "Inspect a running l4xds agent and its datapath",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&socket, "socket", socket, "API socket of the agent (its --api-socket)")
	client := func() *api.Client { return api.NewClient(socket) }

	var format string
	var watch bool
	statedbCmd := &cobra.Command{
		Use:   "statedb TABLE",
		Short: "Show a table of the agent (services, frontends, backends, xds-resources, xds-status, ...)",
		Example: "  l4xds-dbg statedb frontends\n" +
			"  l4xds-dbg statedb backends -o json\n" +
			"  l4xds-dbg statedb frontends -w",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			line := fmt.Sprintf("db/show --format=%s %s", format, args[0])
			if watch {
				if format != "table" {
					return fmt.Errorf("-w prints changes as table rows; drop -o %s", format)
				}
				line = "db/watch " + args[0]
			}
			return run(client(), line, cmd.OutOrStdout())
		},
	}
	statedbCmd.Flags().StringVarP(&format, "output", "o", "table", "Output format: table, json or yaml")
	statedbCmd.Flags().BoolVarP(&watch, "watch", "w", false, "Print the table's changes as they happen")

	shellCmd := &cobra.Command{
		Use:     "shell -- COMMAND [ARGS...]",
		Short:   "Run a command of the agent's shell",
		Example: "  l4xds-dbg shell -- db/show frontends\n  l4xds-dbg shell -- help",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return run(client(), shellJoin(args), cmd.OutOrStdout())
		},
	}

	root.AddCommand(statedbCmd, shellCmd, statusCommand(client), xdsCommand(client), bpfCommand())
	return root
}

func run(c *api.Client, line string, out io.Writer) error {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	err := c.Shell(ctx, line, out)
	if ctx.Err() != nil {
		return nil // interrupted while watching
	}
	return err
}

// shellJoin quotes the arguments that the shell's parser would split.
func shellJoin(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t'\"#$") {
			a = "'" + strings.ReplaceAll(a, "'", "''") + "'"
		}
		quoted[i] = a
	}
	return strings.Join(quoted, " ")
}
