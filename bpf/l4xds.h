/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The contract between the datapath programs and the agent: map layouts,
 * flags, states and drop reasons. pkg/datapath/bpf mirrors every struct
 * here through bpf2go (-type); change both together.
 *
 * Addresses are 16 bytes in network order; an IPv4 address is stored
 * IPv4-mapped (::ffff:a.b.c.d), so that one key layout serves both families
 * (but for source ranges: lb_src_range_key). Ports are in network order.
 */
#ifndef L4XDS_H
#define L4XDS_H

#include <linux/types.h>

/* Sizes of the maps. The Maglev inner table size is a load-time constant
 * (--lb-maglev-table-size), see maglev_size in l4xds.c. The loader sizes
 * the services, backends, conntrack and affinity maps from its flags; these
 * are the defaults. */
#define LB_SERVICES_MAX 65536
#define LB_BACKENDS_MAX (1 << 20)
#define LB_CT_MAX (1 << 20)
#define LB_CT_NEW_MAX (1 << 18)
#define LB_AFFINITY_MAX (1 << 16)
#define LB_SOURCE_RANGES_MAX 65536
#define LB_FRAGS_MAX 8192
#define LB_OLD_VIPS_MAX 4096

/* tcx verdicts (uapi linux/bpf.h since 6.6; defined here so the programs
 * build against older UAPI headers). */
#define TCX_NEXT -1
#define TCX_PASS 0
#define TCX_DROP 2
#define TCX_REDIRECT 7

/* A frontend: VIP, port and protocol. TCP and UDP on one VIP and port are
 * two services. */
struct lb_svc_key {
	__u32 addr[4];
	__be16 port;
	__u8 proto; /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
};

enum {
	/* Only clients in the service's source ranges (lb_src_range_key) are
	 * served; others are dropped with LB_DROP_SOURCE_RANGE. */
	LB_SVC_F_SOURCE_RANGES = 1 << 0,
	/* Client-IP session affinity for affinity_timeout seconds. */
	LB_SVC_F_AFFINITY = 1 << 1,
};

struct lb_svc {
	__u32 id;               /* key of maglev, stats, source ranges, backend.svc_id */
	__u32 flags;            /* LB_SVC_F_* */
	__u32 count;            /* backends for new flows; 0: reject new flows */
	__u32 affinity_timeout; /* seconds, with LB_SVC_F_AFFINITY */
	/* With count 1: the one backend for new flows, and no Maglev table
	 * (each of its slots would name this backend). 0: the Maglev table. */
	__u32 backend_id;
};

enum {
	LB_BACKEND_ACTIVE = 0,      /* new and existing flows */
	LB_BACKEND_TERMINATING = 1, /* existing flows only (drain) */
	LB_BACKEND_QUARANTINED = 2, /* existing flows only */
	LB_BACKEND_MAINTENANCE = 3, /* existing flows only */
};

/* A backend of one service (key: backend id, unique per service and
 * address). A flow whose backend id is gone, or belongs to another
 * service, is balanced again. */
struct lb_backend {
	__u32 addr[4];
	__be16 port;
	__u8 state; /* LB_BACKEND_* */
	__u8 flags; /* LB_BACKEND_F_* */
	__u32 svc_id;
};

enum {
	/* Active, but not in the service's Maglev table: of a priority
	 * behind the best one that has active backends (failover), or of
	 * weight 0. It keeps its flows; client affinity does not send new
	 * ones to it. (0 in entries of agents before it: they are rewritten.) */
	LB_BACKEND_F_STANDBY = 1 << 0,
};

/* Conntrack is two LRU maps with the same layout. l4xds_ct_new holds the
 * flows not established yet: a TCP flow until the client acknowledges the
 * backend's SYN-ACK (or the backend sends anything but a SYN or a RST), a
 * UDP flow until the backend's first answer. Established, a flow's entries
 * move to l4xds_ct. New flows, spoofed ones included, only ever write
 * l4xds_ct_new: a flood of them cannot evict an established flow's
 * entries, and its own entries live CT_LIFETIME_NEW. */
enum {
	CT_FORWARD = 0, /* client -> VIP: which backend */
	CT_REPLY = 1,   /* backend -> client: which VIP to restore */
};

struct lb_ct_key {
	__u32 saddr[4];
	__u32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 dir; /* CT_FORWARD or CT_REPLY */
	__u8 pad[2];
};

enum {
	CT_F_CLOSING = 1 << 0, /* TCP FIN or RST seen: short lifetime */
	/* CT_FORWARD: another flow from the same client port took this
	 * flow's reply entry (see reply_claim): the next packet writes it
	 * back. */
	CT_F_REPLY_LOST = 1 << 1,
	/* An entry of l4xds_ct_new: lifetime CT_LIFETIME_NEW. */
	CT_F_NEW = 1 << 2,
	/* l4xds_ct_new: the service has client affinity, written once the
	 * flow is established (so that spoofed sources cannot flush it). */
	CT_F_AFFINITY = 1 << 3,
	/* l4xds_ct_new CT_FORWARD: the backend's SYN-ACK passed; the client's
	 * ACK of it (ack_seq == synack_ack) establishes the flow. */
	CT_F_SYNACK = 1 << 4,
};

