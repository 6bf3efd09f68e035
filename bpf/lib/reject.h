// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Refusing a new flow at once: TCP RST, ICMP or ICMPv6 port unreachable. */
#ifndef L4XDS_LIB_REJECT_H
#define L4XDS_LIB_REJECT_H

/* Whether this CPU may send one more reject at now; if so, it is taken
 * from the bucket (see struct lb_reject_bucket). */
static __always_inline int reject_allowed(__u64 now)
{
	struct lb_reject_bucket *b;
	__u32 zero = 0;
	__u64 tat;

	if (!reject_burst_ns)
		return 0;
	b = bpf_map_lookup_elem(&l4xds_reject_bucket, &zero);
	if (!b)
		return 0;
	tat = b->tat > now ? b->tat : now;
	/* Further ahead than this limit takes it: a bucket of a larger
	 * limit (the map is pinned, and an agent restarted with a smaller
	 * one finds it as it was). It is this limit's empty bucket. */
	if (tat - now > reject_burst_ns) {
		tat = now + reject_burst_ns;
		b->tat = tat;
	}
	if (tat + reject_interval_ns - now > reject_burst_ns)
		return 0;
	b->tat = tat + reject_interval_ns;
	return 1;
}

/* A new flow refused (no usable backend, or the service's reject share):
 * VERDICT_REJECT to answer it, counted as LB_DROP_NO_BACKEND. A RST, and a
 * packet from a source that names no single host, are never answered:
 * dropped, counted the same, and they take nothing from the bucket. Over the reject limit the packet is dropped and counted as
 * LB_DROP_REJECT_LIMIT: rejects are answers to whatever source a packet
 * names, so unlimited they would reflect a flood of spoofed sources onto
 * its victims. */
/* Whether the packet's source names no single host: IPv4 0/8, multicast,
 * class E and the limited broadcast (224.0.0.0 and up), IPv6 unspecified
 * or multicast. No refusal goes to such a source (RFC 1122 3.2.2, RFC 4443
 * 2.4 e): it would reach many hosts, or none. */
static __always_inline int source_not_unicast(const struct pkt *p)
{
	if (!p->v6) {
		__u8 first = bpf_ntohl(p->saddr[3]) >> 24;

		return first == 0 || first >= 224;
	}
	if ((bpf_ntohl(p->saddr[0]) >> 24) == 0xff)
		return 1;
	return !(p->saddr[0] | p->saddr[1] | p->saddr[2] | p->saddr[3]);
}

static __always_inline int refuse(const struct pkt *p, __u32 svc_id, __u64 now)
{
	if ((p->proto == IPPROTO_TCP && (p->tcp_flags & TCP_RST)) ||
	    source_not_unicast(p)) {
		count_drop(svc_id, LB_DROP_NO_BACKEND);
		return TCX_DROP;
	}
	if (!reject_allowed(now)) {
		count_drop(svc_id, LB_DROP_REJECT_LIMIT);
		return TCX_DROP;
	}
	count_drop(svc_id, LB_DROP_NO_BACKEND);
	return VERDICT_REJECT;
}

/* The reply leaves through the interface it came in on, back to the
 * sender: swap the MAC addresses. */
static __always_inline int load_swapped_eth(struct __sk_buff *skb,
					    struct ethhdr *eth)
{
	__u8 tmp[ETH_ALEN];

	if (bpf_skb_load_bytes(skb, 0, eth, sizeof(*eth)) < 0)
		return -1;
	__builtin_memcpy(tmp, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, tmp, ETH_ALEN);
	return 0;
}

/* RFC 793 reset: if the segment carries an ACK the reset takes its
 * sequence number from it, otherwise it acknowledges the segment. */
