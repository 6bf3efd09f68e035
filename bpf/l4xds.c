// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * l4xds service datapath: a tcx ingress program that DNATs packets for a
 * VIP:port/protocol to a backend chosen through the service's weighted
 * Maglev table, reverse-NATs the backends' replies, and keeps flows on
 * their backend through conntrack.
 *
 * Per IPv4/IPv6 TCP/UDP packet (ICMP errors: below):
 *   1. a backend's reply (CT_REPLY hit): source restored to the VIP;
 *   2. to a VIP:port/proto we serve: source ranges, then the flow's
 *      backend from conntrack, or a new one (affinity, then Maglev);
 *      no usable backend: TCP RST / ICMP port unreachable, within
 *      the reject limit (l4xds_reject_bucket), else dropped;
 *   3. to a VIP on a port we do not serve: dropped and counted;
 *   4. anything else: passed.
 * Whatever else is addressed to a VIP, or to one removed within its grace
 * period (l4xds_old_vips), is dropped and counted by reason: other IP
 * protocols, IPv6 extension headers, ICMP but errors of translated flows
 * (echo included: the node does not own the VIP, an answer would speak
 * for the node and not for the backends, and answers sent from here
 * would make one more reflector for spoofed sources), truncated headers.
 * Passed to the stack, such a packet would be forwarded to the node's
 * default route, which on an edge node routes the VIP back to the node,
 * until the TTL runs out. Neighbour discovery passes: it is the stack's.
 * The first fragment of a datagram (IPv4, or IPv6 with a Fragment header
 * right after the fixed header) goes through the same steps and leaves its
 * translation in l4xds_frags for the later fragments, which have no ports.
 * ICMP and ICMPv6 errors quoting a packet of a translated flow are
 * translated too, so that PMTU discovery and port unreachable work
 * through the VIP.
 *
 * This file is that path: the entry program and the steps for replies and
 * services. What they call is in lib/, a header per concern: the packet
 * and its parsing (pkt.h, parse.h), the maps and what a packet names in
 * them (maps.h, lookup.h), the flow hash (hash.h), checksums (csum.h), NAT
 * and forwarding (nat.h), conntrack (conntrack.h), fragments (frag.h),
 * refusals (reject.h) and ICMP errors (icmp.h).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "l4xds.h"
#include "lib/pkt.h"
#include "lib/maps.h"
#include "lib/lookup.h"
#include "lib/parse.h"
#include "lib/hash.h"
#include "lib/csum.h"
#include "lib/nat.h"
#include "lib/conntrack.h"
#include "lib/frag.h"
#include "lib/reject.h"
#include "lib/icmp.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* A backend's answer to a flow not established yet (its reply entry in
 * l4xds_ct_new, h). UDP: the answer establishes the flow. TCP: a SYN-ACK
 * is remembered in the forward entry, whose client's ACK of it establishes
 * the flow; anything else but a RST means the backend's side is
 * established. A backend answering a spoofed SYN sends SYN-ACKs only, to a
 * client that never acknowledges them. -1: the entry is stale
 * (half_open_stale), the answer not the flow's. */
static __always_inline int reply_new(const struct pkt *p,
				     const struct lb_ct_key *rk,
				     struct lb_ct_entry *h, __u64 now)
{
	struct lb_ct_key fk = {};
	struct lb_ct_entry ce;
	struct lb_ct_entry *f;

	f = half_open_forward(&fk, rk, h);
	if (half_open_stale(f, h))
		return -1;
	if (p->proto == IPPROTO_TCP && (p->tcp_flags & TCP_SYN)) {
		if (f && (f->flags & (CT_F_NEW | CT_F_SYNACK)) == CT_F_NEW) {
			f->synack_ack = bpf_htonl(bpf_ntohl(p->seq) + 1);
			f->flags |= CT_F_SYNACK;
		}
		return 0;
	}
	if (p->proto == IPPROTO_TCP && (p->tcp_flags & TCP_RST))
		return 0;
	__builtin_memcpy(&ce, h, sizeof(ce));
	ce.flags |= tcp_closing(p) ? CT_F_CLOSING : 0;
	ct_promote(&fk, rk, &ce, now);
	return 0;
}

