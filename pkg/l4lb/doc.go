// SPDX-License-Identifier: Apache-2.0

// Package l4lb owns the io.cilium.l4lb metadata schema: it decides which xDS
// clusters are L4 load balancers, validates and translates them and their
// ClusterLoadAssignments into services, frontends and backends, and its cell
// joins the xDS client to the load-balancing tables' Writer.
//
// A cluster is ours when metadata.filter_metadata carries the
// "io.cilium.l4lb" key; any other cluster is ignored, never rejected, because
// the same management server may also feed Envoy. The keys of the struct are:
//
//	vip                       string   IPv4 or IPv6 address of the frontend
//	port                      number   frontend port, 1..65535
//	protocol                  string   TCP or UDP, case-insensitive, default TCP
//	frontends                 list     of {vip, port, protocol, target_port}
//	source_ranges             list     of CIDR strings allowed to use the service
//	session_affinity_timeout  string   Go duration ("3h", "10800s"), enables client-IP affinity
//
// A cluster gives either vip and port (and optionally protocol) for a single
// frontend, or frontends for several (TCP and UDP on one VIP, dual-stack),
// never both: mixing them would leave it unclear which one wins. A frontend's
// target_port replaces the port of every backend for that frontend.
//
// Unknown keys are errors, so that a typo never silently does nothing. Every
// error names the resource and the field:
//
//	cluster "db": io.cilium.l4lb.port: 70000 is out of range 1..65535
//
// Backends come from the ClusterLoadAssignment named by
// eds_cluster_config.service_name (or the cluster name) of an EDS cluster, or
// from the inline load_assignment of a STATIC cluster. Other cluster types
// are rejected.
package l4lb
