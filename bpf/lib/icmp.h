// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* ICMP and ICMPv6 errors quoting a packet of a translated flow, translated
 * so that PMTU discovery and port unreachable work through the VIP. */
#ifndef L4XDS_LIB_ICMP_H
#define L4XDS_LIB_ICMP_H

static __always_inline int icmp_is_error(const struct pkt *p, __u8 type)
{
	if (p->v6)
		return type == ICMPV6_DEST_UNREACH || type == ICMPV6_PKT_TOOBIG ||
		       type == ICMPV6_TIME_EXCEED;
	return type == ICMP_DEST_UNREACH || type == ICMP_TIME_EXCEEDED;
}

/* Neighbour discovery, the stack's: a router's unreachability probe to
 * an address the node answers for must reach it. */
static __always_inline int icmp_is_ndisc(const struct pkt *p, __u8 type)
{
	return p->v6 && type >= ICMPV6_NDISC_FIRST && type <= ICMPV6_NDISC_LAST;
}

/* The fields of an ICMP error's quote that translation changes. All sit at
 * even offsets of the ICMP message, so the change of the message's sum is
 * one bpf_csum_diff of their old and new values. */
struct icmp_quote_fields {
	__u32 addr[4];    /* the inner address rewritten (IPv4-mapped) */
	__be16 ports[2];  /* inner source and destination port */
	__sum16 ip_check; /* inner IPv4 header checksum; 0 for IPv6 */
	__sum16 l4_check; /* inner L4 checksum if quoted, else 0 */
};

/* The first 8 bytes of the quoted L4 header (RFC 792 guarantees them):
 * the ports, and for UDP the checksum. */
struct icmp_quote_l4 {
	__be16 ports[2];
	__be16 len;
	__sum16 check;
};

/* An ICMP or ICMPv6 error about a packet of a translated flow, so that
 * PMTU discovery and port unreachable work through the VIP. The error goes
 * to the source of the packet it quotes:
 *  - a backend's (or a router's behind it) error to a client quotes
 *    client -> backend:bport (after DNAT); the client must see VIP:vport
 *    as the destination, and the VIP as the error's source (a router's
 *    internal address would not make it through the client's network);
 *  - a client's error to the VIP quotes VIP:vport -> client (a reply
 *    after reverse NAT); the backend must see its own address and port
 *    as the source, and get the error.
 * The quoted L4 checksum is fixed as well when quoted (always for UDP,
 * for TCP with 18 bytes of header), so the quote is the packet as its
 * sender sent it, although Linux does not check it. Every checksum is
 * updated from the same differences, so the packet's total sum stays the
 * same (skb->csum of CHECKSUM_COMPLETE holds). An error to a backend
 * whose flow's client is outside the service's source ranges is dropped
 * (LB_DROP_SOURCE_RANGE). Anything else (errors of no flow, or of a flow
 * whose service is gone, or about a backend a flow not established yet
 * has left (half_open_stale), echo, ...) is VERDICT_CONTINUE, but
 * neighbour discovery, which passes. */
