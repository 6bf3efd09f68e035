// SPDX-License-Identifier: Apache-2.0

// Package bench measures the agent end to end: an in-process go-control-plane
// server (one LinearCache per type, mTLS) serves N l4lb clusters of M
// endpoints each to the agent's cells (xDS client, l4lb translation,
// loadbalancer writer, datapath reconciler), which write real BPF maps as
// root and fake ones otherwise. Its benchmarks print one `BENCH <name>
// key=value ...` line per figure (`make bench`); its tests run the same
// harness on a small shape and check what it reports. BenchmarkFleet is the
// other side: thousands of simulated agents on one control-plane process.
package bench
