// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* What a packet's destination names in the maps: its service, its VIP's
 * service for drops, and the counters charged to them. */
#ifndef L4XDS_LIB_LOOKUP_H
#define L4XDS_LIB_LOOKUP_H

static __always_inline void count_drop(__u32 svc_id, __u64 reason)
{
	struct lb_stats *s = bpf_map_lookup_elem(&l4xds_stats, &svc_id);

	if (s && reason < LB_DROP_MAX)
		s->drops[reason]++;
}

static __always_inline void count_packet(__u32 svc_id, __u32 len)
{
	struct lb_stats *s = bpf_map_lookup_elem(&l4xds_stats, &svc_id);

	if (s) {
		s->packets++;
		s->bytes += len;
	}
}

/* The service of p's destination VIP, port and protocol, if any. */
static __always_inline struct lb_svc *service_of(const struct pkt *p)
{
	struct lb_svc_key key = {
		.port = p->dport,
		.proto = p->proto,
	};

	__builtin_memcpy(key.addr, p->daddr, 16);
	return bpf_map_lookup_elem(&l4xds_services, &key);
}

/* Whether client may use the service: always without source ranges, else
 * when one of the service's ranges of the client's family holds it. */
static __always_inline int source_allowed(__u32 svc_id, __u32 svc_flags,
					  int v6, const __u32 *client)
{
	struct lb_src_range_key key = {
		.prefixlen = 32 + 32 + 128,
		.svc_id = svc_id,
	};

	if (!(svc_flags & LB_SVC_F_SOURCE_RANGES))
		return 1;
	if (v6) {
		key.family = LB_FAMILY_IPV6;
		__builtin_memcpy(key.addr, client, 16);
	} else {
		key.family = LB_FAMILY_IPV4;
		key.addr[0] = client[3];
	}
	return bpf_map_lookup_elem(&l4xds_srcrange, &key) != NULL;
}

/* The service a packet is charged to when its headers cannot be handled:
 * the one on its ports if they are known, else 0 if the destination is a
 * VIP; -1 for a packet that is not for a VIP. */
__noinline int vip_service(const struct pkt *p)
{
	if (!p)
		return -1;
	if (p->has_ports) {
		struct lb_svc *svc = service_of(p);

		if (svc)
			return svc->id & 0x7fffffff;
	}
	return bpf_map_lookup_elem(&l4xds_vips, p->daddr) ? 0 : -1;
}

/* Whether daddr is a VIP removed within its grace period. */
static __always_inline int vip_removed(const __u32 *daddr)
{
	__u64 *until = bpf_map_lookup_elem(&l4xds_old_vips, daddr);

	return until && bpf_ktime_get_ns() < *until;
}

/* A packet that is not translated: dropped when it is for a VIP, or one
 * removed within its grace period (LB_DROP_REMOVED_VIP, whatever the
 * packet), and passed otherwise. */
static __always_inline int drop_if_vip(const struct pkt *p, __u32 reason)
{
	int svc_id = vip_service(p);

	if (svc_id >= 0) {
		count_drop(svc_id, reason);
		return TCX_DROP;
	}
	if (p && vip_removed(p->daddr)) {
		count_drop(0, LB_DROP_REMOVED_VIP);
		return TCX_DROP;
	}
	return TCX_NEXT;
}

#endif /* L4XDS_LIB_LOOKUP_H */
