// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Conntrack: a flow's forward and reply entries, and the backend an
 * existing flow (or a client's affinity) keeps. */
#ifndef L4XDS_LIB_CONNTRACK_H
#define L4XDS_LIB_CONNTRACK_H

/* The conntrack key of p's own direction (dir set by the caller). */
static __always_inline void ct_key_of(struct lb_ct_key *key, const struct pkt *p)
{
	__builtin_memcpy(key->saddr, p->saddr, 16);
	__builtin_memcpy(key->daddr, p->daddr, 16);
	key->sport = p->sport;
	key->dport = p->dport;
	key->proto = p->proto;
}

static __always_inline int tcp_closing(const struct pkt *p)
{
	return p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FIN | TCP_RST));
}

static __always_inline int ct_expired(const struct lb_ct_entry *e,
				      __u8 proto, __u64 now)
{
	__u64 lifetime = CT_LIFETIME_NONTCP;

	if (proto == IPPROTO_TCP && (e->flags & CT_F_CLOSING))
		lifetime = CT_LIFETIME_TCP_CLOSING;
	else if (e->flags & CT_F_NEW)
		lifetime = CT_LIFETIME_NEW;
	else if (proto == IPPROTO_TCP)
		lifetime = CT_LIFETIME_TCP;
	return now - e->last_seen > lifetime * NSEC_PER_SEC;
}

/* The live entry of key in map, if any. */
static __always_inline struct lb_ct_entry *ct_lookup(void *map,
						     const struct lb_ct_key *key,
						     __u64 now)
{
	struct lb_ct_entry *e = bpf_map_lookup_elem(map, key);

	if (!e || ct_expired(e, key->proto, now))
		return NULL;
	return e;
}

/* The backend of an existing flow, if the flow may keep it: whatever its
 * state (a terminating backend drains), as long as it still belongs to the
 * service. */
static __always_inline struct lb_backend *
ct_backend(const struct pkt *p, struct lb_ct_entry *e, __u32 svc_id, __u64 now)
{
	struct lb_backend *be;

	if (!e || e->svc_id != svc_id || ct_expired(e, p->proto, now))
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

/* The backend a client's affinity names, if it still takes new flows:
 * active, and in the service's table (not LB_BACKEND_F_STANDBY), so that
 * affinity does not override priority failover or a weight of 0. */
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
	    (be->flags & LB_BACKEND_F_STANDBY) || is_v4mapped(be->addr) == p->v6)
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
 * reply entry rk of a flow to vip:vip_port is written, the flow that holds
 * it for another VIP is marked CT_F_REPLY_LOST, and its next packet takes
 * it back. So the established path needs no lookup of the reply entry: it
 * is written again when marked, and with every refresh (at most once a
 * second), which also restores an entry the LRU evicted. */
static __always_inline void reply_claim(const struct lb_ct_key *rk,
					const __u32 *vip, __be16 vip_port)
{
	struct lb_ct_key fk = { .dir = CT_FORWARD };
	struct lb_ct_entry *r, *f;

	r = bpf_map_lookup_elem(&l4xds_ct, rk);
	if (!r || (r->vip_port == vip_port && addr_eq(r->vip, vip)))
		return;
	__builtin_memcpy(fk.saddr, rk->daddr, 16);
	__builtin_memcpy(fk.daddr, r->vip, 16);
	fk.sport = rk->dport;
	fk.dport = r->vip_port;
	fk.proto = rk->proto;
	f = bpf_map_lookup_elem(&l4xds_ct, &fk);
	if (f)
		f->flags |= CT_F_REPLY_LOST;
}

/* Whether the half-open reply entry rk names p's VIP. */
static __always_inline int reply_is_ours(const struct lb_ct_key *rk,
					 const struct pkt *p)
{
	struct lb_ct_entry *r = bpf_map_lookup_elem(&l4xds_ct_new, rk);

	return r && r->vip_port == p->dport && addr_eq(r->vip, p->daddr);
}

