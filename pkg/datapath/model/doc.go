// SPDX-License-Identifier: Apache-2.0

// Package model is a reference model of the l4xds datapath: what the
// program must do with one packet, given the service table and the state
// of its maps (conntrack, affinity, fragments, removed VIPs, counters).
//
// It is written from the datapath's specification (the design's datapath
// rules and the contract of bpf/l4xds.h), in the vocabulary of the domain:
// a Table of services with their backends, source ranges, affinity and
// Maglev tables, and a State of flows. Where the specification leaves a
// choice to the implementation (the flow hash, the Maglev table), the
// model takes it as an input rather than deriving it. Differential tests
// run the same packets through the program (BPF_PROG_RUN) and through
// Process, and compare the verdict, the frame, the counters and the state.
//
// What a packet meets, in order (Process):
//  1. parsing: a packet the program cannot read as IPv4 or IPv6 is not its
//     business and passes; a packet it reads but does not translate (other
//     protocols, IPv6 extension headers, ICMP but errors of translated
//     flows, truncated headers, an IPv6 Fragment header cut short, later
//     fragments of unknown datagrams) is
//     dropped and counted when it is addressed to a VIP, live or removed
//     within its grace period, and passes otherwise;
//  2. a packet to a VIP:port/protocol: the backend's reply if it is one,
//     else source ranges, then the flow's backend from conntrack, or a new
//     one (affinity, then the Maglev table), or a refusal (TCP RST, ICMP
//     port unreachable, within the reject limit) when no backend takes new
//     flows;
//  3. a backend's reply: its source restored to the VIP; not when it is
//     that of a flow not established yet which has gone to another
//     backend since (a stale entry);
//  4. any other packet to a VIP: dropped and counted.
package model