__noinline int handle_icmp_error(struct __sk_buff *skb, const struct pkt *p)
{
	struct icmp_err_hdr icmp;
	struct icmp_quote_l4 l4h;
	struct icmp_quote_fields old = {}, new = {};
	struct lb_ct_key key = {};
	struct lb_svc_key svc_key = {};
	struct lb_ct_entry *e;
	struct lb_svc *svc;
	__u32 outer_old[4];
	__u32 icmp_off, in_off, in_l3, l4_off, quote, l4_check_off = 0;
	__u32 addr_diff, port_diff, outer_diff;
	__u32 svc_id;
	__be16 new_port;
	__s64 s;
	__u64 now;
	int reply;

	if (!p)
		return TCX_DROP;
	icmp_off = ETH_HLEN + p->l3_len;
	if (p->l4_len < sizeof(icmp) ||
	    bpf_skb_load_bytes(skb, icmp_off, &icmp, sizeof(icmp)) < 0)
		return VERDICT_CONTINUE;
	if (!icmp_is_error(p, icmp.type))
		return icmp_is_ndisc(p, icmp.type) ? TCX_NEXT : VERDICT_CONTINUE;
	in_off = icmp_off + sizeof(icmp);
	if (skb->len < in_off)
		return VERDICT_CONTINUE;
	quote = p->l4_len - sizeof(icmp);
	if (quote > skb->len - in_off)
		quote = skb->len - in_off;

	if (p->v6) {
		struct ipv6hdr ip6;
		__u8 nexthdr;

		if (bpf_skb_load_bytes(skb, in_off, &ip6, sizeof(ip6)) < 0 ||
		    ip6.version != 6)
			return VERDICT_CONTINUE;
		nexthdr = ip6.nexthdr;
		in_l3 = sizeof(ip6);
		/* A first fragment (a datagram too big for the path, which
		 * its sender fragmented) has its ports after the Fragment
		 * header; a later one quotes none. */
		if (nexthdr == IPV6_NEXTHDR_FRAGMENT) {
			struct ipv6_frag_hdr fh;

			if (bpf_skb_load_bytes(skb, in_off + sizeof(ip6), &fh, sizeof(fh)) < 0 ||
			    (fh.frag_off & bpf_htons(IP6_OFFSET)))
				return VERDICT_CONTINUE;
			nexthdr = fh.nexthdr;
			in_l3 += sizeof(fh);
		}
		if (nexthdr != IPPROTO_TCP && nexthdr != IPPROTO_UDP)
			return VERDICT_CONTINUE;
		key.proto = nexthdr;
		__builtin_memcpy(key.saddr, &ip6.daddr, 16);
		__builtin_memcpy(key.daddr, &ip6.saddr, 16);
	} else {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, in_off, &ip, sizeof(ip)) < 0 ||
		    ip.version != 4 || ip.ihl < 5)
			return VERDICT_CONTINUE;
		if (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP)
			return VERDICT_CONTINUE;
		/* A later fragment quotes no ports. */
		if (ip.frag_off & bpf_htons(IP_OFFSET))
			return VERDICT_CONTINUE;
		key.proto = ip.protocol;
		key.saddr[2] = bpf_htonl(0x0000ffff);
		key.saddr[3] = ip.daddr;
		key.daddr[2] = bpf_htonl(0x0000ffff);
		key.daddr[3] = ip.saddr;
		old.ip_check = ip.check;
		in_l3 = ip.ihl * 4;
	}
	if (!addr_eq(p->daddr, key.daddr) || quote < in_l3 + sizeof(l4h))
		return VERDICT_CONTINUE;
	l4_off = in_off + in_l3;
	if (bpf_skb_load_bytes(skb, l4_off, &l4h, sizeof(l4h)) < 0)
		return VERDICT_CONTINUE;
	/* The flow's entry seen from the quoted packet's receiver. */
	key.sport = l4h.ports[1];
	key.dport = l4h.ports[0];
	/* Established flows and new ones alike (an error may answer a SYN). */
	now = bpf_ktime_get_ns();
	key.dir = CT_REPLY;
	e = ct_lookup(&l4xds_ct, &key, now);
	if (!e) {
		struct lb_ct_key fk = {};

		e = ct_lookup(&l4xds_ct_new, &key, now);
		if (e && half_open_stale(half_open_forward(&fk, &key, e), e))
			return VERDICT_CONTINUE;
	}
	if (e) {
		reply = 1;
		svc_id = e->svc_id;
		__builtin_memcpy(old.addr, key.saddr, 16); /* the backend */
		__builtin_memcpy(new.addr, e->vip, 16);
		new_port = e->vip_port;
		__builtin_memcpy(outer_old, p->saddr, 16);
	} else {
		struct lb_backend *be;

		key.dir = CT_FORWARD;
		e = ct_lookup(&l4xds_ct, &key, now);
		if (!e)
			e = ct_lookup(&l4xds_ct_new, &key, now);
		if (!e)
			return VERDICT_CONTINUE;
		svc_id = e->svc_id;
		be = bpf_map_lookup_elem(&l4xds_backends, &e->backend_id);
		if (!be || be->svc_id != svc_id)
			return VERDICT_CONTINUE;
		/* To the backend only what a packet of the flow would reach it
		 * with: its service still there, and its client (not the
		 * error's sender, which may be any router on the client's
		 * path) in the service's source ranges now. The entry alone
		 * does not say so: the ranges may have shrunk since the flow
		 * began, and the flow's own packets are checked each time. */
		svc_key.port = key.dport;
		svc_key.proto = key.proto;
		__builtin_memcpy(svc_key.addr, key.daddr, 16);
		svc = bpf_map_lookup_elem(&l4xds_services, &svc_key);
		if (!svc || svc->id != svc_id)
			return VERDICT_CONTINUE;
		if (!source_allowed(svc_id, svc->flags, p->v6, key.saddr)) {
			count_drop(svc_id, LB_DROP_SOURCE_RANGE);
			return TCX_DROP;
		}
		reply = 0;
		__builtin_memcpy(old.addr, key.daddr, 16); /* the VIP */
		__builtin_memcpy(new.addr, be->addr, 16);
		new_port = be->port;
		__builtin_memcpy(outer_old, p->daddr, 16);
	}
	if (is_v4mapped(new.addr) == p->v6)
		return VERDICT_CONTINUE;

	old.ports[0] = l4h.ports[0];
	old.ports[1] = l4h.ports[1];
	if (key.proto == IPPROTO_UDP) {
		l4_check_off = l4_off + offsetof(struct udphdr, check);
		old.l4_check = l4h.check;
	} else if (quote >= in_l3 + offsetof(struct tcp_hdr, check) + 2) {
		l4_check_off = l4_off + offsetof(struct tcp_hdr, check);
		if (bpf_skb_load_bytes(skb, l4_check_off, &old.l4_check, 2) < 0)
			return VERDICT_CONTINUE;
	}
	new.ports[0] = reply ? old.ports[0] : new_port;
	new.ports[1] = reply ? new_port : old.ports[1];
	addr_diff = csum_diff_addr(old.addr, new.addr);
	s = bpf_csum_diff((__be32 *)old.ports, 4, (__be32 *)new.ports, 4, 0);
	port_diff = s < 0 ? 0 : (__u32)s;
	new.ip_check = p->v6 ? 0 : csum_update(old.ip_check, addr_diff);
	new.l4_check = old.l4_check;
	/* A UDP checksum of zero is none (IPv4), and stays so. */
	if (l4_check_off && (key.proto != IPPROTO_UDP || old.l4_check)) {
		new.l4_check = csum_update(old.l4_check,
					   csum_add(addr_diff, port_diff));
		if (key.proto == IPPROTO_UDP && !new.l4_check)
			new.l4_check = 0xffff;
	}
	/* ICMPv6 covers the outer addresses through its pseudo-header. */
	outer_diff = csum_diff_addr(outer_old, new.addr);
	s = bpf_csum_diff((__be32 *)&old, sizeof(old), (__be32 *)&new,
			  sizeof(new), p->v6 ? outer_diff : 0);
	if (s < 0)
		return VERDICT_CONTINUE;
	icmp.checksum = csum_update(icmp.checksum, (__u32)s);

	/* The outer address on the error's side of the flow, and the quoted
	 * one on the other side. */
	if (addr_rewrite(skb, p, !reply, outer_old, new.addr) < 0 ||
	    store_addr(skb, in_off, p->v6, reply, new.addr) < 0)
		return TCX_DROP;
	if (!p->v6 &&
	    bpf_skb_store_bytes(skb, in_off + offsetof(struct iphdr, check),
				&new.ip_check, 2, 0) < 0)
		return TCX_DROP;
	if (bpf_skb_store_bytes(skb, icmp_off + offsetof(struct icmp_err_hdr, checksum),
				&icmp.checksum, 2, 0) < 0 ||
	    bpf_skb_store_bytes(skb, l4_off, new.ports, 4, 0) < 0)
		return TCX_DROP;
	if (l4_check_off &&
	    bpf_skb_store_bytes(skb, l4_check_off, &new.l4_check, 2, 0) < 0)
		return TCX_DROP;
	count_packet(svc_id, skb->len);
	return TCX_NEXT;
}

#endif /* L4XDS_LIB_ICMP_H */
