// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * l4xds service datapath: a tcx ingress program that DNATs packets for a
 * VIP:port/protocol to a backend chosen through the service's weighted
 * Maglev table, reverse-NATs the backends' replies, and keeps flows on
 * their backend through conntrack.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/icmpv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "l4xds.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Size of every Maglev table, set by the loader (--lb-maglev-table-size). */
volatile const __u32 maglev_size = 1021;

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

/* Maglev tables: service id -> array of maglev_size backend ids. The agent
 * builds a new inner array and swaps it in, so a packet sees either the old
 * table or the new one. */
struct lb_maglev_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1021); /* replaced by the loader with maglev_size */
	__type(key, __u32);
	__type(value, __u32);
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

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_SERVICES_MAX);
	__type(key, __u32);
	__type(value, struct lb_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} l4xds_stats SEC(".maps");

SEC("tcx/ingress")
int l4xds_ingress(struct __sk_buff *skb)
{
	/* TODO: the datapath. */
	return TCX_NEXT;
}
