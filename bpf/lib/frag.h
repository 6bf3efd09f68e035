// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* IP fragments: the first fragment leaves its translation for the later
 * ones, which have no ports. */
#ifndef L4XDS_LIB_FRAG_H
#define L4XDS_LIB_FRAG_H

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

#endif /* L4XDS_LIB_FRAG_H */
