// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Parsing: Ethernet, IPv4 or IPv6 (with a Fragment header), TCP, UDP and
 * ICMP headers into struct pkt, read in place. */
#ifndef L4XDS_LIB_PARSE_H
#define L4XDS_LIB_PARSE_H

/* off..off+len of the packet, read in place (direct packet access): the
 * headers are in the linear part almost always, and a helper call per
 * header costs more than the bounds check. A header that is not is pulled
 * into it first. NULL when the packet is shorter. The pointer is only good
 * until the next helper call that may change the packet. */
static __always_inline void *skb_header(struct __sk_buff *skb, __u32 off,
					__u32 len)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	void *h = data + off;

	if (h + len <= end)
		return h;
	if (bpf_skb_pull_data(skb, off + len) < 0)
		return NULL;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	h = data + off;
	if (h + len > end)
		return NULL;
	return h;
}

static __always_inline int parse_l4(struct __sk_buff *skb, struct pkt *p,
				    __u32 off)
{
	if (p->proto == IPPROTO_TCP) {
		struct tcp_hdr *th;

		if (p->l4_len < sizeof(*th))
			return PARSE_MALFORMED;
		th = skb_header(skb, off, sizeof(*th));
		if (!th)
			return PARSE_MALFORMED;
		p->sport = th->source;
		p->dport = th->dest;
		p->has_ports = 1;
		p->seq = th->seq;
		p->ack_seq = th->ack_seq;
		p->tcp_flags = th->flags;
		p->l4_hlen = (th->doff >> 4) * 4;
		if (p->l4_hlen < sizeof(*th) || p->l4_hlen > p->l4_len)
			return PARSE_MALFORMED;
	} else {
		struct udphdr *uh;

		if (p->l4_len < sizeof(*uh))
			return PARSE_MALFORMED;
		uh = skb_header(skb, off, sizeof(*uh));
		if (!uh)
			return PARSE_MALFORMED;
		p->sport = uh->source;
		p->dport = uh->dest;
		p->has_ports = 1;
		p->l4_hlen = sizeof(*uh);
	}
	return PARSE_OK;
}

/* Why an IPv6 packet whose next header after the fixed one (and a
 * Fragment header) is nexthdr, not TCP or UDP, is not translated. */
static __always_inline __u8 ipv6_untranslated(__u8 nexthdr)
{
	switch (nexthdr) {
	case IPPROTO_ICMPV6:
		return LB_DROP_ICMP; /* fragmented */
	case 0:   /* Hop-by-Hop Options */
	case 43:  /* Routing */
	case 44:  /* Fragment (a second one) */
	case 51:  /* Authentication */
	case 60:  /* Destination Options */
	case 135: /* Mobility */
	case 139: /* Host Identity Protocol */
	case 140: /* Shim6 */
	case 253: /* experimental */
	case 254:
		return LB_DROP_IPV6_EXTENSION;
	}
	return LB_DROP_PROTOCOL;
}

/* The length after the IP header (of hlen bytes, Ethernet header aside) of
 * a BIG TCP packet, whose IP length field says 0: the skb's. Only a TCP GSO
 * packet is one (GRO merges TCP segments only beyond 64 KiB: a UDP
 * datagram's own length field holds no more); on any other packet a length
 * of 0 is what the header says, and 0 is returned. */
static __always_inline __u32 big_tcp_len(const struct __sk_buff *skb,
					 __u8 proto, __u32 hlen)
{
	if (proto != IPPROTO_TCP || !skb->gso_size ||
	    skb->len < ETH_HLEN + hlen)
		return 0;
	return skb->len - ETH_HLEN - hlen;
}

