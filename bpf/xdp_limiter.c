// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Edgeguard XDP limiter.
 *
 * Per packet, in this order, every step counted:
 *   parse → lists trie (deny drops, allow passes) → prefix facts (rule,
 *   ASN, country: IPv4 direct table or trie) → L4 rule override → buckets:
 *   per source, prefix aggregate, ASN aggregate, global, each aggregate
 *   under its override if it has one → verdict (pass, drop, or dry-run
 *   "would drop").
 *
 * Lookups are hash, array and LPM only: the cost does not grow with the
 * number of rules (nor, for IPv4 sources with a direct table, with the
 * number of prefix facts). Every verdict leaves through finish(), which
 * records it.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "edgeguard_types.h"
#include "edgeguard_maps.h"
#include "edgeguard_parse.h"
#include "edgeguard_gcra.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set by the loader before the program is loaded. */
volatile const __u32 eg_max_rules = EG_DEFAULT_MAX_RULES;
/* seen_filter has eg_seen_mask + 1 words (a power of two). */
volatile const __u32 eg_seen_mask = 2 * EG_DEFAULT_SRC_ENTRIES - 1;
/* Tests set this to read time from the test_clock map instead of the kernel
 * clock; the verifier removes the branch not taken. */
volatile const __u8 eg_test_clock = 0;

/* BTF anchor: types that no map or global names directly (enums, the ring
 * buffer sample, the inner trie's value) are referenced here so clang emits
 * their full BTF, which bpf2go turns into Go types and the loader needs to
 * create inner maps. Never read. */
struct eg_btf_anchor {
	enum eg_action action;
	enum eg_reason reason;
	enum eg_mode mode;
	enum eg_clock clock;
	enum eg_agg_mode agg_mode;
	enum eg_agg_kind agg_kind;
	enum eg_l4_dir l4_dir;
	enum eg_origin origin;
	enum eg_global_slot global_slot;
	enum eg_rule_action rule_action;
	enum eg_sizes sizes;
	struct eg_prefix_val prefix_val;
	struct eg_sample sample;
	enum eg_standing standing;
	enum eg_standing_why standing_why;
	enum eg_class cls;
	enum eg_class_agg class_agg;
	enum eg_class_outcome class_outcome;
	enum eg_standing_event standing_event;
	enum eg_shifts shifts;
	enum eg_l4_proto_bit l4_proto_bit;
	enum eg_expiry expiry;
	enum eg_v4_mark v4_mark;
	enum eg_gate gate;
	enum eg_sample_kind sample_kind;
	enum eg_fp_field fp_field;
	enum eg_table_defaults table_defaults;
};
volatile const struct eg_btf_anchor eg_btf_anchor;

struct verdict {
	__u32 action;
	__u32 reason;
	__u32 rule_slot;
	__u32 asn;
	__u8 counted_rule;
	__u8 gen;     /* the live generation, once known */
	/* Drop samples: EG_CO_REFUSED_* of the refusing aggregate (low
	 * nibble) and its enum eg_class_agg (high nibble): one byte, as a
	 * separate one would take the stack past 512 bytes. */
	__u8 refused;
	__u8 cls; /* drop samples: the source's class at that aggregate */
};
_Static_assert(EG_CO_MAX <= 16 && EG_CAGG_MAX <= 16, "verdict.refused packs both in a byte");

/* now_ticks reads the generation's clock (enum eg_clock). Both are
 * CLOCK_MONOTONIC, so a policy change from one to the other moves time by
 * at most a few ticks: back (precise to coarse) only delays admissions. */
static __always_inline __u64 now_ticks(const struct eg_config *cfg)
{
	__u64 ns;

	if (eg_test_clock) {
		__u32 zero = 0;
		__u64 *t = bpf_map_lookup_elem(&test_clock, &zero);

		/* Never NULL (an array's key 0). Not 0 either: a known zero
		 * would make the verifier walk the whole program twice, once
		 * with now == 0, which is every exit's "no clock" value. */
		ns = t ? *t : bpf_ktime_get_ns();
	} else if (cfg->clock == EG_CLOCK_COARSE) {
		ns = bpf_ktime_get_coarse_ns();
	} else {
		ns = bpf_ktime_get_ns();
	}
	return ns << EG_TICK_SHIFT;
}

static __always_inline void count(__u32 ifindex, __u32 action, __u32 reason, __u32 len)
{
	__u32 *slotp = bpf_map_lookup_elem(&iface_slots, &ifindex);
	__u32 slot = slotp && *slotp < EG_IFACE_SLOTS ? *slotp : 0;
	__u32 idx = (slot * EG_ACT_MAX + action) * EG_R_MAX + reason;
	struct eg_counter *c = bpf_map_lookup_elem(&stats, &idx);

	if (c) {
		c->packets++;
		c->bytes += len;
	}
}

static __always_inline void count_rule(__u32 rule_slot, __u32 action, __u32 len)
{
	struct eg_rule_counters *rc = bpf_map_lookup_elem(&rule_stats, &rule_slot);

	if (rc && action < EG_ACT_MAX) {
		rc->by_action[action].packets++;
		rc->by_action[action].bytes += len;
	}
}

static __always_inline void fill_sample(struct eg_sample *s, const struct verdict *v, const struct pkt_info *pi,
					__u64 now, __u32 kind, __u32 weight)
{
	s->ktime_ns = now >> EG_TICK_SHIFT;
	__builtin_memcpy(s->addr, pi->addr, 16);
	s->asn = v->asn;
	s->rule_slot = v->rule_slot;
	s->len = pi->len > 0xffff ? 0xffff : pi->len;
	s->sport = pi->sport;
	s->dport = pi->dport;
	s->proto = pi->proto;
	s->reason = v->reason;
	s->action = v->action;
	s->kind = kind;
	s->ttl = pi->ttl;
	s->tcp_flags = pi->tcp_flags;
	s->ip_len = pi->ip_len;
	s->refused = v->refused & 0xf;
	s->refused_agg = v->refused >> 4;
	s->cls = v->cls;
	s->weight = weight;
	s->has_rule = v->counted_rule;
}

/* copy_frame copies the frame's first bytes, at most EG_SNAP_LEN of its len
 * (the linear part, data_end - data), to dst and returns how many (0: none
 * copied). bpf_xdp_load_bytes rather than a loop over packet pointers: one
 * helper call, and nothing for the verifier to unroll. */
static __always_inline __u16 copy_frame(struct xdp_md *ctx, __u8 *dst, __u32 len)
{
	__u32 n = len < EG_SNAP_LEN ? len : EG_SNAP_LEN;

	_Static_assert((EG_SNAP_LEN & (EG_SNAP_LEN - 1)) == 0, "EG_SNAP_LEN must be a power of two");
	if (n == 0)
		return 0;
	/* n is 1..EG_SNAP_LEN. Say so in a form every verifier follows (6.1
	 * learns no lower bound from n != 0: "size=0"), behind a barrier so
	 * clang neither folds it away nor passes another register holding
	 * len (which the verifier sees unbounded). */
	asm volatile("" : "+r"(n));
	n = ((n - 1) & (EG_SNAP_LEN - 1)) + 1;
	if (bpf_xdp_load_bytes(ctx, 0, dst, n))
		return 0;
	return n;
}

/* eg_frame_copy copies the packet's first bytes to this CPU's frame_scratch,
 * for the sample about to be sent (take_frame). Global: verified once, on
 * its own, so the copy's variable length ties no state of the main program
 * to the frame's length (copied inline at the drop sample, that made the
 * verifier walk twice the instructions). Called only for a packet chosen
 * for a sample. */
__attribute__((noinline)) int eg_frame_copy(struct xdp_md *ctx)
{
	struct eg_frame_scratch *f;
	__u32 zero = 0;

	f = bpf_map_lookup_elem(&frame_scratch, &zero);
	if (!f)
		return 0;
	f->len = copy_frame(ctx, f->data, ctx->data_end - ctx->data);
	return 0;
}

/* take_frame puts the bytes eg_frame_copy took of this packet into s. The
 * scratch is this CPU's and written just before, within the same packet. */
static __always_inline void take_frame(struct eg_sample *s)
{
	struct eg_frame_scratch *f;
	__u32 zero = 0;

	f = bpf_map_lookup_elem(&frame_scratch, &zero);
	s->cap_len = 0;
	if (f && f->len <= EG_SNAP_LEN) {
		__builtin_memcpy(s->frame, f->data, EG_SNAP_LEN);
		s->cap_len = f->len;
	}
}

/* sample sends a drop sample to user space, within its own budget so a flood
 * cannot flood the ring buffer or the reader. */
static __always_inline void sample(struct xdp_md *ctx, const struct verdict *v, const struct pkt_info *pi,
				   const struct eg_config *cfg, __u64 now)
{
	__u32 slot = EG_SAMPLE_BUCKET;
	struct eg_bucket *b;
	struct eg_sample *s;

	if (!cfg || !cfg->sample.pkt_t)
		return;
	b = bpf_map_lookup_elem(&global_buckets, &slot);
	if (!b || !gcra_take(&b->pkt_tat, now, cfg->sample.pkt_t, cfg->sample.pkt_tau))
		return;
	/* The bytes only for a packet the budget admits (and before the
	 * reservation: no call while a ring buffer record is held). */
	eg_frame_copy(ctx);
	s = bpf_ringbuf_reserve(&samples, sizeof(*s), 0);
	if (!s)
		return;
	fill_sample(s, v, pi, now, EG_SAMPLE_DROP, 0);
	take_frame(s);
	bpf_ringbuf_submit(s, 0);
}

/* eg_rand is the next 32 random bits of this CPU's random state (st is its
 * rate_sample_stats slot): the top half of a 64-bit linear congruential
 * sequence (Knuth's MMIX multiplier, increment 1: period 2^64, so over a
 * period every 32-bit value comes out equally often), seeded from
 * bpf_get_prandom_u32 on the CPU's first draw. Inline and a few
 * instructions: no helper call per packet (a call's return costs a
 * misprediction on this kind of host, ~8 ns). */
static __always_inline __u32 eg_rand(struct eg_rsample_stats *st)
{
	__u64 x = st->rng;

	if (!x)
		x = (__u64)bpf_get_prandom_u32() << 32 | bpf_get_prandom_u32();
	x = x * 6364136223846793005ULL + 1;
	st->rng = x;
	return x >> 32;
}

/* eg_rate_sample is the 1-in-N sampler (docs/operations.md, "Sampling"):
 * every packet of a live generation, passed or dropped, is chosen with
 * probability thresh / 2^32 (1/one_in, exact to 2^-32), drawn in finish()
 * (eg_rand), which calls this only for a chosen packet; a chosen packet is
 * sent within the cap, a GCRA bucket shared by all CPUs. A chosen packet
 * that cannot be sent (cap, ring buffer full) adds its weight to this
 * CPU's next sample, so the weights still sum to an unbiased estimate of
 * the packets seen. Global: verified once, whatever the number of exits. */
