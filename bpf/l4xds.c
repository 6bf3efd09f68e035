// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * l4xds service datapath: a tcx ingress program that DNATs packets for a
 * VIP:port/protocol to a backend chosen through the service's weighted
 * Maglev table, reverse-NATs the backends' replies, and keeps flows on
 * their backend through conntrack.
 *
 * Per IPv4/IPv6 TCP/UDP packet (other protocols pass, but ICMP errors, below):
 *   1. a backend's reply (CT_REPLY hit): source restored to the VIP;
 *   2. to a VIP:port/proto we serve: source ranges, then the flow's
 *      backend from conntrack, or a new one (affinity, then Maglev);
 *      no usable backend: TCP RST / ICMP port unreachable;
 *   3. to a VIP on a port we do not serve: dropped and counted;
 *   4. anything else: passed.
 * The first fragment of a datagram (IPv4, or IPv6 with a Fragment header
 * right after the fixed header) goes through the same steps and leaves its
 * translation in l4xds_frags for the later fragments, which have no ports.
 * ICMP and ICMPv6 errors quoting a packet of a translated flow are
 * translated too, so that PMTU discovery and port unreachable work
 * through the VIP.
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

char __license[] SEC("license") = "Dual BSD/GPL";

/* Size of every Maglev table, set by the loader (--lb-maglev-table-size). */
volatile const __u32 maglev_size = 1021;

/* Translated packets go straight to their next hop (fib_forward); 0 leaves
 * the forwarding to the stack (tests that want the kernel's routing out of
 * the picture). */
volatile const __u8 fib_redirect = 1;

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

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_SERVICES_MAX);
	__type(key, __u32);
	__type(value, struct lb_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} l4xds_stats SEC(".maps");

#define NSEC_PER_SEC 1000000000ULL

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
};

enum parse_result {
	PARSE_OK,
	PARSE_PASS,      /* not ours to look at */
	PARSE_FRAGMENT,  /* a later fragment: no L4 header */
	PARSE_MALFORMED, /* truncated or inconsistent L4 header */
	PARSE_ICMP,      /* ICMP or ICMPv6 (proto), not fragmented */
};

static __always_inline int is_v4mapped(const __u32 *a)
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0x0000ffff);
}

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
		if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP &&
		    ip->protocol != IPPROTO_ICMP)
			return PARSE_PASS;
		ihl = ip->ihl;
		frag_off = ip->frag_off;
		p->proto = ip->protocol;
		p->saddr[2] = bpf_htonl(0x0000ffff);
		p->saddr[3] = ip->saddr;
		p->daddr[2] = bpf_htonl(0x0000ffff);
		p->daddr[3] = ip->daddr;
		p->l3_len = ihl * 4;
		p->ttl = ip->ttl;
		tot = bpf_ntohs(ip->tot_len);
		if (p->proto == IPPROTO_ICMP) {
			/* An ICMP error fits one packet; fragments pass. */
			if (tot < ihl * 4 ||
			    (frag_off & bpf_htons(IP_MF | IP_OFFSET)))
				return PARSE_PASS;
			p->l4_len = tot - ihl * 4;
			return PARSE_ICMP;
		}
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
		if (nexthdr == IPPROTO_ICMPV6) {
			p->proto = IPPROTO_ICMPV6;
			return PARSE_ICMP;
		}
		/* Of the extension headers, only a Fragment header right
		 * after the fixed one is parsed; the others pass. */
		if (nexthdr == IPV6_NEXTHDR_FRAGMENT) {
			struct ipv6_frag_hdr *fh;

			fh = skb_header(skb, ETH_HLEN + sizeof(*ip6), sizeof(*fh));
			if (!fh)
				return PARSE_PASS;
			if (fh->nexthdr != IPPROTO_TCP && fh->nexthdr != IPPROTO_UDP)
				return PARSE_PASS;
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
		if (nexthdr != IPPROTO_TCP && nexthdr != IPPROTO_UDP)
			return PARSE_PASS;
		p->proto = nexthdr;
		return parse_l4(skb, p, ETH_HLEN + sizeof(*ip6));
	}

	return PARSE_PASS;
}