/* The forward key of the flow whose reply key is rk, to vip:vip_port. */
static __always_inline void forward_key(struct lb_ct_key *fk,
					const struct lb_ct_key *rk,
					const __u32 *vip, __be16 vip_port)
{
	__builtin_memcpy(fk->saddr, rk->daddr, 16);
	__builtin_memcpy(fk->daddr, vip, 16);
	fk->sport = rk->dport;
	fk->dport = vip_port;
	fk->proto = rk->proto;
	fk->dir = CT_FORWARD;
}

/* The forward entry of the flow whose reply entry in l4xds_ct_new is rk,
 * h (its key in fk): in l4xds_ct_new, or in l4xds_ct if established on
 * another CPU meanwhile; NULL if the LRU evicted it. */
static __always_inline struct lb_ct_entry *
half_open_forward(struct lb_ct_key *fk, const struct lb_ct_key *rk,
		  const struct lb_ct_entry *h)
{
	struct lb_ct_entry *f;

	forward_key(fk, rk, h->vip, h->vip_port);
	f = bpf_map_lookup_elem(&l4xds_ct_new, fk);
	if (!f)
		f = bpf_map_lookup_elem(&l4xds_ct, fk);
	return f;
}

/* Whether the half-open reply entry h is stale: its flow's forward entry
 * f names another backend. The flow has gone elsewhere since (its backend
 * was removed, and the client's next packet went to another one), and
 * what this backend, or a router in front of it, sends about it is not
 * the flow's: taken as the flow's, a SYN-ACK would hand the client this
 * backend's sequence numbers, an answer take an established flow back to
 * it, an ICMP error abort the client's connect. */
static __always_inline int half_open_stale(const struct lb_ct_entry *f,
					   const struct lb_ct_entry *h)
{
	return f && (f->backend_id != h->backend_id || f->svc_id != h->svc_id);
}

/* Writes a new flow's entries into l4xds_ct_new: the forward entry fk
 * (which backend) and the reply entry rk (which VIP to restore, for the
 * backend's SYN-ACK or first answer). An established flow of the same
 * client port to another VIP with the same backend address has the reply
 * entry in l4xds_ct, which would win: it is taken over (reply_claim), as
 * it would be by an established flow, and so is a stale one of a closed
 * flow to the same VIP. */
static __always_inline void ct_new_store(const struct lb_ct_key *fk,
					 const struct lb_ct_key *rk,
					 struct lb_ct_entry *ce)
{
	if (bpf_map_lookup_elem(&l4xds_ct, rk)) {
		reply_claim(rk, ce->vip, ce->vip_port);
		bpf_map_delete_elem(&l4xds_ct, rk);
	}
	bpf_map_update_elem(&l4xds_ct_new, fk, ce, BPF_ANY);
	bpf_map_update_elem(&l4xds_ct_new, rk, ce, BPF_ANY);
}

/* The flow of fk and rk is established: its entries move from
 * l4xds_ct_new to l4xds_ct, and the client's affinity (if the service has
 * it) is written. Only here: so that a flood of new flows, spoofed sources
 * included, writes nothing but l4xds_ct_new. ce is the half-open entry's
 * content, vip and vip_port included. */
static __always_inline void ct_promote(const struct lb_ct_key *fk,
				       const struct lb_ct_key *rk,
				       struct lb_ct_entry *ce, __u64 now)
{
	__u8 flags = ce->flags;

	ce->last_seen = now;
	ce->flags = flags & CT_F_CLOSING;
	ce->synack_ack = 0;
	bpf_map_update_elem(&l4xds_ct, fk, ce, BPF_ANY);
	reply_claim(rk, ce->vip, ce->vip_port);
	bpf_map_update_elem(&l4xds_ct, rk, ce, BPF_ANY);
	if (flags & CT_F_AFFINITY) {
		struct lb_affinity_key ak = { .svc_id = ce->svc_id };
		struct lb_affinity av = {
			.last_used = now,
			.backend_id = ce->backend_id,
		};

		__builtin_memcpy(ak.client, fk->saddr, 16);
		bpf_map_update_elem(&l4xds_affinity, &ak, &av, BPF_ANY);
	}
	bpf_map_delete_elem(&l4xds_ct_new, fk);
	bpf_map_delete_elem(&l4xds_ct_new, rk);
}

#endif /* L4XDS_LIB_CONNTRACK_H */