__attribute__((noinline)) int eg_rate_sample(__u64 a1, __u64 a2, __u64 hi, __u64 lo, __u64 ids)
{
	/* Scalars only, not pointers to the caller's stack: passing those
	 * would make the verifier walk every exit's state again. */
	struct verdict v = { .action = a1 & 0xff, .reason = (a1 >> 8) & 0xff, .gen = (a1 >> 16) & 1,
			     .counted_rule = (a1 >> 17) & 1, .refused = a1 >> 48, .cls = a1 >> 56, .rule_slot = ids, .asn = ids >> 32 };
	struct pkt_info p = { .proto = a1 >> 24, .ttl = a1 >> 32, .tcp_flags = a1 >> 40, .sport = a2,
			      .dport = a2 >> 16, .ip_len = a2 >> 32, .len = a2 >> 48 };
	struct eg_rsample_stats *st;
	struct eg_sample_cfg *scfg;
	struct eg_bucket *b;
	struct eg_sample *s;
	__u32 zero = 0, gen = v.gen;
	__u64 w, now, *t;

	scfg = bpf_map_lookup_elem(&sample_cfgs, &gen);
	if (!scfg || !scfg->thresh)
		return 0;
	st = bpf_map_lookup_elem(&rate_sample_stats, &zero);
	if (!st)
		return 0;
	st->chosen++;
	st->pending++;
	/* The sampler's own clock: the test clock, or CLOCK_MONOTONIC. */
	if (eg_test_clock) {
		t = bpf_map_lookup_elem(&test_clock, &zero);
		now = (t ? *t : 0) << EG_TICK_SHIFT;
	} else {
		now = bpf_ktime_get_ns() << EG_TICK_SHIFT;
	}
	b = bpf_map_lookup_elem(&rate_sample_cap, &zero);
	if (!b || !gcra_take(&b->pkt_tat, now, scfg->cap.pkt_t, scfg->cap.pkt_tau)) {
		st->capped++;
		return 0;
	}
	s = bpf_ringbuf_reserve(&rate_samples, sizeof(*s), 0);
	if (!s) {
		st->lost++;
		return 0;
	}
	__builtin_memcpy(p.addr, &hi, 8);
	__builtin_memcpy(p.addr + 8, &lo, 8);
	w = st->pending * scfg->one_in;
	fill_sample(s, &v, &p, now, EG_SAMPLE_RATE, w > 0xffffffff ? 0xffffffff : w);
	take_frame(s); /* eg_frame_copy ran just before the call */
	bpf_ringbuf_submit(s, 0);
	st->sent++;
	st->pending = 0;
	return 0;
}

/* finish is the one exit: it records the verdict and turns it into an XDP
 * action. */
static __always_inline int finish(struct xdp_md *ctx, const struct verdict *v, const struct pkt_info *pi,
				  const struct eg_config *cfg, __u64 now)
{
	int ret = v->action == EG_ACT_DROP ? XDP_DROP : XDP_PASS;

	count(ctx->ingress_ifindex, v->action, v->reason, pi->len);
	if (v->counted_rule)
		count_rule(v->rule_slot, v->action, pi->len);
	if (v->action != EG_ACT_PASS && v->reason != EG_R_DENY_LIST && now)
		sample(ctx, v, pi, cfg, now);
	if (now) {
		struct eg_rsample_stats *st;
		struct eg_sample_cfg *scfg;
		__u32 zero = 0, gen = v->gen;
		__u64 hi, lo;

		/* The draw here, the call only for a chosen packet. With
		 * sampling off (thresh 0) nothing is chosen; drawing anyway is
		 * a few instructions and one branch fewer for the verifier to
		 * follow at every exit. */
		scfg = bpf_map_lookup_elem(&sample_cfgs, &gen);
		st = bpf_map_lookup_elem(&rate_sample_stats, &zero);
		if (!scfg || !st || eg_rand(st) >= scfg->thresh)
			return ret;
		__builtin_memcpy(&hi, pi->addr, 8);
		__builtin_memcpy(&lo, pi->addr + 8, 8);
		eg_frame_copy(ctx);
		eg_rate_sample(v->action | v->reason << 8 | (__u64)v->gen << 16 | (__u64)v->counted_rule << 17 |
				       (__u64)pi->proto << 24 |
				       (__u64)pi->ttl << 32 | (__u64)pi->tcp_flags << 40 | (__u64)v->refused << 48 |
				       (__u64)v->cls << 56,
			       pi->sport | (__u64)pi->dport << 16 | (__u64)pi->ip_len << 32 | (__u64)pi->len << 48, hi,
			       lo, v->rule_slot | (__u64)v->asn << 32);
	}
	return ret;
}

/* mask_addr keeps the first len bits (0-128) of a 16-byte address. */
static __always_inline void mask_addr(__u8 *dst, const __u8 *src, __u32 len)
{
	__u64 hi, lo;

	__builtin_memcpy(&hi, src, 8);
	__builtin_memcpy(&lo, src + 8, 8);
	hi = __builtin_bswap64(hi);
	lo = __builtin_bswap64(lo);
	if (len == 0) {
		hi = 0;
		lo = 0;
	} else if (len < 64) {
		hi &= ~((1ULL << (64 - len)) - 1);
		lo = 0;
	} else if (len == 64) {
		lo = 0;
	} else if (len < 128) {
		lo &= ~((1ULL << (128 - len)) - 1);
	}
	hi = __builtin_bswap64(hi);
	lo = __builtin_bswap64(lo);
	__builtin_memcpy(dst, &hi, 8);
	__builtin_memcpy(dst + 8, &lo, 8);
}

static __always_inline __u32 l4_proto_bit(__u8 proto)
{
	switch (proto) {
	case IPPROTO_TCP:
		return EG_L4P_TCP;
	case IPPROTO_UDP:
		return EG_L4P_UDP;
	case IPPROTO_ICMP:
		return EG_L4P_ICMP;
	case IPPROTO_ICMPV6:
		return EG_L4P_ICMPV6;
	}
	return 0;
}

/* l4_rule finds a rule matching protocol and ports: source port first (the
 * reflection case), then destination port, then the protocol alone. */
static __always_inline int l4_rule(const struct pkt_info *pi, __u32 gen, __u32 *rule_slot)
{
	struct eg_l4_key k = { .gen = gen, .proto = pi->proto };
	__u32 *id;

	if (pi->has_l4) {
		k.dir = EG_L4_SRC;
		k.port = pi->sport;
		id = bpf_map_lookup_elem(&l4_rules, &k);
		if (id)
			goto found;
		k.dir = EG_L4_DST;
		k.port = pi->dport;
		id = bpf_map_lookup_elem(&l4_rules, &k);
		if (id)
			goto found;
	}
	k.dir = EG_L4_ANY;
	k.port = 0;
	id = bpf_map_lookup_elem(&l4_rules, &k);
	if (!id)
		return 0;
found:
	*rule_slot = *id;
	return 1;
}

/* v4_direct_lookup answers the prefix-facts question for an IPv4 source
 * from the generation's direct table: the level-1 entry of its /16, then
 * one 16-entry chunk per 4 bits for as long as the entry points further
 * down, at most EG_V4_LEVELS chunks. The cost is one to five array loads
 * whatever the number of facts, where the trie walks one node per bit that
 * discriminates. Bounds are checked by the array lookups, so a damaged
 * table can only give a wrong answer, never an out-of-bounds read. */
static __always_inline void v4_direct_lookup(__u32 gen, const __u8 *addr, struct verdict *v)
{
	struct eg_v4_entry *e;
	__u32 a, idx;

	__builtin_memcpy(&a, addr + 12, 4);
	a = bpf_ntohl(a);
	idx = (gen << EG_V4_L1_BITS) | (a >> (32 - EG_V4_L1_BITS));
	e = bpf_map_lookup_elem(&v4_l1, &idx);
#pragma unroll
	for (int i = 0; i < EG_V4_LEVELS; i++) {
		if (!e || e->rule_slot != EG_V4_CHILD)
			break;
		idx = e->asn * EG_V4_CHUNK_ENTRIES +
		      ((a >> (32 - EG_V4_L1_BITS - EG_V4_STRIDE * (i + 1))) & (EG_V4_CHUNK_ENTRIES - 1));
		e = bpf_map_lookup_elem(&v4_chunks, &idx);
	}
	if (e && e->rule_slot != EG_V4_CHILD) {
		v->rule_slot = e->rule_slot;
		v->asn = e->asn;
	}
}

/* agg_derived_key keys a derived-prefix aggregate: the source masked to the
 * rule's aggregate length. (Whole aggregates are not keyed: whole_buckets.) */
static __always_inline void agg_derived_key(struct eg_agg_key *k, const struct eg_rule *r, const struct pkt_info *pi,
					    int v4)
{
	__u32 len = v4 ? 96 + (r->agg_len4 > 32 ? 32 : r->agg_len4) : (r->agg_len6 > 128 ? 128 : r->agg_len6);

	__builtin_memset(k, 0, sizeof(*k));
	k->rule_id = r->id;
	k->kind = EG_AGG_KIND_PREFIX;
	mask_addr(k->addr, pi->addr, len);
	k->len = len;
}

static __always_inline void agg_asn_key(struct eg_agg_key *k, const struct eg_rule *r, __u32 asn)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->rule_id = r->id;
	k->kind = EG_AGG_KIND_ASN;
	k->asn = asn;
}

/* lookup_or_create finds a bucket, inserting a fresh (full) one if absent.
 * A concurrent insert by another CPU wins; we use theirs. */
static __always_inline struct eg_bucket *lookup_or_create(void *map, const void *key)
{
	struct eg_bucket *b = bpf_map_lookup_elem(map, key);
	struct eg_bucket fresh = {};

	if (b)
		return b;
	bpf_map_update_elem(map, key, &fresh, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, key);
}

/* key_hash mixes the 32-bit words of a bucket key (FNV-1a per word, then a
 * murmur3 finalizer). internal/refmodel mirrors it. */
static __always_inline __u32 key_hash(const __u32 *w, int n)
{
	__u32 h = 0x811c9dc5;

#pragma unroll
	for (int i = 0; i < 8; i++) {
		if (i < n)
			h = (h ^ w[i]) * 0x01000193;
	}
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	return h;
}

