// SPDX-License-Identifier: Apache-2.0

package health

import (
	"fmt"
	"regexp"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
)

// Cell provides cell.Health for every component, the *Registry that reads
// it, and the agent's *Readiness.
var Cell = cell.Module(
	"health",
	"Health of the agent components",

	cell.Provide(
		NewRegistry,
		(*Registry).Root,
		NewReadiness,
		scriptCmd,
	),
)

// scriptCmd is the `health` shell command: prints every scope, or with a
// pattern waits until a line matches it (for tests).
func scriptCmd(r *Registry) hive.ScriptCmdOut {
	return hive.NewScriptCmd("health", script.Command(
		script.CmdUsage{Summary: "Show the health of every component, or wait for a line matching a pattern", Args: "[pattern]"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) == 0 {
				for _, st := range r.All() {
					fmt.Fprintln(s.LogWriter(), st)
				}
				return nil, nil
			}
			re, err := regexp.Compile(args[0])
			if err != nil {
				return nil, err
			}
			for {
				for _, st := range r.All() {
					if re.MatchString(st.String()) {
						s.Logf("matched: %s\n", st)
						return nil, nil
					}
				}
				if err := s.Context().Err(); err != nil {
					return nil, fmt.Errorf("no health line matched %q", args[0])
				}
				select {
				case <-s.Context().Done():
				case <-afterPoll():
				}
			}
		}))
}