/* A deterministic Jenkins-style mix of the 5-tuple (no seed: the Maglev
 * slot of a flow is the same on every node and in every test). */
#define rol32(x, k) (((x) << (k)) | ((x) >> (32 - (k))))

#define hash_mix(a, b, c)                         \
	do {                                      \
		a -= c; a ^= rol32(c, 4);  c += b; \
		b -= a; b ^= rol32(a, 6);  a += c; \
		c -= b; c ^= rol32(b, 8);  b += a; \
		a -= c; a ^= rol32(c, 16); c += b; \
		b -= a; b ^= rol32(a, 19); a += c; \
		c -= b; c ^= rol32(b, 4);  b += a; \
	} while (0)

#define hash_final(a, b, c)                       \
	do {                                      \
		c ^= b; c -= rol32(b, 14);         \
		a ^= c; a -= rol32(c, 11);         \
		b ^= a; b -= rol32(a, 25);         \
		c ^= b; c -= rol32(b, 16);         \
		a ^= c; a -= rol32(c, 4);          \
		b ^= a; b -= rol32(a, 14);         \
		c ^= b; c -= rol32(b, 24);         \
	} while (0)

#define HASH_INIT 0x4c347d5eU

/* Words are taken as loaded (host order of network-order bytes): saddr[0..3],
 * daddr[0..3], sport | dport << 16, proto. pkg/datapath/bpf's tests mirror
 * this function. */
static __always_inline __u32 flow_hash(const struct pkt *p)
{
	__u32 a, b, c;

	a = b = c = HASH_INIT + (10 << 2);
	a += p->saddr[0]; b += p->saddr[1]; c += p->saddr[2];
	hash_mix(a, b, c);
	a += p->saddr[3]; b += p->daddr[0]; c += p->daddr[1];
	hash_mix(a, b, c);
	a += p->daddr[2]; b += p->daddr[3];
	c += (__u32)p->sport | ((__u32)p->dport << 16);
	hash_mix(a, b, c);
	a += p->proto;
	hash_final(a, b, c);
	return c;
}

static __always_inline __u16 csum_fold(__u32 csum)
{
	csum = (csum & 0xffff) + (csum >> 16);
	csum = (csum & 0xffff) + (csum >> 16);
	return (__u16)~csum;
}

/* Ones' complement addition of two unfolded sums. */
static __always_inline __u32 csum_add(__u32 a, __u32 b)
{
	a += b;
	return a + (a < b);
}

/* A checksum field after the data it covers changed by diff, a
 * bpf_csum_diff of the old and new bytes (RFC 1624: HC' = ~(~HC + m' - m)).
 * Both are taken as loaded: the sum works in either byte order. */
static __always_inline __u16 csum_update(__u16 check, __u32 diff)
{
	return csum_fold(csum_add((__u16)~check, diff));
}

/* The change of a sum when a 16-byte address goes from from to to, as
 * bpf_csum_diff would give it (without the helper call): ~m + m' word by
 * word. */
static __always_inline __u32 csum_diff_addr(const __u32 *from, const __u32 *to)
{
	__u32 s = 0;
	int i;

	for (i = 0; i < 4; i++)
		s = csum_add(csum_add(s, ~from[i]), to[i]);
	return s;
}