/* The new-source filter keeps spoofed floods from churning the LRU tables
 * and from costing a table lookup per packet. Each key (a source, or a
 * derived prefix such as a /24) hashes to two bits in each of two sets of a
 * 64-bit word: the marks of the word's epoch (~1 s, EG_SEEN_EPOCH_SHIFT)
 * and those of the epoch before; a word last written in an older epoch
 * reads as empty, one written in the previous epoch as "previous only".
 *
 * seen_mark answers, and marks the key in the current set:
 *  - EG_SEEN_ACTIVE: marked in the previous epoch (the key was active, or
 *    its deferred charge was settled): look its bucket up as usual;
 *  - EG_SEEN_DEFERRED: marked only in this epoch: its first packet here
 *    went through without a bucket lookup, and is still to be charged;
 *  - EG_SEEN_NEW: marked in neither.
 * With settle, a DEFERRED key is also marked in the previous set, so its
 * deferred charge is made once. The word is written with a plain store,
 * not a compare-and-swap (whose locked instruction cost ~15 ns a packet
 * here): two CPUs writing one word at the same instant can lose one's
 * marks, which costs at most one more deferred (or doubly settled) charge
 * per lost mark, as a failed compare-and-swap without retry would.
 * Keys whose bits collide share marks: a new key may be taken for a seen
 * one (it gets a bucket a packet early), or a deferred charge may be
 * settled by another key (one packet stays uncharged). */
enum eg_seen {
	EG_SEEN_NEW = 0,
	EG_SEEN_DEFERRED = 1,
	EG_SEEN_ACTIVE = 2,
};

static __always_inline int seen_mark(const __u32 *w, int n, __u64 now, int settle, int *first)
{
	__u32 h = key_hash(w, n);
	__u32 idx = (h >> 6) & eg_seen_mask;
	__u64 epoch = ((now >> EG_TICK_SHIFT) >> EG_SEEN_EPOCH_SHIFT) & 0xff;
	/* Two bits per key in each set (a one-word Bloom filter with k = 2):
	 * a new key is taken for a marked one about occupancy^2 of the time,
	 * not occupancy, and it is still one memory access. */
	__u64 bit = (1ULL << ((h & 63) % EG_SEEN_BITS)) | (1ULL << (((h * 0x9e3779b1U) >> 26) % EG_SEEN_BITS));
	__u64 mask = (1ULL << EG_SEEN_BITS) - 1;
	__u64 *word = bpf_map_lookup_elem(&seen_filter, &idx);
	__u64 old, tag, cur = 0, prev = 0, ncur, nprev;
	int state;

	if (!word)
		return EG_SEEN_ACTIVE;
	old = *(volatile __u64 *)word;
	tag = old >> (2 * EG_SEEN_BITS);
	if (tag == epoch) {
		cur = (old >> EG_SEEN_BITS) & mask;
		prev = old & mask;
	} else if (((tag + 1) & 0xff) == epoch) {
		prev = (old >> EG_SEEN_BITS) & mask;
	}
	state = (prev & bit) == bit ? EG_SEEN_ACTIVE : (cur & bit) == bit ? EG_SEEN_DEFERRED : EG_SEEN_NEW;
	ncur = cur | bit;
	nprev = prev;
	if (settle && state == EG_SEEN_DEFERRED)
		nprev |= bit;
	if (tag != epoch || ncur != cur || nprev != prev)
		*(volatile __u64 *)word = (epoch << (2 * EG_SEEN_BITS)) | (ncur << EG_SEEN_BITS) | nprev;
	/* The key's first packet of this epoch: standing's once-per-epoch
	 * update rides on it (standing_touch, without a second word). */
	*first = (cur & bit) != bit;
	return state;
}

/* gated is whether a bucket's creation goes through the new-source filter:
 * only for packet limits faster than one per epoch, so that a source
 * sending one packet per epoch (below any such limit anyway) is the most
 * that escapes its bucket. */
static __always_inline int gated(const struct eg_bucket_cfg *cfg)
{
	return cfg->pkt_t && cfg->pkt_t < (1ULL << (EG_SEEN_EPOCH_SHIFT + EG_TICK_SHIFT));
}

/* create_charged inserts a bucket that already holds the charge of the
 * packet that marked its key in the filter (taken to be this packet's
 * size), so a burst at one instant is admitted exactly as without the
 * filter. */
static __always_inline struct eg_bucket *create_charged(void *map, const void *key, const struct eg_bucket_cfg *cfg,
							 __u64 now, __u32 len)
{
	struct eg_bucket fresh = {};

	if (cfg->pkt_t)
		fresh.pkt_tat = now + cfg->pkt_t;
	if (cfg->byte_t)
		fresh.byte_tat = now + byte_cost(cfg, len);
	bpf_map_update_elem(map, key, &fresh, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, key);
}

/* src_create_charged is create_charged for src_buckets (whose value also
 * counts packets); src_lookup_or_create is lookup_or_create for it. */
static __always_inline struct eg_src_bucket *src_create_charged(const void *key, const struct eg_bucket_cfg *cfg,
								__u64 now, __u32 len)
{
	struct eg_src_bucket fresh = {};

	if (cfg->pkt_t)
		fresh.b.pkt_tat = now + cfg->pkt_t;
	if (cfg->byte_t)
		fresh.b.byte_tat = now + byte_cost(cfg, len);
	bpf_map_update_elem(&src_buckets, key, &fresh, BPF_NOEXIST);
	return bpf_map_lookup_elem(&src_buckets, key);
}

static __always_inline struct eg_src_bucket *src_lookup_or_create(const void *key)
{
	struct eg_src_bucket *b = bpf_map_lookup_elem(&src_buckets, key);
	struct eg_src_bucket fresh = {};

	if (b)
		return b;
	bpf_map_update_elem(&src_buckets, key, &fresh, BPF_NOEXIST);
	return bpf_map_lookup_elem(&src_buckets, key);
}

/* ---- Standing and the reserve (docs/operations.md, "Standing") ----
 *
 * Every aggregate bucket (prefix, whole, ASN, global; the buckets of
 * country and L4 rules are the same buckets of their rules) has two
 * tolerances in its one GCRA word: new and penalised sources may fill it to
 * tau - reserve, established and validated sources to tau. A packet that
 * fits below the band is admitted without asking who sent it, so an
 * uncongested aggregate costs what it did; only a packet that meets the
 * band looks up its source's standing. Either way one CAS charges it, and
 * the aggregate never passes more than tau allows. */

/* Whether the packet is its source's first of the epoch, when the
 * per-source filter already knows (touched in xdp_limiter). */
enum {
	EG_TOUCH_UNKNOWN = 0,
	EG_TOUCH_FIRST = 1,
	EG_TOUCH_NO = 2,
};

/* What eg_standing_update is told. */
enum {
	EG_UPD_ADMITTED = 0,  /* admitted */
	EG_UPD_OWN_LIMIT = 1, /* refused by its own limit */
};

/* One refusal by a source's own limit in EG_PENALTY_SAMPLE (at random)
 * looks at its standing, at most once per epoch: a source over its limit
 * is penalised after EG_PENALTY_SAMPLE refusals on average, and the drop
 * path of a source over its limit stays as cheap as it was. Programs on
 * the test clock look at every refusal. */
#define EG_PENALTY_SAMPLE 16

/* What the standing functions need of a packet, and what they found. The
 * functions below that take it are global (verified once each, not once per
 * call site), so it holds copies, not pointers, and a BPF function takes at
 * most five arguments. */
struct src_state {
	__u64 now;     /* ticks */
	__u8 addr[16]; /* the source, 16-byte form */
	__u32 len;
	__u32 gen;
	__u8 v4;
	__u8 looked;          /* EG_SS_*: cls is valid, and the rate's flags */
	__u8 cls;             /* enum eg_class */
	__u8 congested;       /* an aggregate on the path is congested */
	__u8 refused_agg;     /* enum eg_class_agg of the refusing bucket */
	__u8 refused_outcome; /* EG_CO_REFUSED_*, 0: not refused by an aggregate */
	__u8 touched;         /* EG_TOUCH_*: first packet of the epoch, if known */
	__u8 tcp;             /* a TCP packet with ports and daddr below */
	__u8 daddr[16];       /* the destination, 16-byte form (TCP only) */
	__u16 sport, dport;   /* host order */
	/* For aggregate overrides and watches (eg_ovr_find, eg_watch_all):
	 * the rule's gate word, and what keys its aggregates. */
	__u32 gate;
	__u32 rule_id; /* the rule's id (not its slot) */
	__u32 asn;
	__u8 agg_mode;
	__u8 agg_len4, agg_len6; /* the rule's */
	/* For fingerprints (eg_fingerprint). */
	__u8 proto, ttl, tcp_flags;
	/* The reason an override gives the refusal (EG_R_SHIELD_TIGHTEN,
	 * ...), 0: the aggregate's own (padding before). */
	__u8 refused_reason;
	__u16 ip_len;
};

/* Bits of src_state.looked (one byte: the stack is full). For the usual
 * rate (fold_rate): SRCKEY, the rule's per-source key is the standing key
 * (/32, /64), so its bucket counts the source's packets; COUNTED, this
 * packet is already counted (at its bucket or at its standing lookup);
 * JUMPED, its standing entry says jumped (valid with LOOKED). */
enum {
	EG_SS_LOOKED = 1,
	EG_SS_COUNTED = 2,
	EG_SS_JUMPED = 4,
	EG_SS_SRCKEY = 8,
};

/* reserve_cut is tau * reserve / 65536, without overflow. */
static __always_inline __u64 reserve_cut(__u64 tau, __u16 reserve)
{
	return (tau >> 16) * reserve + (((tau & 0xffff) * reserve) >> 16);
}

static __always_inline int privileged(__u32 cls)
{
	return cls == EG_CLASS_ESTABLISHED || cls == EG_CLASS_VALIDATED;
}

/* handshake_only: validated by a TCP handshake (ours or a SYN cookie's)
 * and nothing else. A handshake proves the address, not good intent
 * (docs/operations.md, "Class ranking"): such a source ranks as new, and
 * its history goes on counting toward established. */
static __always_inline int handshake_only(const struct eg_standing_val *e)
{
	return e->standing == EG_STANDING_VALIDATED && e->why == EG_WHY_TCP_HANDSHAKE;
}

/* personal_take charges one packet to a privileged source's personal
 * budget (docs/operations.md, "Personal budget"): 1 within it, 0 over it
 * (the packet is then charged as new). The rate is headroom x its mean
 * rate, or the default budget when it has not been measured yet (mean_w
 * 0); a vouched source
 * (known_good, validated) gets at least the default. The burst is its
 * busiest seconds: its usual rate (a decayed peak over windows of at least
 * an epoch) x standing.personal_budget.burst_seconds, at least one second of the budget
 * and one packet. Both
 * from the entry
 * as it is: nothing is measured here. */
static __always_inline int personal_take(struct eg_standing_val *e, const struct eg_standing_cfg *scfg, __u64 now,
					 int vouched)
{
	__u64 rate = ((__u64)e->mean * scfg->headroom16) >> 4, burst, t, tau;

	if (!scfg->headroom16)
		return 1;
	if (!e->mean_w || (vouched && rate < scfg->default_rate))
		rate = scfg->default_rate;
	if (!rate)
		rate = 1;
	/* The burst in 1/16 packets: its busiest seconds, at least one
	 * second of the budget and one packet. */
	burst = (__u64)e->usual * scfg->burst_seconds;
	if (burst < rate)
		burst = rate;
	if (burst < (1 << EG_RATE_SHIFT))
		burst = 1 << EG_RATE_SHIFT;
	if (burst > (1ULL << 28))
		burst = 1ULL << 28;
	/* Ticks per packet (rate is packets/s << EG_RATE_SHIFT), and the
	 * tolerance: burst packets' worth. */
	t = ((1000000000ULL << EG_TICK_SHIFT) << EG_RATE_SHIFT) / rate;
	tau = burst * (1000000000ULL << EG_TICK_SHIFT) / rate;
	return gcra_take(&e->budget_tat, now, t, tau);
}

