// SPDX-License-Identifier: Apache-2.0

// Package soak is the soak test (TestPrivilegedSoak): the real control
// plane and agent with the BPF datapath in a namespace topology, clients
// keeping TCP and UDP flows through several VIPs while the resources
// change several times a second and the control plane and the agent are
// restarted at random moments. `make test` runs it for two minutes as
// root, `make soak SOAK_DURATION=1h` for as long as asked.
package soak
