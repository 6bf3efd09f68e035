// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The flow hash that picks a Maglev slot. */
#ifndef L4XDS_LIB_HASH_H
#define L4XDS_LIB_HASH_H

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

#endif /* L4XDS_LIB_HASH_H */