static __always_inline void standing_key(struct eg_standing_key *k, const struct src_state *ss)
{
	mask_addr(k->addr, ss->addr, ss->v4 ? 128 : 64);
}

/* source_class looks the source's standing up once per packet: its entry,
 * else standing.known_good (established), else new. A penalty that is over
 * counts as new already (the entry itself changes at its next update). A
 * new source met in a reserve band (reset) starts its clean history over:
 * history gathered while congested does not count. A source validated by
 * a handshake only is new. A privileged source (established, validated,
 * known_good) with an entry is charged to its personal budget: over it,
 * this packet's class is over_budget, charged as new. A known_good source
 * without an entry (its very first packet: its entry is made when it is
 * admitted) is not metered. */
static __always_inline __u32 source_class(struct src_state *ss, int reset)
{
	struct eg_standing_cfg *scfg;
	struct eg_standing_val *e;
	struct eg_standing_key k;
	struct eg_lpm_key lk;
	__u32 cls = EG_CLASS_NEW, gen = ss->gen;
	int vouched = 0;

	if (ss->looked & EG_SS_LOOKED)
		return ss->cls;
	ss->looked |= EG_SS_LOOKED;
	scfg = bpf_map_lookup_elem(&standing_cfg, &gen);
	standing_key(&k, ss);
	e = bpf_map_lookup_elem(&standing, &k);
	if (e) {
		/* A packet looked up before it reaches its bucket (an override's
		 * new-source bucket or a reserve band may refuse it there) is
		 * counted here, so that the rate a jumped source is measured
		 * at includes what the shield refuses. */
		if (!(ss->looked & EG_SS_COUNTED)) {
			e->pkts++;
			ss->looked |= EG_SS_COUNTED;
		}
		if (e->jumped)
			ss->looked |= EG_SS_JUMPED;
		switch (e->standing) {
		case EG_STANDING_ESTABLISHED:
			cls = EG_CLASS_ESTABLISHED;
			break;
		case EG_STANDING_VALIDATED:
			if (!handshake_only(e)) {
				cls = EG_CLASS_VALIDATED;
				vouched = 1;
				break;
			}
			if (reset)
				e->clean_since = ss->now >> EG_TICK_SHIFT;
			break;
		case EG_STANDING_PENALISED:
			cls = EG_CLASS_PENALISED;
			if (scfg && (ss->now >> EG_TICK_SHIFT) - e->since >= scfg->penalty_ns)
				cls = EG_CLASS_NEW;
			break;
		default:
			if (reset)
				e->clean_since = ss->now >> EG_TICK_SHIFT;
		}
	}
	if (cls == EG_CLASS_NEW) {
		lk.prefixlen = 128;
		__builtin_memcpy(lk.addr, ss->addr, 16);
		if (bpf_map_lookup_elem(&known_good, &lk)) {
			cls = EG_CLASS_ESTABLISHED;
			vouched = 1;
		}
	}
	if (privileged(cls) && e && scfg && !personal_take(e, scfg, ss->now, vouched))
		cls = EG_CLASS_OVER_BUDGET;
	ss->cls = cls;
	return cls;
}

static __always_inline void count_class(__u32 dry, __u32 agg, __u32 cls, __u32 outcome, __u32 len)
{
	__u32 idx = ((dry * EG_CAGG_MAX + agg) * EG_CLASS_MAX + cls) * EG_CO_MAX + outcome;
	struct eg_counter *c = bpf_map_lookup_elem(&class_stats, &idx);

	if (c) {
		c->packets++;
		c->bytes += len;
	}
}

/* bucket_would_admit_r is bucket_would_admit with the reserve taken off
 * both tolerances. */
static __always_inline int bucket_would_admit_r(const struct eg_bucket *b, const struct eg_bucket_cfg *cfg,
						__u64 now, __u32 len, __u16 reserve)
{
	if (cfg->pkt_t &&
	    !gcra_would_admit(&b->pkt_tat, now, cfg->pkt_t, cfg->pkt_tau - reserve_cut(cfg->pkt_tau, reserve)))
		return 0;
	if (cfg->byte_t && !gcra_would_admit(&b->byte_tat, now, byte_cost(cfg, len),
					     cfg->byte_tau - reserve_cut(cfg->byte_tau, reserve)))
		return 0;
	return 1;
}

/* bucket_take_r is bucket_take with the reserve taken off both
 * tolerances: one CAS per dimension, as before. */
static __always_inline int bucket_take_r(struct eg_bucket *b, const struct eg_bucket_cfg *cfg, __u64 now, __u32 len,
					 __u16 reserve)
{
	if (cfg->pkt_t && !gcra_take(&b->pkt_tat, now, cfg->pkt_t, cfg->pkt_tau - reserve_cut(cfg->pkt_tau, reserve)))
		return 0;
	if (cfg->byte_t && !gcra_take(&b->byte_tat, now, byte_cost(cfg, len),
				      cfg->byte_tau - reserve_cut(cfg->byte_tau, reserve))) {
		if (cfg->pkt_t)
			gcra_refund(&b->pkt_tat, cfg->pkt_t);
		return 0;
	}
	return 1;
}

/* congested_after says whether a bucket that just admitted a packet is
 * congested: filled past half the new-source tolerance. Under a flood the
 * new class keeps it at that tolerance; in normal traffic it stays near
 * empty. History gathered while congested does not count toward standing. */
static __always_inline int congested_after(const struct eg_bucket *b, const struct eg_bucket_cfg *cfg, __u64 now,
					   __u16 reserve)
{
	__u64 tat;

	if (cfg->pkt_t) {
		tat = *(volatile const __u64 *)&b->pkt_tat;
		if (tat > now && tat - now > (cfg->pkt_tau - reserve_cut(cfg->pkt_tau, reserve)) / 2)
			return 1;
	}
	if (cfg->byte_t) {
		tat = *(volatile const __u64 *)&b->byte_tat;
		if (tat > now && tat - now > (cfg->byte_tau - reserve_cut(cfg->byte_tau, reserve)) / 2)
			return 1;
	}
	return 0;
}

/* ---- Aggregate overrides and watches (docs/operations.md, "Aggregate
 * overrides") ----
 *
 * A packet of a limit rule reads its slot's agg_gate word into ss->gate
 * (one array load). Zero, the usual case, costs nothing more: the checks
 * below sit inside the aggregate functions, which are verified once, so
 * the main program gains no branches. A set bit makes eg_agg_peek and
 * eg_agg_take look that aggregate's override up (one hash lookup each),
 * or eg_watch_all count the packet in the instance's counters. */

static __always_inline __u32 agg_kind_of(__u32 agg, const struct src_state *ss)
{
	if (agg == EG_CAGG_GLOBAL)
		return EG_AGG_KIND_GLOBAL;
	if (agg == EG_CAGG_ASN)
		return EG_AGG_KIND_ASN;
	return ss->agg_mode == EG_AGG_DERIVED ? EG_AGG_KIND_PREFIX : EG_AGG_KIND_WHOLE;
}

/* agg_key_of builds the key of the packet's aggregate of a kind in the
 * per-CPU scratch key (as agg_derived_key and agg_asn_key do). */
static __always_inline struct eg_agg_key *agg_key_of(__u32 kind, const struct src_state *ss)
{
	__u32 zero = 0;
	struct eg_agg_key *k = bpf_map_lookup_elem(&agg_scratch, &zero);

	if (!k)
		return NULL;
	__builtin_memset(k, 0, sizeof(*k));
	k->kind = kind;
	if (kind == EG_AGG_KIND_GLOBAL)
		return k;
	k->rule_id = ss->rule_id;
	if (kind == EG_AGG_KIND_ASN) {
		k->asn = ss->asn;
	} else if (kind == EG_AGG_KIND_PREFIX) {
		/* As agg_derived_key. */
		__u32 len = ss->v4 ? 96 + (ss->agg_len4 > 32 ? 32 : ss->agg_len4)
				   : (ss->agg_len6 > 128 ? 128 : ss->agg_len6);

		k->len = len;
		mask_addr(k->addr, ss->addr, len);
	}
	return k;
}

/* ovr_find: the override of the packet's aggregate agg (enum
 * eg_class_agg), if its gate bit says there may be one. Each part is
 * honoured until its own expiry: callers check o->expires (the budget
 * part, ovr_budget) and o->new_expires (charged_new); the daemon deletes
 * an entry once both have expired. */
static __always_inline struct eg_override *ovr_find(__u32 agg, const struct src_state *ss)
{
	__u32 kind = agg_kind_of(agg, ss);
	struct eg_agg_key *k;

	if (!(ss->gate & (1U << kind)))
		return NULL;
	k = agg_key_of(kind, ss);
	if (!k)
		return NULL;
	return bpf_map_lookup_elem(&overrides, k);
}

/* ovr_budget: the budget in force for an aggregate whose policy budget is
 * cfg: the override's budget part while it has one and it has not
 * expired. */
static __always_inline const struct eg_bucket_cfg *ovr_budget(const struct eg_override *o,
							       const struct eg_bucket_cfg *cfg,
							       const struct src_state *ss)
{
	if (o && o->expires > (ss->now >> EG_TICK_SHIFT) && bucket_limited(&o->budget))
		return &o->budget;
	return cfg;
}

/* charged_new: whether the override's new-source bucket applies to this
 * source: only new and penalised sources are charged by it, and their
 * standing is looked up only here. */
static __always_inline int charged_new(const struct eg_override *o, struct src_state *ss)
{
	__u32 cls;

	if (!o || o->new_expires <= (ss->now >> EG_TICK_SHIFT) || !bucket_limited(&o->new_budget))
		return 0;
	cls = source_class(ss, 0);
	/* An established source whose rate jumped far above its usual one
	 * loses its standing inside an aggregate the shield tightened (and
	 * only there): a patient botnet's surge is charged as new. A
	 * validated source (handshake, L7) keeps it. */
	if (cls == EG_CLASS_ESTABLISHED && (ss->looked & EG_SS_JUMPED) &&
	    (o->origin >> 8 & 0xff) == EG_ORIGIN_SHIELD)
		return 1;
	return !privileged(cls);
}

/* ovr_reason is the drop reason of a refusal an override's part made:
 * named by the part's writer (enum eg_origin). */
