// SPDX-License-Identifier: Apache-2.0

package option

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/cilium/hive"
	"github.com/spf13/cobra"

	"github.com/l4xds/l4xds/pkg/logging"
)

// AgentCommand returns the agent's root command: it registers the hive's
// flags plus --config-dir, --config-file, --debug and --log-format, merges the config
// sources under the flags and runs the hive until a signal.
func AgentCommand(use, short string, h *hive.Hive) *cobra.Command {
	var configDir, configFile, logFormat string
	var debug bool
	cmd := &cobra.Command{
		Use:           use,
		Short:         short,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			log, err := logging.New(os.Stderr, logFormat, level)
			if err != nil {
				return err
			}
			slog.SetDefault(log)
			settings, err := Load(cmd.Flags(), configDir, configFile)
			if err != nil {
				return err
			}
			if err := h.Viper().MergeConfigMap(settings); err != nil {
				return fmt.Errorf("config: %w", err)
			}
			return h.Run(log)
		},
	}
	h.RegisterFlags(cmd.Flags())
	cmd.Flags().StringVar(&configDir, "config-dir", "", "Directory with one file per setting, named after the flag (a mounted ConfigMap)")
	cmd.Flags().StringVar(&configFile, "config-file", "", "YAML file of settings keyed by flag name; accepts the CFP's xds-control-plane block")
	cmd.Flags().BoolVar(&debug, "debug", false, "Log at debug level")
	cmd.Flags().StringVar(&logFormat, "log-format", logging.Text, logging.FlagUsage)
	cmd.AddCommand(&cobra.Command{
		Use:   "hive",
		Short: "Print the agent's components and their dependencies",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return h.PrintObjects(cmd.OutOrStdout(), slog.Default())
		},
	})
	return cmd
}