static __always_inline void fill_rst(const struct pkt *p, struct tcp_hdr *th)
{
	th->source = p->dport;
	th->dest = p->sport;
	th->doff = 5 << 4;
	if (p->tcp_flags & TCP_ACK) {
		th->seq = p->ack_seq;
		th->flags = TCP_RST;
	} else {
		__u32 seglen = p->l4_len - p->l4_hlen;

		if (p->tcp_flags & TCP_SYN)
			seglen++;
		if (p->tcp_flags & TCP_FIN)
			seglen++;
		th->ack_seq = bpf_htonl(bpf_ntohl(p->seq) + seglen);
		th->flags = TCP_RST | TCP_ACK;
	}
}

static __always_inline int reject_tcp4(struct __sk_buff *skb, const struct pkt *p)
{
	struct ethhdr eth;
	struct {
		struct iphdr ip;
		struct tcp_hdr tcp;
	} h = {};
	struct {
		__be32 saddr;
		__be32 daddr;
		__u8 zero;
		__u8 proto;
		__be16 len;
	} ph = {};
	__u32 sum;

	if (load_swapped_eth(skb, &eth) < 0)
		return -1;
	h.ip.version = 4;
	h.ip.ihl = 5;
	h.ip.tot_len = bpf_htons(sizeof(h));
	h.ip.frag_off = bpf_htons(IP_DF);
	h.ip.ttl = 64;
	h.ip.protocol = IPPROTO_TCP;
	h.ip.saddr = p->daddr[3];
	h.ip.daddr = p->saddr[3];
	h.ip.check = csum_fold(csum_add_buf(&h.ip, sizeof(h.ip), 0));
	fill_rst(p, &h.tcp);
	ph.saddr = h.ip.saddr;
	ph.daddr = h.ip.daddr;
	ph.proto = IPPROTO_TCP;
	ph.len = bpf_htons(sizeof(h.tcp));
	sum = csum_add_buf(&ph, sizeof(ph), 0);
	h.tcp.check = csum_fold(csum_add_buf(&h.tcp, sizeof(h.tcp), sum));

	if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(h), 0) < 0 ||
	    bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &h, sizeof(h), 0) < 0)
		return -1;
	return 0;
}

/* The IPv6 pseudo-header after the two addresses. */
struct pseudo6_tail {
	__be32 len;
	__u8 zero[3];
	__u8 nexthdr;
};

static __always_inline void fill_ip6(struct ipv6hdr *ip6, const struct pkt *p,
				     __u16 payload_len, __u8 nexthdr)
{
	ip6->version = 6;
	ip6->payload_len = bpf_htons(payload_len);
	ip6->nexthdr = nexthdr;
	ip6->hop_limit = 64;
	__builtin_memcpy(&ip6->saddr, p->daddr, 16);
	__builtin_memcpy(&ip6->daddr, p->saddr, 16);
}

static __always_inline int reject_tcp6(struct __sk_buff *skb, const struct pkt *p)
{
	struct ethhdr eth;
	struct {
		struct ipv6hdr ip6;
		struct tcp_hdr tcp;
	} h = {};
	struct pseudo6_tail pt = {};
	__u32 sum;

	if (load_swapped_eth(skb, &eth) < 0)
		return -1;
	fill_ip6(&h.ip6, p, sizeof(h.tcp), IPPROTO_TCP);
	fill_rst(p, &h.tcp);
	pt.len = bpf_htonl(sizeof(h.tcp));
	pt.nexthdr = IPPROTO_TCP;
	sum = csum_add_buf(&h.ip6.saddr, 32, 0);
	sum = csum_add_buf(&pt, sizeof(pt), sum);
	h.tcp.check = csum_fold(csum_add_buf(&h.tcp, sizeof(h.tcp), sum));

	if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(h), 0) < 0 ||
	    bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &h, sizeof(h), 0) < 0)
		return -1;
	return 0;
}

/* ICMP port unreachable quoting the IP header and the first 8 bytes of
 * its payload (RFC 792): trim the packet to the quote, then open room for
 * the new IP and ICMP headers between L2 and the quote. */