static __always_inline __u8 ovr_reason(__u32 origin)
{
	if (origin == EG_ORIGIN_SHIELD)
		return EG_R_SHIELD_TIGHTEN;
	if (origin == EG_ORIGIN_FLEET)
		return EG_R_FLEET_SHARE;
	return EG_R_OVERRIDE;
}

/* eg_watch_all counts a packet that reached the buckets in the counters of
 * each watched aggregate instance on its path, creating them on its first
 * packet. */
__attribute__((noinline)) int eg_watch_all(struct src_state *ss, __u32 passed)
{
	static const struct eg_agg_stats zero_stats;
	struct eg_agg_stats *w;
	struct eg_agg_key *k;
	struct eg_counter *c;

	if (!ss)
		return 0;
#pragma unroll
	for (__u32 kind = EG_AGG_KIND_PREFIX; kind < EG_AGG_KIND_MAX; kind++) {
		if (!(ss->gate & (1U << (EG_GATE_WATCH_SHIFT + kind))))
			continue;
		if (kind == EG_AGG_KIND_ASN && !ss->asn)
			continue;
		if ((kind == EG_AGG_KIND_PREFIX && ss->agg_mode != EG_AGG_DERIVED) ||
		    (kind == EG_AGG_KIND_WHOLE && ss->agg_mode != EG_AGG_WHOLE))
			continue;
		k = agg_key_of(kind, ss);
		if (!k)
			return 0;
		w = bpf_map_lookup_elem(&agg_stats, k);
		if (!w) {
			bpf_map_update_elem(&agg_stats, k, &zero_stats, BPF_NOEXIST);
			w = bpf_map_lookup_elem(&agg_stats, k);
			if (!w)
				continue;
		}
		c = passed ? &w->passed : &w->dropped;
		c->packets++;
		c->bytes += ss->len;
	}
	return 0;
}

/* eg_agg_peek is the look before any charge: 0 when the bucket would
 * refuse this packet (its whole tolerance is used, or the source is new or
 * penalised and the bucket is in its reserve band), recording why in ss.
 * ra is reserve << 8 | enum eg_class_agg. */
__attribute__((noinline)) int eg_agg_peek(const struct eg_bucket *b, const struct eg_bucket_cfg *cfg, __u32 ra,
					  struct src_state *ss)
{
	__u16 reserve = ra >> 8;
	const struct eg_bucket_cfg *pcfg = cfg;
	struct eg_override *o;

	if (!b || !cfg || !ss)
		return 1;
	/* An override's budget replaces the policy's (cfg). */
	o = ovr_find(ra & 0xff, ss);
	cfg = ovr_budget(o, cfg, ss);
	if (charged_new(o, ss) && !bucket_would_admit(&o->new_bucket, &o->new_budget, ss->now, ss->len)) {
		ss->refused_agg = ra & 0xff;
		ss->refused_outcome = EG_CO_REFUSED_FULL;
		ss->refused_reason = ovr_reason(o->origin >> 8 & 0xff);
		return 0;
	}
	if (!bucket_would_admit(b, cfg, ss->now, ss->len)) {
		ss->congested = 1;
		ss->refused_agg = ra & 0xff;
		ss->refused_outcome = EG_CO_REFUSED_FULL;
		if (o && cfg != pcfg)
			ss->refused_reason = ovr_reason(o->origin & 0xff);
		return 0;
	}
	if (reserve && !bucket_would_admit_r(b, cfg, ss->now, ss->len, reserve)) {
		ss->congested = 1;
		if (!privileged(source_class(ss, 1))) {
			ss->refused_agg = ra & 0xff;
			ss->refused_outcome = EG_CO_REFUSED_RESERVE;
			if (o && cfg != pcfg)
				ss->refused_reason = ovr_reason(o->origin & 0xff);
			return 0;
		}
	}
	return 1;
}

/* eg_agg_take_cfg is eg_agg_take's charge with the budget in force. */
static __always_inline int eg_agg_take_cfg(struct eg_bucket *b, const struct eg_bucket_cfg *cfg, __u32 ra,
					   struct src_state *ss)
{
	__u16 reserve = ra >> 8, r;
	__u32 agg = ra & 0xff;
	int band = 0;

	r = reserve;
	if (reserve && !bucket_would_admit_r(b, cfg, ss->now, ss->len, reserve)) {
		/* In the band: only for established and validated sources. */
		ss->congested = 1;
		band = 1;
		if (!privileged(source_class(ss, 1))) {
			ss->refused_agg = agg;
			ss->refused_outcome = bucket_would_admit(b, cfg, ss->now, ss->len) ? EG_CO_REFUSED_RESERVE
											   : EG_CO_REFUSED_FULL;
			return 0;
		}
		r = 0;
	}
	if (!bucket_take_r(b, cfg, ss->now, ss->len, r)) {
		/* Another CPU filled it since the look: a source that was not
		 * looked up loses this packet even if it was established. */
		ss->congested = 1;
		ss->refused_agg = agg;
		ss->refused_outcome = EG_CO_REFUSED_FULL;
		return 0;
	}
	if (band || congested_after(b, cfg, ss->now, reserve)) {
		ss->congested = 1;
		if (reserve) {
			__u32 cls = source_class(ss, 0);

			/* Penalised last (docs/operations.md, "Class ranking"): in a
			 * congested aggregate a penalised source gets nothing, not
			 * even the new sources' share; the charge is given back
			 * (TATs add, so the refund is exact). */
			if (cls == EG_CLASS_PENALISED) {
				if (cfg->pkt_t)
					gcra_refund(&b->pkt_tat, cfg->pkt_t);
				if (cfg->byte_t)
					gcra_refund(&b->byte_tat, byte_cost(cfg, ss->len));
				ss->refused_agg = agg;
				ss->refused_outcome = EG_CO_REFUSED_RESERVE;
				return 0;
			}
			count_class(0, agg, cls, band ? EG_CO_ADMITTED_RESERVE : EG_CO_ADMITTED, ss->len);
		}
	}
	return 1;
}

/* eg_agg_take charges an aggregate, with one CAS per dimension as before:
 * below the band for any source; inside it for established and validated
 * ones, whose standing is looked up only when the bucket is in its band.
 * Returns 0 when refused (why in ss). */
__attribute__((noinline)) int eg_agg_take(struct eg_bucket *b, const struct eg_bucket_cfg *cfg, __u32 ra,
					  struct src_state *ss)
{
	__u32 agg = ra & 0xff;
	const struct eg_bucket_cfg *pcfg;
	struct eg_override *o;
	int fresh;

	if (!b || !cfg || !ss)
		return 1;
	/* An override: its budget replaces the policy's; its new-source
	 * bucket is charged first and given back if the aggregate refuses
	 * (TATs add, so the refund is exact). */
	o = ovr_find(agg, ss);
	pcfg = cfg;
	cfg = ovr_budget(o, cfg, ss);
	fresh = charged_new(o, ss);
	if (fresh && !bucket_take(&o->new_bucket, &o->new_budget, ss->now, ss->len)) {
		ss->refused_agg = agg;
		ss->refused_outcome = EG_CO_REFUSED_FULL;
		ss->refused_reason = ovr_reason(o->origin >> 8 & 0xff);
		return 0;
	}
	if (!eg_agg_take_cfg(b, cfg, ra, ss)) {
		if (o && cfg != pcfg)
			ss->refused_reason = ovr_reason(o->origin & 0xff);
		if (fresh) {
			if (o->new_budget.pkt_t)
				gcra_refund(&o->new_bucket.pkt_tat, o->new_budget.pkt_t);
			if (o->new_budget.byte_t)
				gcra_refund(&o->new_bucket.byte_tat, byte_cost(&o->new_budget, ss->len));
		}
		return 0;
	}
	return 1;
}

/* agg_peek is eg_agg_peek with its common case inline: an aggregate
 * without an override (its gate bit clear) that is full, or that has room
 * below its reserve band, is answered here, as eg_agg_peek would answer
 * it; only an override or a packet in the band pays the call. */
static __always_inline int agg_peek(const struct eg_bucket *b, const struct eg_bucket_cfg *cfg, __u32 ra,
				    struct src_state *ss)
{
	__u16 reserve = ra >> 8;

	if (ss->gate & (1U << agg_kind_of(ra & 0xff, ss)))
		return eg_agg_peek(b, cfg, ra, ss);
	if (!bucket_would_admit(b, cfg, ss->now, ss->len)) {
		ss->congested = 1;
		ss->refused_agg = ra & 0xff;
		ss->refused_outcome = EG_CO_REFUSED_FULL;
		return 0;
	}
	if (reserve && !bucket_would_admit_r(b, cfg, ss->now, ss->len, reserve))
		return eg_agg_peek(b, cfg, ra, ss);
	return 1;
}


/* fp_pre_slots is the prefilter's byte for value v of the field whose
 * region starts at word base and whose values are at most vmask (0xffff,
 * or 0xff for the regions of 32 words). The mask is applied after a
 * barrier, so that the compiler keeps it and every verifier sees the
 * offset bounded: a port the compiler knows is 16 bits (a byte swap's
 * result) is unbounded to kernels before 6.14, which do not track swaps. */
static __always_inline __u32 fp_pre_slots(const struct eg_fp_pre *p, __u32 base, __u32 v, __u32 vmask)
{
	asm volatile("" : "+r"(v));
	v &= vmask;
	return (__u32)(p->w[base + (v >> 3)] >> ((v & 7) * 8)) & 0xff;
}

/* fp_src_index is the prefilter's 16-bit index of a source address
 * (EG_FP_PRE_SRC): the IPv4 address's first 16 bits, or IPv6's first 32
 * folded, each 16 bits read little-endian (no byte swap). A function of
 * the address only (v4: is_v4_mapped_addr of it), whatever the packet's
 * family. Word loads: the address is 4-aligned. */
static __always_inline __u32 fp_src_index(const __u8 *a, int v4)
{
	const __u32 *w = __builtin_assume_aligned(a, 4);
	__u32 x = v4 ? w[3] : w[0];

	return v4 ? x & 0xffff : (x & 0xffff) ^ (x >> 16);
}

/* fp_narrow keeps of cand the slots the field's value may match; none
 * left: no fingerprint can match the packet. */
#define fp_narrow(cand, hdr, h, base, v, vmask)                              \
	do {                                                                 \
		(cand) &= fp_pre_slots(p, (base), (v), (vmask)) | (__u32)(((h) >> (8 * (hdr))) & 0xff); \
		if (!(cand))                                                 \
			return 0;                                            \
	} while (0)

/* fp_prefilter is the mask slots a fingerprint of the packet may be in
 * (0: none can match). Inline, in the main program: a packet no
 * fingerprint can match costs the header word and one array load per
 * field while any slot is left, and no call. The fields the shield's
 * masks (internal/shield Masks) name, most selective first: every mask
 * of the shield names the protocol, most a port, the others the source
 * port, the length or the source; TTL and flags come only with those. */
