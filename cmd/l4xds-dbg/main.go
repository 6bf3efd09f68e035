// SPDX-License-Identifier: Apache-2.0

// l4xds-dbg inspects a running l4xds agent.
package main

import (
	"fmt"
	"os"

	"github.com/l4xds/l4xds/pkg/dbg"
	"github.com/l4xds/l4xds/pkg/version"
)

func main() {
	cmd := dbg.Command()
	version.AddFlag(cmd)
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "l4xds-dbg:", err)
		os.Exit(1)
	}
}
