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
				      const struct pkt *p, __u64 now)
{
	__u64 lifetime = CT_LIFETIME_NONTCP;

	if (p->proto == IPPROTO_TCP)
		lifetime = (e->flags & CT_F_CLOSING) ? CT_LIFETIME_TCP_CLOSING
						     : CT_LIFETIME_TCP;
	return now - e->last_seen > lifetime * NSEC_PER_SEC;
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

#endif /* L4XDS_LIB_CONNTRACK_H */
