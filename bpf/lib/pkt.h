// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* What the parser extracts from a packet, and the protocol constants and
 * headers the datapath reads and writes. */
#ifndef L4XDS_LIB_PKT_H
#define L4XDS_LIB_PKT_H

#define NSEC_PER_SEC 1000000000ULL

/* Verdicts of the steps that let the packet go on to the next one. */
#define VERDICT_CONTINUE -100
#define VERDICT_REJECT -101

#define IP_DF 0x4000
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

/* The IPv6 Fragment header (RFC 8200 4.5); frag_off holds the offset in
 * 8-byte units in its upper 13 bits and the M flag in bit 0. */
#define IPV6_NEXTHDR_FRAGMENT 44
#define IP6_OFFSET 0xfff8
#define IP6_MF 0x0001

struct ipv6_frag_hdr {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;
	__be32 identification;
};

/* BIG TCP (Linux 5.19 for IPv4, 6.0 for IPv6): GRO and GSO packets of more
 * than 64 KiB, whose IPv4 total length or IPv6 payload length is 0, the
 * length being the skb's. Up to Linux 6.19 an IPv6 one has a Hop-by-Hop
 * header of one Jumbo Payload option (RFC 2675) right after the fixed
 * header, with the length of all that follows the fixed header; from 7.0
 * it has none, like IPv4. */
#define IPV6_NEXTHDR_HOP 0

struct ipv6_jumbo_hdr {
	__u8 nexthdr;
	__u8 hdrlen;   /* 0: 8 bytes */
	__u8 tlv_type; /* IPV6_TLV_JUMBO (linux/in6.h) */
	__u8 tlv_len;  /* 4 */
	__be32 jumbo_payload_len;
};

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

/* Not from <linux/icmp.h>, which drags in libc headers. */
#define ICMP_DEST_UNREACH 3
#define ICMP_PORT_UNREACH 3
#define ICMP_TIME_EXCEEDED 11
#define ICMPV6_DEST_UNREACH 1
#define ICMPV6_PKT_TOOBIG 2
#define ICMPV6_TIME_EXCEED 3
#define ICMPV6_PORT_UNREACH 4
/* Neighbour discovery (RFC 4861): router and neighbour solicitation and
 * advertisement, redirect. */
#define ICMPV6_NDISC_FIRST 133
#define ICMPV6_NDISC_LAST 137

/* An ICMP or ICMPv6 error header: type, code, checksum, 4 unused bytes. */
struct icmp_err_hdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be32 unused;
};

/* The 20 fixed bytes of a TCP header, without bit fields. */
struct tcp_hdr {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u8 doff; /* data offset in the high nibble */
	__u8 flags;
	__be16 window;
	__sum16 check;
	__be16 urg_ptr;
};

/* RFC 4443: an ICMPv6 error must fit the minimum IPv6 MTU (1280), so the
 * quote is at most 1280 - 40 - 8 bytes. */
#define ICMPV6_QUOTE_MAX 1232
#define CSUM_CHUNK 64

/* What the parser extracts from a packet. */
struct pkt {
	__u32 saddr[4];
	__u32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 v6;
	__u8 tcp_flags;
	__u8 has_ports; /* a fragment or a truncated header may have none */
	__u8 frag;      /* the first fragment of a fragmented datagram */
	__u8 ttl;       /* IPv4 TTL, IPv6 hop limit */
	__u32 frag_id;  /* IP ID of a fragment, as lb_frag_key.id */
	__u32 l3_len;   /* IP header length (IPv4 with options, IPv6 with a
			 * Fragment header) */
	__u32 l4_len;   /* bytes after the IP header, from the IP header */
	__u32 l4_hlen;  /* TCP data offset in bytes, 8 for UDP */
	__be32 seq;
	__be32 ack_seq;
	__u8 untranslated; /* PARSE_UNTRANSLATED: the LB_DROP_* reason */
};

enum parse_result {
	PARSE_OK,
	PARSE_PASS,      /* not ours to look at */
	PARSE_FRAGMENT,  /* a later fragment: no L4 header */
	PARSE_MALFORMED, /* truncated or inconsistent L4 header */
	PARSE_ICMP,      /* ICMP or ICMPv6 (proto), not fragmented */
	/* Addresses parsed, but nothing the program translates (another
	 * protocol, IPv6 extension headers, ICMP fragments): dropped if to
	 * a VIP, for the reason in untranslated, else passed. */
	PARSE_UNTRANSLATED,
};

static __always_inline int is_v4mapped(const __u32 *a)
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0x0000ffff);
}

static __always_inline int addr_eq(const __u32 *a, const __u32 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

#endif /* L4XDS_LIB_PKT_H */