static __always_inline __u32 fp_prefilter(const struct pkt_info *pi, int v4)
{
	const struct eg_fp_pre *p;
	__u32 zero = 0, cand;
	__u64 h;

	p = bpf_map_lookup_elem(&fp_pre_words, &zero);
	if (!p)
		return 0;
	h = p->w[0];
	cand = h & 0xff; /* EG_FP_PRE_H_USED */
	if (!cand)
		return 0;
	fp_narrow(cand, EG_FP_PRE_H_DPORT, h, EG_FP_PRE_DPORT, pi->dport, 0xffff);
	fp_narrow(cand, EG_FP_PRE_H_SPORT, h, EG_FP_PRE_SPORT, pi->sport, 0xffff);
	fp_narrow(cand, EG_FP_PRE_H_LEN, h, EG_FP_PRE_LEN, pi->ip_len, 0xffff);
	fp_narrow(cand, EG_FP_PRE_H_SRC, h, EG_FP_PRE_SRC, fp_src_index(pi->addr, v4), 0xffff);
	fp_narrow(cand, EG_FP_PRE_H_TTL, h, EG_FP_PRE_TTL, pi->ttl, 0xff);
	fp_narrow(cand, EG_FP_PRE_H_TCP_FLAGS, h, EG_FP_PRE_TCP_FLAGS, pi->tcp_flags, 0xff);
	fp_narrow(cand, EG_FP_PRE_H_PROTO, h, EG_FP_PRE_PROTO, pi->proto, 0xff);
	return cand;
}

/* eg_fingerprint matches the packet against the fingerprint rules of the
 * mask slots in cand (fp_prefilter's, not 0): one hash lookup per slot,
 * first match wins (slot order). A match is charged to the fingerprint's
 * bucket; a refusal drops the packet (1), unless the fingerprint is a dry
 * run (counted, passed) or the source is validated (never dropped by a
 * fingerprint: counted as spared, passed). Global: verified once, out of
 * the main program's states. */
__attribute__((noinline)) int eg_fingerprint(struct src_state *ss, __u32 cand)
{
	struct eg_fp_masks *fm;
	struct eg_fp_stats *st;
	struct eg_fp_val *fv;
	struct eg_fp_key *k;
	__u32 zero = 0, n, f;
	int i, refused;

	if (!ss)
		return 0;
	fm = bpf_map_lookup_elem(&fp_masks, &zero);
	if (!fm)
		return 0;
	n = fm->n;
	k = bpf_map_lookup_elem(&agg_scratch, &zero);
	if (!k)
		return 0;
	for (i = 0; i < EG_FP_MAX_MASKS; i++) {
		struct eg_fp_key *fk = (struct eg_fp_key *)k;

		if (i >= n || !(cand >> i))
			return 0;
		if (!(cand & (1U << i)))
			continue;
		f = fm->fields[i];
		__builtin_memset(fk, 0, sizeof(*fk));
		fk->fields = f;
		if (f & EG_FP_PROTO)
			fk->proto = ss->proto;
		if (f & EG_FP_DPORT)
			fk->dport = ss->dport;
		if (f & EG_FP_SPORT)
			fk->sport = ss->sport;
		if (f & EG_FP_LEN)
			fk->len = ss->ip_len;
		if (f & EG_FP_TTL)
			fk->ttl = ss->ttl;
		if (f & EG_FP_TCP_FLAGS)
			fk->tcp_flags = ss->tcp_flags;
		if (f & EG_FP_SRC) {
			fk->src_len = fm->src_len[i] > 128 ? 128 : fm->src_len[i];
			mask_addr(fk->addr, ss->addr, fk->src_len);
		}
		fv = bpf_map_lookup_elem(&fp_rules, fk);
		if (!fv || fv->expires <= (ss->now >> EG_TICK_SHIFT))
			continue;
		refused = !bucket_limited(&fv->budget) || !bucket_take(&fv->bucket, &fv->budget, ss->now, ss->len);
		st = bpf_map_lookup_elem(&fp_stats, &fv->id);
		if (st) {
			st->matched.packets++;
			st->matched.bytes += ss->len;
		}
		if (!refused)
			return 0;
		if (!fv->dry_run && source_class(ss, 0) == EG_CLASS_VALIDATED) {
			if (st) {
				st->spared.packets++;
				st->spared.bytes += ss->len;
			}
			return 0;
		}
		if (st) {
			st->dropped.packets++;
			st->dropped.bytes += ss->len;
		}
		return fv->dry_run ? 0 : 1;
	}
	return 0;
}

/* standing_touch is 1 for the first packet of a source address in the
 * current epoch (~1 s) with this salt, 0 after: standing is updated at most
 * once per source per epoch for its admitted packets and once for its
 * refusals by its own limit, whatever its rate. It shares the new-source
 * filter's words under keys no bucket uses (rule ids 0xfffffffc-d). */
static __always_inline int standing_touch(const struct src_state *ss, __u32 salt)
{
	struct eg_src_key k = { .rule_id = salt };
	__u32 h, idx;
	__u64 epoch, bit, mask = (1ULL << EG_SEEN_BITS) - 1;
	__u64 *word, old, tag, cur = 0, prev = 0;

	mask_addr(k.addr, ss->addr, ss->v4 ? 128 : 64);
	h = key_hash((const __u32 *)&k, sizeof(k) / 4);
	idx = (h >> 6) & eg_seen_mask;
	epoch = ((ss->now >> EG_TICK_SHIFT) >> EG_SEEN_EPOCH_SHIFT) & 0xff;
	bit = (1ULL << ((h & 63) % EG_SEEN_BITS)) | (1ULL << (((h * 0x9e3779b1U) >> 26) % EG_SEEN_BITS));
	word = bpf_map_lookup_elem(&seen_filter, &idx);
	if (!word)
		return 0;
	old = *(volatile __u64 *)word;
	tag = old >> (2 * EG_SEEN_BITS);
	if (tag == epoch) {
		cur = (old >> EG_SEEN_BITS) & mask;
		prev = old & mask;
	} else if (((tag + 1) & 0xff) == epoch) {
		prev = (old >> EG_SEEN_BITS) & mask;
	}
	if ((cur & bit) == bit)
		return 0;
	*(volatile __u64 *)word = (epoch << (2 * EG_SEEN_BITS)) | ((cur | bit) << EG_SEEN_BITS) | prev;
	return 1;
}

static __always_inline void count_standing(__u32 ev)
{
	__u64 *c = bpf_map_lookup_elem(&standing_stats, &ev);

	if (c)
		*c += 1;
}

static __always_inline void set_standing(struct eg_standing_val *e, __u32 st, __u32 why, __u64 ns)
{
	e->standing = st;
	e->why = why;
	e->since = ns;
	e->clean_since = ns;
}

/* eg_standing_update moves a source along its standing, at most once per
 * source per epoch (standing_touch), after its packet's verdict (reason):
 *  - refused by its own limit: an entry that exists is penalised (a source
 *    without one stays new: nothing is created for refused packets);
 *  - admitted while an aggregate on its path was congested: a new source's
 *    clean history starts over;
 *  - admitted: a new source gets an entry (only for packets admitted at the
 *    new-source tolerance: a flood the aggregates refuse creates none); a
 *    new source whose clean history reaches established_after, with no gap
 *    longer than that, becomes established; a penalty that is over decays
 *    to new. */
/* tcp_established: whether this host holds the packet's TCP connection
 * in state ESTABLISHED, i.e. the source completed a handshake with us and
 * is not spoofed. bpf_skc_lookup_tcp finds the socket in the packet's
 * network namespace (a listener or request socket is not ESTABLISHED). */
