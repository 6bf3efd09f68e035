// SPDX-License-Identifier: Apache-2.0

// cilium-dbg is Cilium's CLI, built from the same Cilium version as the agent.
package main

import "github.com/cilium/cilium/cilium-dbg/cmd"

func main() { cmd.Execute() }
