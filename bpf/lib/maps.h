// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The maps (their keys and values are in ../l4xds.h, shared with Go) and
 * the constants the loader sets. */
#ifndef L4XDS_LIB_MAPS_H
#define L4XDS_LIB_MAPS_H

/* Size of every Maglev table, set by the loader (--lb-maglev-table-size). */
volatile const __u32 maglev_size = 1021;

/* Translated packets go straight to their next hop (fib_forward); 0 leaves
 * the forwarding to the stack (tests that want the kernel's routing out of
 * the picture). */
volatile const __u8 fib_redirect = 1;

/* The reject limit of each CPU: one reject (TCP RST, ICMP port unreachable)
 * per reject_interval_ns, in bursts of up to reject_burst_ns /
 * reject_interval_ns; reject_burst_ns 0: none at all. The loader gives each
 * CPU its share of --lb-reject-rate and --lb-reject-burst, the node's. The
 * defaults are Linux's ICMP limit (icmp_msgs_per_sec, icmp_msgs_burst). */
volatile const __u64 reject_interval_ns = 1000000;
volatile const __u64 reject_burst_ns = 50 * 1000000;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_SERVICES_MAX);
	__type(key, struct lb_svc_key);
	__type(value, struct lb_svc);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} l4xds_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_BACKENDS_MAX);
	__type(key, __u32);
	__type(value, struct lb_backend);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} l4xds_backends SEC(".maps");

/* Maglev tables: service id -> array of maglev_size backend ids. A new
 * service's table is made and inserted whole; an existing one is rewritten
 * in place, its new backends written before and its old ones deleted after,
 * so every slot a packet reads names a live backend of the service, or 0:
 * the service's share of new flows to refuse (reject_weight). The
 * agent writes the slots through a memory mapping (BPF_F_MMAPABLE), not
 * the update syscall. */
struct lb_maglev_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1021); /* replaced by the loader with maglev_size */
	__type(key, __u32);
	__type(value, __u32);
	__uint(map_flags, BPF_F_MMAPABLE);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, LB_SERVICES_MAX);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct lb_maglev_inner);
} l4xds_maglev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_CT_MAX);
	__type(key, struct lb_ct_key);
	__type(value, struct lb_ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} l4xds_ct SEC(".maps");

/* Flows not established yet (see CT_F_NEW): what new flows, and floods of
 * them, write and churn, apart from l4xds_ct. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_CT_NEW_MAX);
	__type(key, struct lb_ct_key);
	__type(value, struct lb_ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} l4xds_ct_new SEC(".maps");

/* Later fragments of a datagram: the translation of its first fragment.
 * Entries are not removed when the last fragment passes (fragments may
 * come out of order); the LRU recycles them, and the next datagram with
 * the same ID overwrites its entry with its own first fragment. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_FRAGS_MAX);
	__type(key, struct lb_frag_key);
	__type(value, struct lb_frag);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} l4xds_frags SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_AFFINITY_MAX);
	__type(key, struct lb_affinity_key);
	__type(value, struct lb_affinity);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} l4xds_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, LB_SOURCE_RANGES_MAX);
	__type(key, struct lb_src_range_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} l4xds_srcrange SEC(".maps");

/* The VIPs (with any port): a packet to a VIP on a port no service serves
 * is dropped and counted rather than passed to the stack. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_SERVICES_MAX);
	__type(key, __u32[4]);
	__type(value, __u32); /* number of services on the VIP */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} l4xds_vips SEC(".maps");

/* VIPs removed from l4xds_vips, until when (bpf_ktime_get_ns()) their
 * packets are still dropped rather than passed to the stack: a client's
 * retransmissions to a VIP just removed would otherwise be forwarded to
 * the node's default route, which on an edge node routes the VIP back to
 * the node, until the TTL runs out. An LRU: more VIPs removed within the
 * grace period than it holds lose their entries early, oldest first. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_OLD_VIPS_MAX);
	__type(key, __u32[4]);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} l4xds_old_vips SEC(".maps");

/* The reject limit's bucket (struct lb_reject_bucket), one per CPU. Per
 * CPU, so that the CPUs of a flood do not share a written cache line, nor
 * race on it without a lock (a shared bucket updated without one loses
 * updates, and lets through more than its limit when it matters); a lock
 * per refused packet would cost more than the limit saves. Each CPU takes
 * its share of the node's rate: RSS spreads a flood of spoofed sources
 * over the receive queues, and so over the CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_reject_bucket);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} l4xds_reject_bucket SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_SERVICES_MAX);
	__type(key, __u32);
	__type(value, struct lb_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} l4xds_stats SEC(".maps");

#endif /* L4XDS_LIB_MAPS_H */
