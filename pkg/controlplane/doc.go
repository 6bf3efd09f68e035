// SPDX-License-Identifier: Apache-2.0

// Package controlplane is the reference xDS management server of l4xds.
//
// It owns the path from a resource file to the wire: parsing Envoy resources
// written in YAML or JSON (the CFP's `resource: {'@type': ...}` form, bare
// resources, or Envoy's filesystem `resources: [...]` form), holding them in
// caches per type URL (our own for SotW streams, which it serves itself, so
// that a fleet's streams share what they hold; go-control-plane's linear
// caches and server for Delta), and serving them over ADS, SotW and Delta,
// with mTLS. A watched file is re-applied on every edit;
// only the resources that changed are sent to clients, and a bad edit leaves
// the last good state in place.
//
// The agent does not depend on this package: any go-control-plane or
// Envoy-compatible server works. It exists for operators who want a simple
// file-driven server, and for tests and benchmarks.
package controlplane
