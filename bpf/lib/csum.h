// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Checksums: incremental updates after a rewrite, and sums over the packet
 * for the packets the datapath writes itself. */
#ifndef L4XDS_LIB_CSUM_H
#define L4XDS_LIB_CSUM_H

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

static __always_inline __u32 l4_csum_off(const struct pkt *p)
{
	return ETH_HLEN + p->l3_len +
	       (p->proto == IPPROTO_TCP ? offsetof(struct tcp_hdr, check)
					: offsetof(struct udphdr, check));
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

#endif /* L4XDS_LIB_CSUM_H */
