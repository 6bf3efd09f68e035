// SPDX-License-Identifier: Apache-2.0

package loadbalancer

import (
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
)

// Cell provides the services, frontends and backends tables (read-only) and
// the *Writer that changes them. It needs a *statedb.DB.
//
// statedb.RWTable[*Frontend] is provided too, for the datapath reconciler
// alone: it writes the Status of the rows. Everything else goes through the
// Writer.
var Cell = cell.Module(
	"loadbalancer",
	"Load-balancing tables and their writer",

	cell.Provide(
		NewWriter,
		(*Writer).Services,
		(*Writer).Frontends,
		(*Writer).Backends,
		func(w *Writer) statedb.RWTable[*Frontend] { return w.frontends },
	),
)
