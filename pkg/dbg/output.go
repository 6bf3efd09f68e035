// SPDX-License-Identifier: Apache-2.0

package dbg

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// outputFlag adds -o table|json to cmd: tables for people, JSON for scripts.
func outputFlag(cmd *cobra.Command) *string {
	return cmd.Flags().StringP("output", "o", "table", "Output format: table or json")
}

func checkOutput(o string) error {
	if o != "table" && o != "json" {
		return fmt.Errorf("-o %s: want table or json", o)
	}
	return nil
}

// showOutput adds -o to cmd and makes it print what read returns: as a
// table with print, or as JSON.
func showOutput[V any](cmd *cobra.Command, read func(cmd *cobra.Command) (V, error), print func(io.Writer, V) error) {
	output := outputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := checkOutput(*output); err != nil {
			return err
		}
		v, err := read(cmd)
		if err != nil {
			return err
		}
		if *output == "json" {
			return writeJSON(cmd.OutOrStdout(), v)
		}
		return print(cmd.OutOrStdout(), v)
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table aligns cells in columns, as `l4xds-dbg statedb` prints tables. A
// row's last cell is not aligned and does not widen its column, so that a
// row may end with a long note (a problem, the counters) under the
// backends without pushing the columns of the other rows apart. Unlike
// text/tabwriter, columns are aligned across all rows, not per run of rows.
type table struct {
	out  io.Writer
	rows [][]string
}

func newTable(out io.Writer) *table { return &table{out: out} }

// row adds one line of cells.
func (t *table) row(cells ...string) { t.rows = append(t.rows, cells) }

// flush writes the rows added so far, without trailing blanks.
func (t *table) flush() error {
	var widths []int
	for _, r := range t.rows {
		for i, c := range r[:max(len(r)-1, 0)] {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len(c))
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		var line strings.Builder
		for i, c := range r {
			line.WriteString(c)
			if i < len(r)-1 {
				line.WriteString(strings.Repeat(" ", widths[i]-len(c)+columnGap))
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
	t.rows = nil
	_, err := io.WriteString(t.out, b.String())
	return err
}

// columnGap separates columns, as statedb's tables do.
const columnGap = 3

// age is d rounded for a person: 42s, 5m3s, 2h4m, 3d4h.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%ds", d/time.Minute, d%time.Minute/time.Second)
	case d < 24*time.Hour:
		d = d.Round(time.Minute)
		return fmt.Sprintf("%dh%dm", d/time.Hour, d%time.Hour/time.Minute)
	}
	d = d.Round(time.Hour)
	return fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
}

// plural is "1 service", "2 services".
func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}