static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	struct ethhdr *eth;
	__be16 h_proto;

	eth = skb_header(skb, 0, sizeof(*eth));
	if (!eth)
		return PARSE_PASS;
	h_proto = eth->h_proto;

	if (h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip;
		__u32 tot, ihl;
		__be16 frag_off;

		ip = skb_header(skb, ETH_HLEN, sizeof(*ip));
		if (!ip)
			return PARSE_PASS;
		if (ip->version != 4 || ip->ihl < 5)
			return PARSE_PASS;
		ihl = ip->ihl;
		frag_off = ip->frag_off;
		p->proto = ip->protocol;
		p->saddr[2] = bpf_htonl(0x0000ffff);
		p->saddr[3] = ip->saddr;
		p->daddr[2] = bpf_htonl(0x0000ffff);
		p->daddr[3] = ip->daddr;
		if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP &&
		    p->proto != IPPROTO_ICMP) {
			p->untranslated = LB_DROP_PROTOCOL;
			return PARSE_UNTRANSLATED;
		}
		p->l3_len = ihl * 4;
		p->ttl = ip->ttl;
		tot = bpf_ntohs(ip->tot_len);
		if (p->proto == IPPROTO_ICMP) {
			/* An ICMP error fits one packet: fragments are not
			 * translated. */
			if (tot < ihl * 4)
				return PARSE_MALFORMED;
			if (frag_off & bpf_htons(IP_MF | IP_OFFSET)) {
				p->untranslated = LB_DROP_ICMP;
				return PARSE_UNTRANSLATED;
			}
			p->l4_len = tot - ihl * 4;
			return PARSE_ICMP;
		}
		/* BIG TCP: never a fragment. */
		if (tot == 0 && !(frag_off & bpf_htons(IP_MF | IP_OFFSET)))
			tot = big_tcp_len(skb, p->proto, 0);
		if (tot < ihl * 4)
			return PARSE_MALFORMED;
		p->l4_len = tot - ihl * 4;
		p->frag_id = ip->id;
		/* A later fragment has no L4 header: l4xds_frags has the
		 * translation of its first one. */
		if (frag_off & bpf_htons(IP_OFFSET))
			return PARSE_FRAGMENT;
		if (frag_off & bpf_htons(IP_MF))
			p->frag = 1;
		return parse_l4(skb, p, ETH_HLEN + ihl * 4);
	}

	if (h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6;
		__u8 nexthdr;

		ip6 = skb_header(skb, ETH_HLEN, sizeof(*ip6));
		if (!ip6)
			return PARSE_PASS;
		if (ip6->version != 6)
			return PARSE_PASS;
		p->v6 = 1;
		__builtin_memcpy(p->saddr, &ip6->saddr, 16);
		__builtin_memcpy(p->daddr, &ip6->daddr, 16);
		p->l3_len = sizeof(*ip6);
		p->ttl = ip6->hop_limit;
		p->l4_len = bpf_ntohs(ip6->payload_len);
		nexthdr = ip6->nexthdr;
		/* BIG TCP, without or with its Jumbo Payload option (which
		 * must then say the skb's length); the option is kept, and
		 * the packet translated after it. ip6 is not read again:
		 * skb_header may have moved the packet. */
		if (!p->l4_len && nexthdr == IPPROTO_TCP) {
			p->l4_len = big_tcp_len(skb, nexthdr, sizeof(*ip6));
		} else if (!p->l4_len && nexthdr == IPV6_NEXTHDR_HOP &&
			   skb->gso_size) {
			struct ipv6_jumbo_hdr *jh;
			__u32 len;

			/* Not one: an extension header, as any other. */
			jh = skb_header(skb, ETH_HLEN + sizeof(*ip6), sizeof(*jh));
			len = jh ? big_tcp_len(skb, jh->nexthdr, sizeof(*ip6)) : 0;
			if (len && jh->hdrlen == 0 &&
			    jh->tlv_type == IPV6_TLV_JUMBO && jh->tlv_len == 4 &&
			    bpf_ntohl(jh->jumbo_payload_len) == len &&
			    len >= sizeof(*jh)) {
				p->proto = IPPROTO_TCP;
				p->l3_len += sizeof(*jh);
				p->l4_len = len - sizeof(*jh);
				return parse_l4(skb, p, ETH_HLEN + sizeof(*ip6) +
							sizeof(*jh));
			}
		}
		if (nexthdr == IPPROTO_ICMPV6) {
			p->proto = IPPROTO_ICMPV6;
			return PARSE_ICMP;
		}
		/* Of the extension headers, only a Fragment header right
		 * after the fixed one is parsed; the others are not
		 * translated. */
		if (nexthdr == IPV6_NEXTHDR_FRAGMENT) {
			struct ipv6_frag_hdr *fh;

			/* Cut short: malformed, not the stack's (which would
			 * forward it without reading it). */
			fh = skb_header(skb, ETH_HLEN + sizeof(*ip6), sizeof(*fh));
			if (!fh)
				return PARSE_MALFORMED;
			if (fh->nexthdr != IPPROTO_TCP && fh->nexthdr != IPPROTO_UDP) {
				p->untranslated = ipv6_untranslated(fh->nexthdr);
				return PARSE_UNTRANSLATED;
			}
			p->proto = fh->nexthdr;
			p->frag_id = fh->identification;
			if (p->l4_len < sizeof(*fh))
				return PARSE_MALFORMED;
			p->l3_len += sizeof(*fh);
			p->l4_len -= sizeof(*fh);
			if (fh->frag_off & bpf_htons(IP6_OFFSET))
				return PARSE_FRAGMENT;
			/* Offset 0 without M is an atomic fragment (RFC
			 * 6946): a whole datagram. */
			if (fh->frag_off & bpf_htons(IP6_MF))
				p->frag = 1;
			return parse_l4(skb, p, ETH_HLEN + sizeof(*ip6) +
						sizeof(*fh));
		}
		if (nexthdr != IPPROTO_TCP && nexthdr != IPPROTO_UDP) {
			p->untranslated = ipv6_untranslated(nexthdr);
			return PARSE_UNTRANSLATED;
		}
		p->proto = nexthdr;
		return parse_l4(skb, p, ETH_HLEN + sizeof(*ip6));
	}

	return PARSE_PASS;
}

#endif /* L4XDS_LIB_PARSE_H */