static __always_inline int addr_eq(const __u32 *a, const __u32 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

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

/* The conntrack key of p's own direction (dir set by the caller). */
static __always_inline void ct_key_of(struct lb_ct_key *key, const struct pkt *p)
{
	__builtin_memcpy(key->saddr, p->saddr, 16);
	__builtin_memcpy(key->daddr, p->daddr, 16);
	key->sport = p->sport;
	key->dport = p->dport;
	key->proto = p->proto;
}

/* The l4xds_frags key of p's datagram. */
static __always_inline void frag_key_of(struct lb_frag_key *key,
					const struct pkt *p, __u8 dir)
{
	__builtin_memcpy(key->saddr, p->saddr, 16);
	__builtin_memcpy(key->daddr, p->daddr, 16);
	key->id = p->frag_id;
	key->proto = p->proto;
	key->dir = dir;
}

static __always_inline __u32 l4_csum_off(const struct pkt *p)
{
	return ETH_HLEN + p->l3_len +
	       (p->proto == IPPROTO_TCP ? offsetof(struct tcp_hdr, check)
					: offsetof(struct udphdr, check));
}

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
 * result of zero is written as 0xffff. */
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

/* The first fragment of a datagram leaves its translation for the later
 * ones: the backend (CT_FORWARD) or the VIP (CT_REPLY). */
static __always_inline void frag_remember(const struct pkt *p, __u8 dir,
					  const __u32 *addr, __u32 svc_id)
{
	struct lb_frag_key key = {};
	struct lb_frag val = { .svc_id = svc_id };

	frag_key_of(&key, p, dir);
	__builtin_memcpy(val.addr, addr, 16);
	bpf_map_update_elem(&l4xds_frags, &key, &val, BPF_ANY);
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

/* Checksum of len bytes of the packet from off, seeded with sum: whole
 * chunks read onto the stack, then the rest zero-padded (padding does not
 * change a ones' complement sum). */
__noinline __u32 csum_skb(struct __sk_buff *skb, __u32 off, __u32 len, __u32 sum)
{
	__u8 buf[CSUM_CHUNK];
	__u32 chunks = len / CSUM_CHUNK;
	__u64 rest = len % CSUM_CHUNK;
	__s64 s;
	int i;

	for (i = 0; i < ICMPV6_QUOTE_MAX / CSUM_CHUNK + 1; i++) {
		if (i >= chunks)
			break;
		if (bpf_skb_load_bytes(skb, off + i * CSUM_CHUNK, buf, sizeof(buf)) < 0)
			return 0;
		s = bpf_csum_diff(NULL, 0, (__be32 *)buf, sizeof(buf), sum);
		if (s < 0)
			return 0;
		sum = (__u32)s;
	}
	/* Keeps clang from folding the checks the verifier needs to see on
	 * the register passed as length. */
	asm volatile("" : "+r"(rest));
	if (rest == 0 || rest >= CSUM_CHUNK)
		return sum;
	__builtin_memset(buf, 0, sizeof(buf));
	if (bpf_skb_load_bytes(skb, off + chunks * CSUM_CHUNK, buf, rest) < 0)
		return 0;
	s = bpf_csum_diff(NULL, 0, (__be32 *)buf, sizeof(buf), sum);
	return s < 0 ? 0 : (__u32)s;
}

static __always_inline __u32 csum_add_buf(const void *buf, __u32 len,
					  __u32 seed)
{
	__s64 s = bpf_csum_diff(NULL, 0, (__be32 *)buf, len, seed);

	return s < 0 ? 0 : (__u32)s;
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
 * out. A RST is never answered. (A global function: verified once, not for
 * every path that leads here.) */
__noinline int reject(struct __sk_buff *skb, const struct pkt *p)
{
	int err;

	if (!p)
		return TCX_DROP;
	if (p->proto == IPPROTO_TCP) {
		if (p->tcp_flags & TCP_RST)
			return TCX_DROP;
		err = p->v6 ? reject_tcp6(skb, p) : reject_tcp4(skb, p);
	} else {
		err = p->v6 ? reject_udp6(skb, p) : reject_udp4(skb, p);
	}
	if (err < 0)
		return TCX_DROP;
	bpf_redirect(skb->ifindex, 0);
	return TCX_REDIRECT;
}

static __always_inline int tcp_closing(const struct pkt *p)
{
	return p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FIN | TCP_RST));
}

static __always_inline int ct_expired(const struct lb_ct_entry *e,
				      const struct pkt *p, __u64 now)
{
	__u64 lifetime = CT_LIFETIME_NONTCP;

	if (p->proto == IPPROTO_TCP)
		lifetime = (e->flags & CT_F_CLOSING) ? CT_LIFETIME_TCP_CLOSING
						     : CT_LIFETIME_TCP;
	return now - e->last_seen > lifetime * NSEC_PER_SEC;
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

/* Fragments and truncated headers are dropped when they are for a VIP,
 * and passed otherwise. */
static __always_inline int drop_if_vip(const struct pkt *p, __u32 reason)
{
	int svc_id = vip_service(p);

	if (svc_id < 0)
		return TCX_NEXT;
	count_drop(svc_id, reason);
	return TCX_DROP;
}

/* Verdicts of the steps below that let the packet go on to the next one. */
#define VERDICT_CONTINUE -100
#define VERDICT_REJECT -101

/* A backend's reply: restore the VIP as source. The entries of a flow are
 * refreshed (and marked closing) from either direction, at most once a
 * second. */
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
	e = bpf_map_lookup_elem(&l4xds_ct, &key);
	if (!e)
		return VERDICT_CONTINUE;

	__builtin_memcpy(vip, e->vip, 16);
	vip_port = e->vip_port;
	svc_id = e->svc_id;
	if (is_v4mapped(vip) == p->v6)
		return TCX_NEXT;

	now = bpf_ktime_get_ns();
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

	if (nat_rewrite(skb, p, 0, p->saddr, vip, p->sport, vip_port) < 0)
		return TCX_DROP;
	if (p->frag)
		frag_remember(p, CT_REPLY, vip, svc_id);
	count_packet(svc_id, skb->len);
	return fib_forward(skb, p, vip, p->daddr, vip_port, p->dport);
}

/* The backend of an existing flow, if the flow may keep it: whatever its
 * state (a terminating backend drains), as long as it still belongs to the
 * service. */
static __always_inline struct lb_backend *
ct_backend(const struct pkt *p, struct lb_ct_entry *e, __u32 svc_id, __u64 now)
{
	struct lb_backend *be;

	if (!e || e->svc_id != svc_id || ct_expired(e, p, now))
		return NULL;
	/* A new connection on the ports of one that closed. */
	if ((e->flags & CT_F_CLOSING) && p->proto == IPPROTO_TCP &&
	    (p->tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN)
		return NULL;
	be = bpf_map_lookup_elem(&l4xds_backends, &e->backend_id);
	if (!be || be->svc_id != svc_id || is_v4mapped(be->addr) == p->v6)
		return NULL;
	return be;
}

static __always_inline struct lb_backend *
affinity_backend(const struct pkt *p, __u32 svc_id, __u32 timeout, __u64 now,
		 __u32 *backend_id)
{
	struct lb_affinity_key key = { .svc_id = svc_id };
	struct lb_affinity *a;
	struct lb_backend *be;

	__builtin_memcpy(key.client, p->saddr, 16);
	a = bpf_map_lookup_elem(&l4xds_affinity, &key);
	if (!a || now - a->last_used > (__u64)timeout * NSEC_PER_SEC)
		return NULL;
	*backend_id = a->backend_id;
	be = bpf_map_lookup_elem(&l4xds_backends, backend_id);
	if (!be || be->svc_id != svc_id || be->state != LB_BACKEND_ACTIVE ||
	    is_v4mapped(be->addr) == p->v6)
		return NULL;
	return be;
}

/* The CT_REPLY key of the backend's answers to the client of p. */
static __always_inline void reply_key(struct lb_ct_key *rk, const struct pkt *p,
				      const __u32 *baddr, __be16 bport)
{
	__builtin_memcpy(rk->saddr, baddr, 16);
	__builtin_memcpy(rk->daddr, p->saddr, 16);
	rk->sport = bport;
	rk->dport = p->sport;
	rk->proto = p->proto;
}

/* The reply key has no VIP in it: a client that reuses its port for
 * another VIP with the same backend takes the entry over. Before the
 * reply entry of p's flow is written, the flow that holds it for another
 * VIP is marked CT_F_REPLY_LOST, and its next packet takes it back. So the
 * established path needs no lookup of the reply entry: it is written again
 * when marked, and with every refresh (at most once a second), which also
 * restores an entry the LRU evicted. */
static __always_inline void reply_claim(const struct lb_ct_key *rk,
					const struct pkt *p)
{
	struct lb_ct_key fk = { .dir = CT_FORWARD };
	struct lb_ct_entry *r, *f;

	r = bpf_map_lookup_elem(&l4xds_ct, rk);
	if (!r || (r->vip_port == p->dport && addr_eq(r->vip, p->daddr)))
		return;
	__builtin_memcpy(fk.saddr, p->saddr, 16);
	__builtin_memcpy(fk.daddr, r->vip, 16);
	fk.sport = p->sport;
	fk.dport = r->vip_port;
	fk.proto = p->proto;
	f = bpf_map_lookup_elem(&l4xds_ct, &fk);
	if (f)
		f->flags |= CT_F_REPLY_LOST;
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
	struct lb_ct_entry *e;
	struct lb_backend *be;
	__u64 now;

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
		if (bpf_map_lookup_elem(&l4xds_ct, &rk))
			return VERDICT_CONTINUE;
	}

	if (svc_flags & LB_SVC_F_SOURCE_RANGES) {
		struct lb_src_range_key key = {
			.prefixlen = 32 + 128,
			.svc_id = svc_id,
		};

		__builtin_memcpy(key.addr, p->saddr, 16);
		if (!bpf_map_lookup_elem(&l4xds_srcrange, &key)) {
			count_drop(svc_id, LB_DROP_SOURCE_RANGE);
			return TCX_DROP;
		}
	}

	if (be && e) {
		int closing = tcp_closing(p) && !(e->flags & CT_F_CLOSING);

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

	if (!svc_count) {
		count_drop(svc_id, LB_DROP_NO_BACKEND);
		return VERDICT_REJECT;
	}

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
		if (!backend_id) {
			count_drop(svc_id, LB_DROP_NO_BACKEND);
			return VERDICT_REJECT;
		}
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

	if (svc_flags & LB_SVC_F_AFFINITY) {
		struct lb_affinity_key ak = { .svc_id = svc_id };
		struct lb_affinity av = {
			.last_used = now,
			.backend_id = backend_id,
		};

		__builtin_memcpy(ak.client, p->saddr, 16);
		bpf_map_update_elem(&l4xds_affinity, &ak, &av, BPF_ANY);
	}

	ce.flags = tcp_closing(p) ? CT_F_CLOSING : 0;
	ce.last_seen = now;
	ce.backend_id = backend_id;
	ce.svc_id = svc_id;
	bpf_map_update_elem(&l4xds_ct, &fk, &ce, BPF_ANY);

	reply_key(&rk, p, baddr, bport);
store_reply:
	reply_claim(&rk, p);
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

/* A later fragment (no ports): the translation of its datagram's first
 * fragment, address only; the L4 checksum is in the first fragment. With
 * no entry (the first fragment was not seen, or came later), a fragment
 * to a VIP cannot be mapped to a backend and is dropped; any other
 * passes. */
__noinline int handle_fragment(struct __sk_buff *skb, const struct pkt *p)
{
	struct lb_frag_key key = {};
	struct lb_frag *f;
	__u32 addr[4];
	__u32 svc_id;
	int dst = 1;

	if (!p)
		return TCX_DROP;
	frag_key_of(&key, p, CT_FORWARD);
	f = bpf_map_lookup_elem(&l4xds_frags, &key);
	if (!f) {
		key.dir = CT_REPLY;
		dst = 0;
		f = bpf_map_lookup_elem(&l4xds_frags, &key);
	}
	if (!f)
		return drop_if_vip(p, LB_DROP_FRAGMENT);
	__builtin_memcpy(addr, f->addr, 16);
	svc_id = f->svc_id;
	if (is_v4mapped(addr) == p->v6)
		return TCX_NEXT;
	if (addr_rewrite(skb, p, dst, dst ? p->daddr : p->saddr, addr) < 0)
		return TCX_DROP;
	count_packet(svc_id, skb->len);
	return TCX_NEXT;
}

static __always_inline int icmp_is_error(const struct pkt *p, __u8 type)
{
	if (p->v6)
		return type == ICMPV6_DEST_UNREACH || type == ICMPV6_PKT_TOOBIG ||
		       type == ICMPV6_TIME_EXCEED;
	return type == ICMP_DEST_UNREACH || type == ICMP_TIME_EXCEEDED;
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
 * same (skb->csum of CHECKSUM_COMPLETE holds). Errors without a flow pass
 * untouched. */
__noinline int handle_icmp_error(struct __sk_buff *skb, const struct pkt *p)
{
	struct icmp_err_hdr icmp;
	struct icmp_quote_l4 l4h;
	struct icmp_quote_fields old = {}, new = {};
	struct lb_ct_key key = {};
	struct lb_ct_entry *e;
	__u32 outer_old[4];
	__u32 icmp_off, in_off, in_l3, l4_off, quote, l4_check_off = 0;
	__u32 addr_diff, port_diff, outer_diff;
	__u32 svc_id;
	__be16 new_port;
	__s64 s;
	int reply;

	if (!p)
		return TCX_DROP;
	icmp_off = ETH_HLEN + p->l3_len;
	if (p->l4_len < sizeof(icmp) ||
	    bpf_skb_load_bytes(skb, icmp_off, &icmp, sizeof(icmp)) < 0)
		return TCX_NEXT;
	if (!icmp_is_error(p, icmp.type))
		return TCX_NEXT;
	in_off = icmp_off + sizeof(icmp);
	if (skb->len < in_off)
		return TCX_NEXT;
	quote = p->l4_len - sizeof(icmp);
	if (quote > skb->len - in_off)
		quote = skb->len - in_off;

	if (p->v6) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, in_off, &ip6, sizeof(ip6)) < 0 ||
		    ip6.version != 6)
			return TCX_NEXT;
		if (ip6.nexthdr != IPPROTO_TCP && ip6.nexthdr != IPPROTO_UDP)
			return TCX_NEXT;
		key.proto = ip6.nexthdr;
		__builtin_memcpy(key.saddr, &ip6.daddr, 16);
		__builtin_memcpy(key.daddr, &ip6.saddr, 16);
		in_l3 = sizeof(ip6);
	} else {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, in_off, &ip, sizeof(ip)) < 0 ||
		    ip.version != 4 || ip.ihl < 5)
			return TCX_NEXT;
		if (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP)
			return TCX_NEXT;
		/* A later fragment quotes no ports. */
		if (ip.frag_off & bpf_htons(IP_OFFSET))
			return TCX_NEXT;
		key.proto = ip.protocol;
		key.saddr[2] = bpf_htonl(0x0000ffff);
		key.saddr[3] = ip.daddr;
		key.daddr[2] = bpf_htonl(0x0000ffff);
		key.daddr[3] = ip.saddr;
		old.ip_check = ip.check;
		in_l3 = ip.ihl * 4;
	}
	if (!addr_eq(p->daddr, key.daddr) || quote < in_l3 + sizeof(l4h))
		return TCX_NEXT;
	l4_off = in_off + in_l3;
	if (bpf_skb_load_bytes(skb, l4_off, &l4h, sizeof(l4h)) < 0)
		return TCX_NEXT;
	/* The flow's entry seen from the quoted packet's receiver. */
	key.sport = l4h.ports[1];
	key.dport = l4h.ports[0];
	key.dir = CT_REPLY;
	e = bpf_map_lookup_elem(&l4xds_ct, &key);
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
		e = bpf_map_lookup_elem(&l4xds_ct, &key);
		if (!e)
			return TCX_NEXT;
		svc_id = e->svc_id;
		be = bpf_map_lookup_elem(&l4xds_backends, &e->backend_id);
		if (!be || be->svc_id != svc_id)
			return TCX_NEXT;
		reply = 0;
		__builtin_memcpy(old.addr, key.daddr, 16); /* the VIP */
		__builtin_memcpy(new.addr, be->addr, 16);
		new_port = be->port;
		__builtin_memcpy(outer_old, p->daddr, 16);
	}
	if (is_v4mapped(new.addr) == p->v6)
		return TCX_NEXT;

	old.ports[0] = l4h.ports[0];
	old.ports[1] = l4h.ports[1];
	if (key.proto == IPPROTO_UDP) {
		l4_check_off = l4_off + offsetof(struct udphdr, check);
		old.l4_check = l4h.check;
	} else if (quote >= in_l3 + offsetof(struct tcp_hdr, check) + 2) {
		l4_check_off = l4_off + offsetof(struct tcp_hdr, check);
		if (bpf_skb_load_bytes(skb, l4_check_off, &old.l4_check, 2) < 0)
			return TCX_NEXT;
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
		return TCX_NEXT;
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
		return handle_icmp_error(skb, &p);
	case PARSE_MALFORMED:
		return drop_if_vip(&p, LB_DROP_MALFORMED);
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
	return TCX_NEXT;
}
