// SPDX-License-Identifier: Apache-2.0

// Package chaos drives one real agent against two or three real control
// planes, listed in order of priority in its --xds-server-address (gRFC
// A71), through randomized schedules of faults: a control plane started,
// SIGKILLed, restarted on its address, hung (SIGSTOP, later SIGCONT), or
// made to serve a different state. Throughout, the agent's tables and
// status are checked against what the servers serve: after each burst of
// faults the agent converges on the state of the highest server that is up
// and not hung (or keeps its last state when none is); it never lacks a
// service that every server it may be using still serves; and it says
// connected to a server only while that server runs.
//
// The schedule comes from a seed (CHAOS seed=N in the output; CHAOS_SEED=N
// replays it), for CHAOS_DURATION (a minute in `make test`, ten in `make
// chaos`). TestChaosFaultSchedules runs the agent with --datapath none, so
// it needs no root; as root it runs in namespaces of its own (netns.Main).
// TestPrivilegedChaosWithTraffic (root) runs the same schedules with the
// BPF datapath on a namespace topology and live traffic through the
// services every state serves alike, none of whose flows may fail.
//
// TestChaosKubernetesSchedules runs two control planes in Kubernetes mode
// (leader election) against a real kube-apiserver and etcd, which its
// schedules pause and restart, restarting control planes meanwhile; the
// states are Services and EndpointSlices. It needs the binaries the kind
// harness builds and skips without them (fails under L4XDS_KIND_REQUIRED=1).
package chaos
