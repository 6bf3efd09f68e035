// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/cilium/hive"
	"github.com/cilium/hive/script"
)

func scriptCommands(c *Client) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		"xds/status": statusCmd(c),
	})
}

// statusCmd prints the connection and each watched type, and with several
// servers each server, without the columns that change with time
// (Attempts, Failures, Since), so scripts can compare.
func statusCmd(c *Client) script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: "Show the xDS client's connection and watched types"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			var b strings.Builder
			if c.disabled {
				b.WriteString("xDS control plane disabled\n")
				return func(*script.State) (string, string, error) { return b.String(), "", nil }, nil
			}
			w := tabwriter.NewWriter(&b, 5, 0, 3, ' ', 0)
			fmt.Fprintln(w, "Type\tServer\tProtocol\tState\tVersion\tSynced\tError")
			for st := range c.status.All(c.db.ReadTxn()) {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%t\t%s\n",
					ShortTypeName(st.TypeURL), st.Server, st.Protocol, st.State, st.Version, st.Synced, st.Error)
			}
			w.Flush()
			if len(c.servers) > 1 {
				// The servers of the list (gRFC A71), without their counts.
				b.WriteString("\n")
				w = tabwriter.NewWriter(&b, 5, 0, 3, ' ', 0)
				fmt.Fprintln(w, "Priority\tServer\tInUse\tState\tError")
				for s := range c.serverRows.All(c.db.ReadTxn()) {
					fmt.Fprintf(w, "%d\t%s\t%t\t%s\t%s\n", s.Priority, s.Address, s.InUse, s.State, s.Error)
				}
				w.Flush()
			}
			return func(*script.State) (string, string, error) { return b.String(), "", nil }, nil
		},
	)
}
