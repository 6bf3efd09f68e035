// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Address and port translation, and forwarding a translated packet
 * straight to its next hop. */
#ifndef L4XDS_LIB_NAT_H
#define L4XDS_LIB_NAT_H

/* Stores the source or destination address of the IP header at ip_off:
 * all 16 bytes for IPv6, the last 4 (IPv4-mapped) for IPv4. */
static __always_inline int store_addr(struct __sk_buff *skb, __u32 ip_off,
				      int v6, int dst, const __u32 *addr)
{
	if (v6)
		return bpf_skb_store_bytes(skb, ip_off + (dst ? offsetof(struct ipv6hdr, daddr)
							      : offsetof(struct ipv6hdr, saddr)),
					   addr, 16, 0);
	return bpf_skb_store_bytes(skb, ip_off + (dst ? offsetof(struct iphdr, daddr)
						      : offsetof(struct iphdr, saddr)),
				   &addr[3], 4, 0);
}

/* Rewrites one address of the packet's IP header, and the IPv4 header
 * checksum that covers it. On its own this is the whole translation of a
 * later fragment, which has no L4 header. Written in place: the header
 * checksum is updated here (RFC 1624) rather than by a helper, and its sum
 * stays the same, so skb->csum holds as it did. */
static __always_inline int addr_rewrite(struct __sk_buff *skb,
					const struct pkt *p, int dst,
					const __u32 *old_addr,
					const __u32 *new_addr)
{
	if (p->v6) {
		struct ipv6hdr *ip6 = skb_header(skb, ETH_HLEN, sizeof(*ip6));

		if (!ip6)
			return -1;
		__builtin_memcpy(dst ? (void *)&ip6->daddr : (void *)&ip6->saddr,
				 new_addr, 16);
	} else {
		struct iphdr *ip = skb_header(skb, ETH_HLEN, sizeof(*ip));

		if (!ip)
			return -1;
		ip->check = csum_update(ip->check,
					csum_add(~old_addr[3], new_addr[3]));
		if (dst)
			ip->daddr = new_addr[3];
		else
			ip->saddr = new_addr[3];
	}
	return 0;
}

/* Rewrites one end of the flow (the destination for DNAT, the source for
 * reverse NAT) and fixes the checksums incrementally. With
 * BPF_F_MARK_MANGLED_0 a zero UDP checksum (none, IPv4) stays zero and a
 * result of zero is written as 0xffff. A GSO packet (BIG TCP among them) is
 * CHECKSUM_PARTIAL when it comes from a local socket, a guest or a veth
 * peer: its field holds the pseudo-header's sum, for the device to finish
 * over the segments. The helper then updates it for the addresses
 * (BPF_F_PSEUDO_HDR) and leaves it for the ports, which the device sums
 * with the data; the length in that sum does not change here, so a length
 * field of 0 needs nothing more. */
static __always_inline int nat_rewrite(struct __sk_buff *skb,
				       const struct pkt *p, int dst,
				       const __u32 *old_addr,
				       const __u32 *new_addr, __be16 old_port,
				       __be16 new_port)
{
	__u32 csum_off = l4_csum_off(p);
	__u64 mm = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;

	if (p->v6) {
		if (bpf_l4_csum_replace(skb, csum_off, 0,
					csum_diff_addr(old_addr, new_addr),
					BPF_F_PSEUDO_HDR | mm) < 0)
			return -1;
	} else if (bpf_l4_csum_replace(skb, csum_off, old_addr[3], new_addr[3],
				       BPF_F_PSEUDO_HDR | mm | 4) < 0) {
		return -1;
	}
	if (addr_rewrite(skb, p, dst, old_addr, new_addr) < 0)
		return -1;

	if (old_port != new_port) {
		__be16 *port;

		if (bpf_l4_csum_replace(skb, csum_off, old_port, new_port,
					mm | 2) < 0)
			return -1;
		/* The port is stored in place; l3_len is at most 60 (IPv4
		 * options), a bound the verifier needs told. */
		if (p->l3_len > 60)
			return -1;
		port = skb_header(skb, ETH_HLEN + p->l3_len + (dst ? 2 : 0), 2);
		if (!port)
			return -1;
		*port = new_port;
	}
	return 0;
}

#define AF_INET 2
#define AF_INET6 10

/* A translated packet (to a backend, or back to a client) goes straight
 * to its next hop: a FIB lookup of its new addresses, then out of the
 * egress device through the kernel's neighbour table (which resolves a
 * next hop it does not know yet), skipping the stack's forwarding path
 * and netfilter. The TTL or hop limit goes down by one, as a router's
 * does. Whatever the lookup does not answer with a usable route (local,
 * unreachable, forwarding disabled, the packet too big for the egress
 * device), a TTL about to expire, and fragments are left to the stack,
 * which routes them, sends the ICMP error or fragments as before. */
static __always_inline int fib_forward(struct __sk_buff *skb,
				       const struct pkt *p, const __u32 *saddr,
				       const __u32 *daddr, __be16 sport,
				       __be16 dport)
{
	struct bpf_fib_lookup fib = {
		.l4_protocol = p->proto,
		.sport = sport,
		.dport = dport,
		.ifindex = skb->ifindex,
	};
	struct bpf_redir_neigh nh = {};
	long rc;

	if (!fib_redirect || p->frag || p->ttl <= 1)
		return TCX_NEXT;
	if (p->v6) {
		fib.family = AF_INET6;
		__builtin_memcpy(fib.ipv6_src, saddr, 16);
		__builtin_memcpy(fib.ipv6_dst, daddr, 16);
	} else {
		fib.family = AF_INET;
		fib.ipv4_src = saddr[3];
		fib.ipv4_dst = daddr[3];
	}
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return TCX_NEXT;

	if (p->v6) {
		struct ipv6hdr *ip6 = skb_header(skb, ETH_HLEN, sizeof(*ip6));

		if (!ip6)
			return TCX_DROP;
		ip6->hop_limit = p->ttl - 1;
		nh.nh_family = AF_INET6;
		__builtin_memcpy(nh.ipv6_nh, fib.ipv6_dst, 16);
	} else {
		struct iphdr *ip = skb_header(skb, ETH_HLEN, sizeof(*ip));
		/* TTL and protocol share a 16-bit word of the checksum. */
		__be16 old = bpf_htons((__u16)p->ttl << 8 | p->proto);
		__be16 new = bpf_htons((__u16)(p->ttl - 1) << 8 | p->proto);

		if (!ip)
			return TCX_DROP;
		ip->check = csum_update(ip->check,
					csum_add((__u16)~old, new));
		ip->ttl = p->ttl - 1;
		nh.nh_family = AF_INET;
		nh.ipv4_nh = fib.ipv4_dst;
	}
	return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
}

#endif /* L4XDS_LIB_NAT_H */