struct lb_ct_entry {
	__u64 last_seen;  /* bpf_ktime_get_ns() */
	__u32 backend_id; /* the flow's backend (both entries) */
	__u32 svc_id;
	__u32 vip[4];     /* CT_REPLY: the frontend to restore as source */
	__be16 vip_port;
	__u8 flags;       /* CT_F_* */
	__u8 pad;
	__be32 synack_ack; /* CT_F_SYNACK: the backend's initial sequence + 1 */
};

/* Lifetimes of a conntrack entry since its last packet, in seconds. A flow
 * not established lives CT_LIFETIME_NEW (Cilium's ct-timeout-syn), or
 * CT_LIFETIME_TCP_CLOSING once closing. */
#define CT_LIFETIME_TCP 21600
#define CT_LIFETIME_TCP_CLOSING 10
#define CT_LIFETIME_NONTCP 60
#define CT_LIFETIME_NEW 60

/* A fragmented datagram through the load balancer: only its first fragment
 * carries the ports, so the address its flow was translated to is kept
 * here for the later fragments, which have the same addresses, protocol
 * and IP ID. */
struct lb_frag_key {
	__u32 saddr[4];
	__u32 daddr[4];
	__u32 id;   /* IPv6: the 32-bit identification; IPv4: the 16-bit ID, zero-extended (both as loaded) */
	__u8 proto;
	__u8 dir;   /* CT_FORWARD (client -> VIP) or CT_REPLY (backend -> client) */
	__u8 pad[2];
};

struct lb_frag {
	__u32 addr[4]; /* CT_FORWARD: the backend (new destination); CT_REPLY: the VIP (new source) */
	__u32 svc_id;
	__u32 pad;
};

struct lb_affinity_key {
	__u32 client[4];
	__u32 svc_id;
};

struct lb_affinity {
	__u64 last_used; /* bpf_ktime_get_ns() */
	__u32 backend_id;
	__u32 pad;
};

/* LPM trie key: prefixlen counts the 32 bits of svc_id and the 32 of
 * family plus the address prefix (an IPv4 /24 is 32 + 32 + 24). The family
 * comes before the address so that the families stay apart: were IPv4 kept
 * IPv4-mapped among the IPv6 prefixes, ::/0 would admit every IPv4 client.
 * An IPv6 packet from an IPv4-mapped source (::ffff:a.b.c.d) is an IPv6
 * client: only IPv6 ranges apply to it, as the address is the sender's to
 * choose and must not borrow the trust of an IPv4 range. */
struct lb_src_range_key {
	__u32 prefixlen;
	__u32 svc_id;
	__u32 family;  /* LB_FAMILY_IPV4 or LB_FAMILY_IPV6 */
	__u32 addr[4]; /* IPv6: the address; IPv4: the address in addr[0], the rest 0 */
};

enum {
	LB_FAMILY_IPV4 = 4,
	LB_FAMILY_IPV6 = 6,
};

enum {
	LB_DROP_NO_BACKEND = 0,   /* no usable backend, or the reject share: rejected (RST / ICMP) */
	LB_DROP_SOURCE_RANGE = 1, /* client outside the source ranges */
	LB_DROP_UNKNOWN_PORT = 2, /* a VIP, but no service on this port/protocol */
	LB_DROP_FRAGMENT = 3,     /* later IP fragment to a VIP whose first fragment was not seen */
	LB_DROP_MALFORMED = 4,    /* truncated headers to a VIP */
	LB_DROP_BACKEND_FAMILY = 5, /* backend of another IP family than the VIP */
	LB_DROP_PROTOCOL = 6,     /* an IP protocol other than TCP, UDP, ICMP to a VIP */
	LB_DROP_ICMP = 7,         /* ICMP to a VIP but an error of a translated flow (echo, ...) */
	LB_DROP_IPV6_EXTENSION = 8, /* IPv6 extension headers before TCP/UDP (but one leading Fragment header) to a VIP */
	LB_DROP_REMOVED_VIP = 9,  /* to a VIP removed less than --lb-removed-vip-grace ago */
	/* refused as LB_DROP_NO_BACKEND is, but no reject sent: over the
	 * reject limit (--lb-reject-rate, --lb-reject-burst) */
	LB_DROP_REJECT_LIMIT = 10,
	LB_DROP_MAX = 11,
};

/* The reject limit of one CPU (l4xds_reject_bucket, per CPU): a token
 * bucket kept as one time, in the form of GCRA's virtual scheduling. A
 * reject at now is allowed if max(tat, now) + reject_interval_ns - now <=
 * reject_burst_ns, and then moves tat to max(tat, now) + reject_interval_ns.
 * A tat at or before now is a full bucket (0 at first); one more than
 * reject_burst_ns ahead (left in the pinned map by a larger limit) is
 * taken as now + reject_burst_ns, an empty one. */
struct lb_reject_bucket {
	__u64 tat; /* bpf_ktime_get_ns() at which the bucket is full again */
};

/* Per-CPU counters, indexed by service id; index 0 holds what no service
 * can be charged with (LB_DROP_UNKNOWN_PORT, and the drops of packets to a
 * VIP whose ports are not read). */
struct lb_stats {
	__u64 packets; /* both directions, forwarded */
	__u64 bytes;
	__u64 drops[LB_DROP_MAX];
};

#endif /* L4XDS_H */
