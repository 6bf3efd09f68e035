// SPDX-License-Identifier: Apache-2.0

package api

import "github.com/cilium/hive/cell"

// Cell serves the local API on --api-socket.
var Cell = cell.Module(
	"api",
	"Local API on a unix socket for statedb and shell and health and config",

	cell.Config(Config{APISocket: DefaultSocket}),
	cell.Invoke(register),
)