/* A backend's reply: restore the VIP as source. The entries of a flow are
 * refreshed (and marked closing) from either direction, at most once a
 * second. An expired entry is no entry: the LRU map has not reclaimed it
 * yet. */
__noinline int handle_reply(struct __sk_buff *skb, const struct pkt *p)
{
	struct lb_ct_key key = { .dir = CT_REPLY };
	struct lb_ct_entry *e;
	__u32 vip[4];
	__be16 vip_port;
	__u32 svc_id;
	__u64 now;
	int closing;

	if (!p)
		return TCX_DROP;
	ct_key_of(&key, p);
	now = bpf_ktime_get_ns();
	e = ct_lookup(&l4xds_ct, &key, now);
	if (!e) {
		e = ct_lookup(&l4xds_ct_new, &key, now);
		if (!e)
			return VERDICT_CONTINUE;
		__builtin_memcpy(vip, e->vip, 16);
		vip_port = e->vip_port;
		svc_id = e->svc_id;
		if (is_v4mapped(vip) == p->v6)
			return TCX_NEXT;
		if (reply_new(p, &key, e, now) < 0)
			return VERDICT_CONTINUE;
		goto rewrite;
	}

	__builtin_memcpy(vip, e->vip, 16);
	vip_port = e->vip_port;
	svc_id = e->svc_id;
	if (is_v4mapped(vip) == p->v6)
		return TCX_NEXT;

	closing = tcp_closing(p) && !(e->flags & CT_F_CLOSING);
	if (closing || now - e->last_seen >= NSEC_PER_SEC) {
		struct lb_ct_key fk = {
			.sport = p->dport,
			.dport = vip_port,
			.proto = p->proto,
			.dir = CT_FORWARD,
		};
		struct lb_ct_entry *f;

		e->last_seen = now;
		if (closing)
			e->flags |= CT_F_CLOSING;
		__builtin_memcpy(fk.saddr, p->daddr, 16);
		__builtin_memcpy(fk.daddr, vip, 16);
		f = bpf_map_lookup_elem(&l4xds_ct, &fk);
		if (f) {
			f->last_seen = now;
			if (closing)
				f->flags |= CT_F_CLOSING;
		}
	}

rewrite:
	if (nat_rewrite(skb, p, 0, p->saddr, vip, p->sport, vip_port) < 0)
		return TCX_DROP;
	if (p->frag)
		frag_remember(p, CT_REPLY, vip, svc_id);
	count_packet(svc_id, skb->len);
	return fib_forward(skb, p, vip, p->daddr, vip_port, p->dport);
}

/* A packet for a VIP:port/proto: the service's backend for the flow.
 * VERDICT_CONTINUE for a packet to no VIP:port/proto, and for a backend's
 * reply, which handle_reply takes. */