static __always_inline int tcp_established(struct xdp_md *ctx, const struct src_state *ss)
{
	struct bpf_sock_tuple *t;
	struct bpf_sock *sk;
	__u32 size, zero = 0;
	int ok;

	/* The tuple lives in a per-CPU scratch slot: the program's stack
	 * and this function's caller's are full. */
	t = bpf_map_lookup_elem(&tuple_scratch, &zero);
	if (!t)
		return 0;
	__builtin_memset(t, 0, sizeof(*t));
	if (ss->v4) {
		__builtin_memcpy(&t->ipv4.saddr, ss->addr + 12, 4);
		__builtin_memcpy(&t->ipv4.daddr, ss->daddr + 12, 4);
		t->ipv4.sport = bpf_htons(ss->sport);
		t->ipv4.dport = bpf_htons(ss->dport);
		size = sizeof(t->ipv4);
	} else {
		__builtin_memcpy(t->ipv6.saddr, ss->addr, 16);
		__builtin_memcpy(t->ipv6.daddr, ss->daddr, 16);
		t->ipv6.sport = bpf_htons(ss->sport);
		t->ipv6.dport = bpf_htons(ss->dport);
		size = sizeof(t->ipv6);
	}
	sk = bpf_skc_lookup_tcp(ctx, t, size, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	ok = sk->state == BPF_TCP_ESTABLISHED;
	bpf_sk_release(sk);
	return ok;
}

/* fold_rate measures the source's rate since the last measurement (its
 * bucket's count and the count at its standing lookups, over the time
 * between: at least an epoch, as updates come at most once per epoch) and
 * folds it into the usual rate, a decayed peak with half-life
 * rate_history: usual = max(previous current, usual decayed), one
 * measurement late (see below). The decay goes in
 * whole steps of a sixteenth of the half-life (x 2^-1/16 each, in 16-bit
 * fixed point, rounded down; the remainder waits for the next update), so
 * frequent updates do not round it away. A privileged source is jumped while current >
 * jump_factor x usual and current > jump_min; while jumped, usual is
 * frozen (a sustained surge does not become the usual rate). Only for
 * rules whose per-source key is the standing key (EG_SS_SRCKEY); internal/
 * refmodel mirrors it. */
static __always_inline void fold_rate(struct eg_standing_val *e, const struct src_state *ss,
				      const struct eg_standing_cfg *scfg, __u64 ns, const struct eg_src_key *sk)
{
	struct eg_src_bucket *sb;
	__u32 src = 0, n, hl = scfg->rate_half_life_ms;
	__u64 dt, cur, usual, k, step, w;
	int jump;

	if (!hl || !(ss->looked & EG_SS_SRCKEY))
		return;
	sb = bpf_map_lookup_elem(&src_buckets, sk);
	if (sb)
		src = *(volatile __u32 *)&sb->pkts;
	if (e->rate_at && ns > e->rate_at) {
		/* At least an epoch per measurement: two updates in
		 * consecutive epochs can be microseconds apart. */
		if (ns - e->rate_at < (1ULL << EG_SEEN_EPOCH_SHIFT))
			return;
		dt = (ns - e->rate_at) / 1000000; /* ms */
		/* A bucket that is younger than the mark (evicted and made
		 * again, or another rule's) counts from zero. */
		n = (src >= e->src_mark ? src - e->src_mark : src) + (e->pkts - e->pkts_mark);
		cur = ((__u64)n << EG_RATE_SHIFT) * 1000 / dt;
		if (cur > 0xffffffff)
			cur = 0xffffffff;
		usual = e->usual;
		step = (__u64)hl * (1000000 / 16);
		if (e->jumped || ss->congested || ns < e->usual_at) {
			e->usual_at = ns; /* frozen: no decay accrues */
		} else {
			k = (ns - e->usual_at) / step;
			e->usual_at += k * step;
			usual = k >= 32 * 16 ? 0 : usual >> (k / 16);
#pragma unroll
			for (int i = 0; i < 15; i++) {
				if (i < (int)(k % 16))
					usual = (usual * 62757) >> 16; /* 2^-1/16 */
			}
		}
		jump = scfg->jump_factor16 &&
		       (e->standing == EG_STANDING_ESTABLISHED || e->standing == EG_STANDING_VALIDATED) &&
		       cur > scfg->jump_min && (cur << 4) > (__u64)scfg->jump_factor16 * usual;
		if (jump && !e->jumped && e->standing == EG_STANDING_ESTABLISHED)
			count_standing(EG_SE_JUMPED);
		/* The last measurement (current) joins the usual rate only now
		 * that this one is no jump: a surge that starts inside an epoch
		 * is measured partly in one and fully in the next, and the
		 * partial one must not raise the usual rate the next is judged
		 * against. One that was a jump never joins. */
		if (!jump && !e->jumped && !e->held && e->current > usual)
			usual = e->current;
		if (!jump)
			e->usual = usual;
		/* The mean (the personal budget's rate): what the source sent
		 * over up to rate_history, uncongested measurements only, so
		 * that an attack's rate never becomes anyone's budget. */
		if (!ss->congested && !jump) {
			w = e->mean_w;
			if (dt > hl)
				dt = hl;
			e->mean = ((__u64)e->mean * w + cur * dt) / (w + dt);
			e->mean_w = w + dt > hl ? hl : w + dt;
		}
		e->jumped = jump;
		e->held = ss->congested;
		e->current = cur;
	}
	if (!e->rate_at)
		e->usual_at = ns;
	e->rate_at = ns;
	e->src_mark = src;
	e->pkts_mark = e->pkts;
}

__attribute__((noinline)) int eg_standing_update(struct src_state *ss, __u32 what, struct xdp_md *ctx)
{
	static const struct eg_standing_val zero_standing;
	struct eg_standing_val *e;
	struct eg_standing_cfg *scfg;
	/* The source bucket's key (for fold_rate); its address is the
	 * standing key (one key on the stack, not two). */
	struct eg_src_key k = {};
	__u32 gen;
	__u64 ns;

	if (!ss)
		return 0;
	if (what == EG_UPD_ADMITTED && ss->touched == EG_TOUCH_NO)
		return 0;
	if ((what == EG_UPD_OWN_LIMIT || ss->touched != EG_TOUCH_FIRST) &&
	    !standing_touch(ss, what == EG_UPD_OWN_LIMIT ? 0xfffffffc : 0xfffffffd))
		return 0;
	gen = ss->gen;
	scfg = bpf_map_lookup_elem(&standing_cfg, &gen);
	if (!scfg || !scfg->established_after_ns)
		return 0;
	ns = ss->now >> EG_TICK_SHIFT;
	k.rule_id = ss->rule_id;
	mask_addr(k.addr, ss->addr, ss->v4 ? 128 : 64);
	e = bpf_map_lookup_elem(&standing, k.addr);
	if (what == EG_UPD_OWN_LIMIT) {
		if (!e)
			return 0;
		if (e->standing != EG_STANDING_PENALISED) {
			set_standing(e, EG_STANDING_PENALISED, EG_WHY_OWN_LIMIT, ns);
			count_standing(EG_SE_PENALISED);
		} else {
			e->since = ns; /* the penalty runs from the last offence */
		}
		e->last_seen = ns;
		return 0;
	}
	if (!e) {
		/* Inserted zero, then filled in (a zero entry's last_seen 0
		 * restarts its clean history if another CPU updates it in
		 * between): the value is not built on the stack. */
		if (bpf_map_update_elem(&standing, k.addr, &zero_standing, BPF_NOEXIST) == 0) {
			count_standing(EG_SE_CREATED);
			e = bpf_map_lookup_elem(&standing, k.addr);
			if (e) {
				e->since = ns;
				e->clean_since = ns;
				e->last_seen = ns;
				e->why = EG_WHY_FIRST_SEEN;
			}
		} else {
			count_standing(EG_SE_FULL);
		}
		return 0;
	}
	/* The packet that makes this update is counted, if neither its
	 * bucket nor a standing lookup did: a source slower than one packet
	 * every other epoch has no bucket (the new-source filter), and its
	 * rate is what these packets say. */
	if (!(ss->looked & EG_SS_COUNTED)) {
		e->pkts++;
		ss->looked |= EG_SS_COUNTED;
	}
	fold_rate(e, ss, scfg, ns, &k);
	if (e->standing == EG_STANDING_PENALISED) {
		if (ns - e->since < scfg->penalty_ns) {
			e->last_seen = ns;
			return 0;
		}
		set_standing(e, EG_STANDING_NEW, EG_WHY_PENALTY_OVER, ns);
	} else if (e->standing == EG_STANDING_NEW && ss->tcp && tcp_established(ctx, ss)) {
		/* A completed handshake proves the address is not spoofed,
		 * congested or not. It is no priority (the source still ranks
		 * as new, handshake_only) and its clean history goes on. */
		e->standing = EG_STANDING_VALIDATED;
		e->why = EG_WHY_TCP_HANDSHAKE;
		e->since = ns;
		count_standing(EG_SE_VALIDATED);
	} else if (e->standing == EG_STANDING_NEW || handshake_only(e)) {
		if (ss->congested) {
			e->clean_since = ns;
			if (e->standing == EG_STANDING_NEW)
				e->why = EG_WHY_CONGESTED;
		} else if (ns - e->last_seen > scfg->established_after_ns) {
			e->clean_since = ns; /* gone longer than the whole wait: start over */
		} else if (ns - e->clean_since >= scfg->established_after_ns) {
			set_standing(e, EG_STANDING_ESTABLISHED, EG_WHY_CLEAN_HISTORY, ns);
			count_standing(EG_SE_ESTABLISHED);
		}
	}
	e->last_seen = ns;
	return 0;
}

SEC("xdp")
int xdp_limiter(struct xdp_md *ctx)
{
	struct cursor c = { .pos = (void *)(long)ctx->data, .end = (void *)(long)ctx->data_end };
	/* cls: unknown until an aggregate's refusal looks the standing up
	 * (samples report it). */
	struct verdict v = { .action = EG_ACT_PASS, .reason = EG_R_OK, .cls = EG_CLASS_UNKNOWN };
	struct pkt_info pi = {};
	struct eg_config *cfg = NULL;
	struct eg_active *act;
	struct eg_rule *rule = NULL;
	struct eg_list_val *lv;
	struct eg_prefix_val *pv;
	struct eg_rsample_stats *rs;
	struct eg_bucket *gb = NULL, *ab = NULL, *nb = NULL;
	struct eg_src_bucket *sb;
	/* The ASN's key for its look, then the derived aggregate's for its
	 * look and charge, then the ASN's again if its bucket must be made:
	 * one key on the stack (6.1 rounds each frame up to 32 bytes, and the
	 * main program plus a call must fit in 512). */
	struct eg_agg_key ak;
	/* The lists and prefix lookups' key, then the per-source key: one
	 * slot of the (full) stack. */
	union {
		struct eg_lpm_key lk;
		struct eg_src_key sk;
	} u;
	struct src_state ss = {};
	__u32 *gatep;
	int afirst = 0;
	void *l3p = NULL;
	__u32 zero = 0, gen, idx, slot, fpc;
	__u64 now = 0;
	__u16 l3;
	void *trie;
	int ret, v4 = 0, dry;

	pi.len = ctx->data_end - ctx->data;

	ret = parse_eth(&c, &l3);
	if (ret < 0)
		goto malformed;
	l3p = c.pos; /* for the TCP handshake check of standing */
	if (l3 == bpf_htons(ETH_P_IP)) {
		ret = parse_ipv4(&c, &pi);
	} else if (l3 == bpf_htons(ETH_P_IPV6)) {
		ret = parse_ipv6(&c, &pi);
	} else {
		v.reason = EG_R_NON_IP;
		return finish(ctx, &v, &pi, cfg, now);
	}
	if (ret < -1)
		goto malformed;
	if (ret >= 0) {
		ret = parse_l4(&c, &pi, ret, l3 == bpf_htons(ETH_P_IP));
		if (ret < 0)
			goto malformed;
	}

	act = bpf_map_lookup_elem(&active, &zero);
	if (!act)
		goto no_policy;
	gen = act->gen & 1;
	cfg = bpf_map_lookup_elem(&configs, &gen);
	if (!cfg || !cfg->valid)
		goto no_policy;

	now = now_ticks(cfg);
	v.gen = gen;

	/* 1. Lists: deny, then allow. Inheritance is folded in by the control
	 * plane, so the most specific entry answers both. */
	u.lk.prefixlen = 128;
	__builtin_memcpy(u.lk.addr, pi.addr, 16);
	lv = bpf_map_lookup_elem(&lists, &u.lk);
	if (lv) {
		__u64 ns = now >> EG_TICK_SHIFT;

		if (lv->deny_until > ns) {
			v.action = EG_ACT_DROP;
			v.reason = EG_R_DENY_LIST;
			goto verdict;
		}
		if (lv->allow_until > ns) {
			v.reason = EG_R_ALLOW_LIST;
			return finish(ctx, &v, &pi, cfg, now);
		}
	}

	/* 2. Prefix facts: rule, ASN, country; most specific wins. IPv4
	 * sources use the generation's direct table when it has one; it holds
	 * the same answers as the trie (IPv6 facts above ::ffff:0:0/96
	 * included). */
	v.rule_slot = 0;
	v4 = is_v4_mapped_addr(pi.addr);
	if (v4 && cfg->v4_direct) {
		v4_direct_lookup(gen, pi.addr, &v);
	} else {
		trie = bpf_map_lookup_elem(&prefix_gens, &gen);
		if (trie) {
			pv = bpf_map_lookup_elem(trie, &u.lk);
			if (pv) {
				v.rule_slot = pv->rule_slot;
				v.asn = pv->asn;
			}
		}
	}

	/* 3. L4 rules override the prefix rule (reflection, per-protocol). */
	if (cfg->l4_protos & l4_proto_bit(pi.proto))
		l4_rule(&pi, gen, &v.rule_slot);

	if (v.rule_slot >= eg_max_rules)
		goto no_policy;
	idx = gen * eg_max_rules + v.rule_slot;
	rule = bpf_map_lookup_elem(&rules, &idx);
	if (!rule || !rule->valid)
		goto no_policy;
	v.counted_rule = 1;
	if (rule->action == EG_RULE_PASS) {
		v.reason = EG_R_RULE_PASS;
		return finish(ctx, &v, &pi, cfg, now);
	}
	if (rule->action == EG_RULE_DROP) {
		v.action = EG_ACT_DROP;
		v.reason = EG_R_RULE_DROP;
		goto verdict;
	}

	ss.now = now;
	__builtin_memcpy(ss.addr, pi.addr, 16);
	ss.len = pi.len;
	ss.gen = gen;
	ss.v4 = v4;
	/* The rule's gate word (aggregate overrides, watches): usually 0. */
	gatep = bpf_map_lookup_elem(&agg_gate, &v.rule_slot);
	ss.gate = gatep ? *gatep : 0;
	ss.rule_id = rule->id;
	ss.asn = v.asn;
	ss.agg_mode = rule->agg_mode;
	ss.agg_len4 = rule->agg_len4;
	ss.agg_len6 = rule->agg_len6;
	/* The packet's fields, for the fingerprints and the TCP handshake
	 * check: filled on every path, so that the paths after the
	 * fingerprint section differ in nothing the verifier must tell
	 * apart (a few stores). */
	ss.sport = pi.sport;
	ss.dport = pi.dport;
	ss.proto = pi.proto;
	ss.ttl = pi.ttl;
	ss.tcp_flags = pi.tcp_flags;
	ss.ip_len = pi.ip_len;
	if (pi.proto == IPPROTO_TCP && pi.has_l4 && l3p) {
		/* The destination, for bpf_skc_lookup_tcp; parsing already
		 * bounds-checked these headers, the verifier wants it again. */
		if (v4) {
			struct iphdr *iph = l3p;

			if ((void *)(iph + 1) <= (void *)(long)ctx->data_end) {
				__builtin_memset(ss.daddr, 0, 10);
				ss.daddr[10] = 0xff;
				ss.daddr[11] = 0xff;
				__builtin_memcpy(ss.daddr + 12, &iph->daddr, 4);
				ss.tcp = 1;
			}
		} else {
			struct ipv6hdr *ip6h = l3p;

			if ((void *)(ip6h + 1) <= (void *)(long)ctx->data_end) {
				__builtin_memcpy(ss.daddr, &ip6h->daddr, 16);
				ss.tcp = 1;
			}
		}
	}

	/* 4. Fingerprint rules (the adaptive shield's): after the lists and
	 * the rule, before any bucket, so that a fingerprinted flood charges
	 * no bucket and creates no per-source state. The prefilter inline,
	 * the call only for a packet some fingerprint may match. */
	fpc = fp_prefilter(&pi, v4);
	if (fpc && eg_fingerprint(&ss, fpc)) {
		v.reason = EG_R_FINGERPRINT;
		goto limited;
	}

	/* 5. Buckets. First look, without touching per-source state, whether
	 * an aggregate above this source is already empty: then drop at once.
	 * This is what keeps the per-source table from being churned by a
	 * spoofed flood whose aggregate is over budget. */
	if (bucket_limited(&cfg->global)) {
		slot = EG_GLOBAL_BUCKET;
		gb = bpf_map_lookup_elem(&global_buckets, &slot);
		if (gb && !agg_peek(gb, &cfg->global, (__u32)cfg->reserve << 8 | EG_CAGG_GLOBAL, &ss)) {
			v.reason = EG_R_GLOBAL_LIMIT;
			goto limited;
		}
	}
	if (v.asn && bucket_limited(&rule->asn)) {
		agg_asn_key(&ak, rule, v.asn);
		nb = bpf_map_lookup_elem(&agg_buckets, &ak);
		if (nb && !agg_peek(nb, &rule->asn, (__u32)rule->reserve << 8 | EG_CAGG_ASN, &ss)) {
			v.reason = EG_R_ASN_LIMIT;
			goto limited;
		}
	}
	if (rule->agg_mode != EG_AGG_NONE && bucket_limited(&rule->agg)) {
		if (rule->agg_mode != EG_AGG_DERIVED) {
			/* Whole. v.rule_slot is the rule's slot, < eg_max_rules:
			 * the lookup only fails if the map were smaller. */
			ab = bpf_map_lookup_elem(&whole_buckets, &v.rule_slot);
		} else {
			agg_derived_key(&ak, rule, &pi, v4);
			ab = bpf_map_lookup_elem(&agg_buckets, &ak);
		}
		if (ab && !agg_peek(ab, &rule->agg, (__u32)rule->reserve << 8 | EG_CAGG_PREFIX, &ss)) {
			v.reason = EG_R_PREFIX_LIMIT;
			goto limited;
		}
	}

	/* Then charge, most specific first: a packet dropped by a more
	 * specific bucket never consumes tokens of the aggregates above it. */
	if (bucket_limited(&rule->src)) {
		__builtin_memset(&u.sk, 0, sizeof(u.sk));
		u.sk.rule_id = rule->id;
		mask_addr(u.sk.addr, pi.addr,
			  v4 ? 96 + (rule->src_len4 > 32 ? 32 : rule->src_len4)
			     : (rule->src_len6 > 128 ? 128 : rule->src_len6));
		if (v4 ? rule->src_len4 == 32 : rule->src_len6 == 64)
			ss.looked |= EG_SS_SRCKEY;
		if (!gated(&rule->src)) {
			sb = src_lookup_or_create(&u.sk);
		} else {
			/* The filter first: a source not seen in this epoch or
			 * the last costs one bit and no table lookup; its packet
			 * is charged when the source shows up again. */
			int first = 0;
			int seen = seen_mark((const __u32 *)&u.sk, sizeof(u.sk) / 4, now, 1, &first);

			/* A per-source key that is the standing key (/32, /64)
			 * answers standing's "first packet of this epoch". */
			if (ss.looked & EG_SS_SRCKEY)
				ss.touched = EG_TOUCH_FIRST + !first;

			sb = NULL;
			if (seen != EG_SEEN_NEW) {
				sb = bpf_map_lookup_elem(&src_buckets, &u.sk);
				if (!sb)
					sb = src_create_charged(&u.sk, &rule->src, now, pi.len);
				else if (seen == EG_SEEN_DEFERRED)
					bucket_charge(&sb->b, &rule->src, now, pi.len);
			}
		}
		if (sb) {
			/* Offered packets, for the usual rate (one add on the
			 * line the CAS writes). */
			sb->pkts += !(ss.looked & EG_SS_COUNTED);
			ss.looked |= EG_SS_COUNTED;
			if (!bucket_take(&sb->b, &rule->src, now, pi.len)) {
				v.reason = EG_R_SOURCE_LIMIT;
				goto limited;
			}
		}
	}
	if (rule->agg_mode != EG_AGG_NONE && bucket_limited(&rule->agg)) {
		/* A whole aggregate's bucket is always there (an array slot,
		 * zero = full, like a fresh hash entry); ab is NULL here only
		 * for a derived aggregate not yet in agg_buckets. */
		if (!ab && rule->agg_mode == EG_AGG_DERIVED) {
			if (!gated(&rule->agg))
				ab = lookup_or_create(&agg_buckets, &ak);
			else if (seen_mark((const __u32 *)&ak, sizeof(ak) / 4, now, 0, &afirst) != EG_SEEN_NEW)
				ab = create_charged(&agg_buckets, &ak, &rule->agg, now, pi.len);
		}
		if (ab && !eg_agg_take(ab, &rule->agg, (__u32)rule->reserve << 8 | EG_CAGG_PREFIX, &ss)) {
			v.reason = EG_R_PREFIX_LIMIT;
			goto limited;
		}
	}
	if (v.asn && bucket_limited(&rule->asn)) {
		if (!nb) {
			agg_asn_key(&ak, rule, v.asn);
			nb = lookup_or_create(&agg_buckets, &ak);
		}
		if (nb && !eg_agg_take(nb, &rule->asn, (__u32)rule->reserve << 8 | EG_CAGG_ASN, &ss)) {
			v.reason = EG_R_ASN_LIMIT;
			goto limited;
		}
	}
	if (gb && !eg_agg_take(gb, &cfg->global, (__u32)cfg->reserve << 8 | EG_CAGG_GLOBAL, &ss)) {
		v.reason = EG_R_GLOBAL_LIMIT;
		goto limited;
	}
	goto standing_out;

limited:
	/* An override that refused names its writer. */
	if (ss.refused_reason)
		v.reason = ss.refused_reason;
	v.action = EG_ACT_DROP;
verdict:
	dry = cfg->mode == EG_MODE_DRY_RUN;
	if (v.reason != EG_R_DENY_LIST && rule && rule->mode != EG_MODE_INHERIT)
		dry = rule->mode == EG_MODE_DRY_RUN;
	if (dry)
		v.action = EG_ACT_WOULD_DROP;
	/* Refusals by the reserve are counted by class, would-drops apart. */
	if (ss.refused_outcome == EG_CO_REFUSED_RESERVE)
		count_class(dry ? 1 : 0, ss.refused_agg, ss.cls, EG_CO_REFUSED_RESERVE, pi.len);
	/* For the drop sample: which congestion refused it (per-instance
	 * congestion, docs/operations.md "Standing"). */
	v.refused = ss.refused_outcome | ss.refused_agg << 4;
	v.cls = ss.looked ? ss.cls : EG_CLASS_UNKNOWN;
standing_out:
	/* Watched aggregates count every packet that reached the buckets. */
	if (ss.gate >> EG_GATE_WATCH_SHIFT)
		eg_watch_all(&ss, v.reason == EG_R_OK);
	/* At most once per source per epoch: admitted packets of limit rules
	 * build history, refusals by the own limit penalise. The calls only when the update can do something: a source already
	 * touched in this epoch (EG_TOUCH_NO) is not updated for an admitted
	 * packet (eg_standing_update checks again). */
	if (v.reason == EG_R_OK) {
		if (ss.touched != EG_TOUCH_NO)
			eg_standing_update(&ss, EG_UPD_ADMITTED, ctx);
	} else if (v.reason == EG_R_SOURCE_LIMIT) {
		rs = bpf_map_lookup_elem(&rate_sample_stats, &zero);
		if (eg_test_clock || (rs && (eg_rand(rs) & (EG_PENALTY_SAMPLE - 1)) == 0))
			eg_standing_update(&ss, EG_UPD_OWN_LIMIT, ctx);
	}
	return finish(ctx, &v, &pi, cfg, now);

malformed:
	v.reason = -ret;
	act = bpf_map_lookup_elem(&active, &zero);
	if (act) {
		gen = act->gen & 1;
		cfg = bpf_map_lookup_elem(&configs, &gen);
	}
	if (cfg && cfg->valid && cfg->malformed_verdict == EG_ACT_DROP)
		v.action = cfg->mode == EG_MODE_DRY_RUN ? EG_ACT_WOULD_DROP : EG_ACT_DROP;
	return finish(ctx, &v, &pi, NULL, 0);

no_policy:
	v.reason = EG_R_NO_POLICY;
	v.counted_rule = 0;
	return finish(ctx, &v, &pi, cfg, 0);
}
