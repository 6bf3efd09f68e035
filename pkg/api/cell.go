// SPDX-License-Identifier: Apache-2.0

package api

import "github.com/cilium/hive/cell"

// Cell serves the local API on --api-socket.
var Cell = cell.Module(
	"api",
	"Local API: statedb tables, shell and health on a unix socket",

	cell.Config(Config{APISocket: DefaultSocket}),
	cell.Invoke(register),
)