__noinline int handle_service(struct __sk_buff *skb, const struct pkt *p)
{
	struct lb_svc *svc;
	__u32 svc_id, svc_flags, svc_count, affinity_timeout, svc_backend;
	__u32 backend_id = 0;
	__u32 baddr[4];
	__be16 bport;
	struct lb_ct_key fk = { .dir = CT_FORWARD };
	struct lb_ct_key rk = { .dir = CT_REPLY };
	struct lb_ct_entry ce = {};
	struct lb_ct_entry *e, *h;
	struct lb_backend *be;
	__u64 now;
	int closing;

	if (!p)
		return TCX_DROP;
	svc = service_of(p);
	if (!svc)
		return VERDICT_CONTINUE;
	svc_id = svc->id;
	svc_flags = svc->flags;
	svc_count = svc->count;
	affinity_timeout = svc->affinity_timeout;
	svc_backend = svc->backend_id;

	now = bpf_ktime_get_ns();
	ct_key_of(&fk, p);
	e = bpf_map_lookup_elem(&l4xds_ct, &fk);
	be = ct_backend(p, e, svc_id, now);
	/* The service and the forward entry are looked up before the reply
	 * entry, so that an established forward packet makes no lookup that
	 * misses. Any other packet may still be a backend's reply (to a
	 * client on a VIP:port), which wins: handle_reply takes it. */
	if (!be || !e) {
		ct_key_of(&rk, p);
		if (ct_lookup(&l4xds_ct, &rk, now) ||
		    ct_lookup(&l4xds_ct_new, &rk, now))
			return VERDICT_CONTINUE;
	}

	if (!source_allowed(svc_id, svc_flags, p->v6, p->saddr)) {
		count_drop(svc_id, LB_DROP_SOURCE_RANGE);
		return TCX_DROP;
	}

	if (be && e) {
		closing = tcp_closing(p) && !(e->flags & CT_F_CLOSING);
		backend_id = e->backend_id;
		__builtin_memcpy(baddr, be->addr, 16);
		bport = be->port;
		/* Refreshing the reply entry with the forward one keeps it
		 * alive in the LRU (and restores it if it was evicted). */
		if (closing || (e->flags & CT_F_REPLY_LOST) ||
		    now - e->last_seen >= NSEC_PER_SEC) {
			e->last_seen = now;
			e->flags = (e->flags | (closing ? CT_F_CLOSING : 0)) &
				   ~CT_F_REPLY_LOST;
			ce.flags = e->flags;
			reply_key(&rk, p, baddr, bport);
			goto store_reply;
		}
		goto rewrite;
	}

	/* A flow not established yet: its backend, until the client's ACK
	 * of the backend's SYN-ACK establishes it. */
	h = bpf_map_lookup_elem(&l4xds_ct_new, &fk);
	be = ct_backend(p, h, svc_id, now);
	if (be && h) {
		backend_id = h->backend_id;
		__builtin_memcpy(baddr, be->addr, 16);
		bport = be->port;
		reply_key(&rk, p, baddr, bport);
		if ((h->flags & CT_F_SYNACK) && h->synack_ack == p->ack_seq &&
		    (p->tcp_flags & (TCP_SYN | TCP_RST | TCP_ACK)) == TCP_ACK) {
			__builtin_memcpy(&ce, h, sizeof(ce));
			ce.flags |= tcp_closing(p) ? CT_F_CLOSING : 0;
			ct_promote(&fk, &rk, &ce, now);
			goto rewrite;
		}
		closing = tcp_closing(p) && !(h->flags & CT_F_CLOSING);
		if (!closing && now - h->last_seen < NSEC_PER_SEC &&
		    reply_is_ours(&rk, p))
			goto rewrite;
		/* Refreshed with both entries: the LRU may have evicted one
		 * apart, or another flow taken the reply entry. */
		__builtin_memcpy(&ce, h, sizeof(ce));
		ce.last_seen = now;
		ce.flags |= closing ? CT_F_CLOSING : 0;
		ct_new_store(&fk, &rk, &ce);
		goto rewrite;
	}

	if (!svc_count)
		return refuse(p, svc_id, now);

	be = NULL;
	if (svc_flags & LB_SVC_F_AFFINITY)
		be = affinity_backend(p, svc_id, affinity_timeout, now,
				      &backend_id);
	if (!be && svc_backend) {
		/* One backend: what every slot of a table would name. */
		backend_id = svc_backend;
	} else if (!be) {
		__u32 size = maglev_size;
		__u32 slot;
		void *table;
		__u32 *id;

		table = bpf_map_lookup_elem(&l4xds_maglev, &svc_id);
		if (!table || !size)
			goto no_backend;
		slot = flow_hash(p) % size;
		id = bpf_map_lookup_elem(table, &slot);
		if (!id)
			goto no_backend;
		backend_id = *id;
		/* Backend 0 is never a backend: its slots are the service's
		 * share of new flows to refuse (reject_weight). */
		if (!backend_id)
			return refuse(p, svc_id, now);
	}
	if (!be) {
		be = bpf_map_lookup_elem(&l4xds_backends, &backend_id);
		if (!be || be->svc_id != svc_id)
			goto no_backend;
		if (is_v4mapped(be->addr) == p->v6) {
			count_drop(svc_id, LB_DROP_BACKEND_FAMILY);
			return TCX_DROP;
		}
	}
	__builtin_memcpy(baddr, be->addr, 16);
	bport = be->port;

	/* A new flow: in l4xds_ct_new until established. */
	ce.flags = CT_F_NEW | (tcp_closing(p) ? CT_F_CLOSING : 0) |
		   ((svc_flags & LB_SVC_F_AFFINITY) ? CT_F_AFFINITY : 0);
	ce.last_seen = now;
	ce.backend_id = backend_id;
	ce.svc_id = svc_id;
	__builtin_memcpy(ce.vip, p->daddr, 16);
	ce.vip_port = p->dport;
	reply_key(&rk, p, baddr, bport);
	/* The established entries these ports may still have (a closed
	 * connection, a backend gone) would take the new flow's packets. */
	if (e)
		bpf_map_delete_elem(&l4xds_ct, &fk);
	ct_new_store(&fk, &rk, &ce);
	goto rewrite;

store_reply:
	reply_claim(&rk, p->daddr, p->dport);
	ce.last_seen = now;
	ce.backend_id = backend_id;
	ce.svc_id = svc_id;
	__builtin_memcpy(ce.vip, p->daddr, 16);
	ce.vip_port = p->dport;
	bpf_map_update_elem(&l4xds_ct, &rk, &ce, BPF_ANY);

rewrite:
	if (nat_rewrite(skb, p, 1, p->daddr, baddr, p->dport, bport) < 0)
		return TCX_DROP;
	if (p->frag)
		frag_remember(p, CT_FORWARD, baddr, svc_id);
	count_packet(svc_id, skb->len);
	return fib_forward(skb, p, p->saddr, baddr, p->sport, bport);

no_backend:
	count_drop(svc_id, LB_DROP_NO_BACKEND);
	return TCX_DROP;
}

