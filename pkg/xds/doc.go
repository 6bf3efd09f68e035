// SPDX-License-Identifier: Apache-2.0

// Package xds is a generic xDS client: one Aggregated Discovery Service
// stream (State of the World or Delta) at a time, over gRPC with mutual TLS,
// to the first of an ordered list of management servers that delivers, with
// fallback to the next and return to a higher one after gRFC A71
// (fallback.go).
//
// It owns the transport (TLS files re-read at every connection, reconnect
// with exponential backoff), the protocol state machine (ACK and NACK, nonces,
// subscriptions, does-not-exist timers), a last-known-good cache of every
// accepted resource, and two StateDB tables that show that state to
// operators: xds-resources (one row per resource, the CSDS view) and
// xds-status (one row per watched type).
//
// It knows nothing about what the resources mean. Consumers register a
// Handler per type URL with Client.Watch; the handler receives decoded,
// deduplicated updates and tells the client which resources it rejects.
package xds
