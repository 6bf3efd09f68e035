// SPDX-License-Identifier: Apache-2.0

// Package loadbalancer owns the load-balancing state of the node: the
// domain types (services, frontends, backends), the StateDB tables that hold
// them, and the Writer, the only way to change those tables.
//
// The tables are the contract between the control plane side (xDS
// translation writes them) and the datapath side (a reconciler reads the
// frontends table and reports each row's status back into it).
package loadbalancer