SEC("tcx/ingress")
int l4xds_ingress(struct __sk_buff *skb)
{
	struct pkt p = {};
	int ret;

	switch (parse(skb, &p)) {
	case PARSE_OK:
		break;
	case PARSE_FRAGMENT:
		return handle_fragment(skb, &p);
	case PARSE_ICMP:
		ret = handle_icmp_error(skb, &p);
		if (ret != VERDICT_CONTINUE)
			return ret;
		return drop_if_vip(&p, LB_DROP_ICMP);
	case PARSE_MALFORMED:
		return drop_if_vip(&p, LB_DROP_MALFORMED);
	case PARSE_UNTRANSLATED:
		return drop_if_vip(&p, p.untranslated);
	default:
		return TCX_NEXT;
	}

	ret = handle_service(skb, &p);
	if (ret == VERDICT_REJECT)
		return reject(skb, &p);
	if (ret != VERDICT_CONTINUE)
		return ret;

	ret = handle_reply(skb, &p);
	if (ret != VERDICT_CONTINUE)
		return ret;

	if (bpf_map_lookup_elem(&l4xds_vips, p.daddr)) {
		count_drop(0, LB_DROP_UNKNOWN_PORT);
		return TCX_DROP;
	}
	if (vip_removed(p.daddr)) {
		count_drop(0, LB_DROP_REMOVED_VIP);
		return TCX_DROP;
	}
	return TCX_NEXT;
}