static __always_inline int reject_udp4(struct __sk_buff *skb, const struct pkt *p)
{
	struct ethhdr eth;
	struct {
		struct iphdr ip;
		struct icmp_err_hdr icmp;
	} h = {};
	__u32 quote = p->l3_len + 8;
	__u32 sum;

	if (quote > 60 + 8 || load_swapped_eth(skb, &eth) < 0)
		return -1;
	h.ip.version = 4;
	h.ip.ihl = 5;
	h.ip.tot_len = bpf_htons(sizeof(h) + quote);
	h.ip.ttl = 64;
	h.ip.protocol = IPPROTO_ICMP;
	h.ip.saddr = p->daddr[3];
	h.ip.daddr = p->saddr[3];
	h.ip.check = csum_fold(csum_add_buf(&h.ip, sizeof(h.ip), 0));
	h.icmp.type = ICMP_DEST_UNREACH;
	h.icmp.code = ICMP_PORT_UNREACH;
	sum = csum_add_buf(&h.icmp, sizeof(h.icmp), 0);
	h.icmp.checksum = csum_fold(csum_skb(skb, ETH_HLEN, quote, sum));

	if (bpf_skb_change_tail(skb, ETH_HLEN + quote, 0) < 0 ||
	    bpf_skb_adjust_room(skb, sizeof(h), BPF_ADJ_ROOM_MAC, 0) < 0 ||
	    bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &h, sizeof(h), 0) < 0)
		return -1;
	return 0;
}

/* ICMPv6 port unreachable quoting as much of the packet as fits the
 * minimum IPv6 MTU (RFC 4443 2.4). */
static __always_inline int reject_udp6(struct __sk_buff *skb, const struct pkt *p)
{
	struct ethhdr eth;
	struct {
		struct ipv6hdr ip6;
		struct icmp_err_hdr icmp;
	} h = {};
	struct pseudo6_tail pt = {};
	__u32 quote = p->l3_len + p->l4_len;
	__u32 sum;

	if (skb->len < ETH_HLEN + sizeof(struct ipv6hdr) + 8)
		return -1;
	if (quote > skb->len - ETH_HLEN)
		quote = skb->len - ETH_HLEN;
	if (quote > ICMPV6_QUOTE_MAX)
		quote = ICMPV6_QUOTE_MAX;
	if (load_swapped_eth(skb, &eth) < 0)
		return -1;
	fill_ip6(&h.ip6, p, sizeof(h.icmp) + quote, IPPROTO_ICMPV6);
	h.icmp.type = ICMPV6_DEST_UNREACH;
	h.icmp.code = ICMPV6_PORT_UNREACH;
	pt.len = bpf_htonl(sizeof(h.icmp) + quote);
	pt.nexthdr = IPPROTO_ICMPV6;
	sum = csum_add_buf(&h.ip6.saddr, 32, 0);
	sum = csum_add_buf(&pt, sizeof(pt), sum);
	sum = csum_add_buf(&h.icmp, sizeof(h.icmp), sum);
	/* The quote starts 8 bytes (even) into the ICMPv6 message. */
	h.icmp.checksum = csum_fold(csum_skb(skb, ETH_HLEN, quote, sum));

	if (bpf_skb_change_tail(skb, ETH_HLEN + quote, 0) < 0 ||
	    bpf_skb_adjust_room(skb, sizeof(h), BPF_ADJ_ROOM_MAC, 0) < 0 ||
	    bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &h, sizeof(h), 0) < 0)
		return -1;
	return 0;
}

/* No usable backend: tell the client at once instead of letting it time
 * out (refuse let it). (A global function: verified once, not for every
 * path that leads here.) */
__noinline int reject(struct __sk_buff *skb, const struct pkt *p)
{
	int err;

	if (!p)
		return TCX_DROP;
	if (p->proto == IPPROTO_TCP) {
		err = p->v6 ? reject_tcp6(skb, p) : reject_tcp4(skb, p);
	} else {
		err = p->v6 ? reject_udp6(skb, p) : reject_udp4(skb, p);
	}
	if (err < 0)
		return TCX_DROP;
	bpf_redirect(skb->ifindex, 0);
	return TCX_REDIRECT;
}

#endif /* L4XDS_LIB_REJECT_H */
