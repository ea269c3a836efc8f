// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Edgeguard's SYN path (docs/tcp.md). Its own object, loaded only when the
 * kernel has what it needs (Linux >= 6.9: tcx, bpf_sk_assign_tcp_reqsk), so
 * the limiter loads everywhere without it.
 *
 * Two programs:
 *  - eg_syn_xdp is the XDP entry when the SYN path is loaded: it looks at
 *    TCP to protected services and tail-calls the limiter (syn_next[0])
 *    for every packet it does not decide itself. Deny-listed sources are
 *    dropped first (the limiter's lists map, shared). For a protected
 *    service: a SYN is answered with a SYN-ACK carrying our cookie
 *    (XDP_TX), within an answer budget per source prefix so the host is
 *    no reflector; a packet without SYN is looked up with
 *    bpf_skc_lookup_tcp: one of a known connection (any state but LISTEN)
 *    goes on to the limiter, an ACK whose cookie checks out goes on with
 *    metadata for the tcx program (and its source becomes validated in
 *    the limiter's standing map),
 *    anything else is out of state: dropped, or passed on within the
 *    service's budget. A validated source (the limiter's standing map,
 *    shared) bypasses the SYN path for a while.
 *  - eg_syn_tc (tcx ingress) turns the metadata into a request socket with
 *    bpf_sk_assign_tcp_reqsk: the kernel creates the connection without
 *    ever having seen the SYN, and without its own cookie check (which only
 *    accepts cookies while a listener overflowed recently).
 *
 * Cookie (32 bits, the SYN-ACK's sequence number):
 *   | 31 ... 8: MAC | 7 6: MSS index | 5: 0 | 4: SACK | 3 ... 0: client wscale (15: none) |
 * MAC = SipHash-2-4(secret; source and destination address, ports, the
 * client's ISN, time window) folded to 32 bits, top 24 kept. Two windows
 * are accepted (EG_SYN_WINDOW_SHIFT). Window scale and SACK survive for
 * clients without timestamps; the MSS is rounded down to a table entry.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "edgeguard_types.h"
#include "syncookie_types.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#ifndef TCX_NEXT
#define TCX_NEXT -1
#endif
#define EG_TCP_LISTEN 10

/* Tests read time from syn_test_clock instead of the kernel's clock. */
volatile const __u8 eg_syn_test_clock = 0;

/* BTF anchor for the types no map names (enums, the metadata). */
struct eg_syn_btf_anchor {
	enum eg_syn_mode mode;
	enum eg_syn_counter counter;
	enum eg_syn_sizes sizes;
	struct eg_syn_meta meta;
};
volatile const struct eg_syn_btf_anchor eg_syn_btf_anchor;

/* The maps marked LIBBPF_PIN_BY_NAME survive a restart of the daemon
 * (internal/loader pins them): the secret (cookies in flight stay valid),
 * budgets, auto state and counters, and syn_next: the kernel empties a
 * program array when its last user-space reference goes, so without a pin
 * a daemon that dies would leave the SYN path tail-calling nothing, and
 * every packet would pass unlimited. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_SYN_MAX_ENDPOINTS);
	__type(key, struct eg_syn_endpoint);
	__type(value, __u32); /* service id */
	__uint(map_flags, BPF_F_NO_PREALLOC);
} syn_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_SYN_MAX_SERVICES);
	__type(key, __u32);
	__type(value, struct eg_syn_service);
} syn_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_SYN_MAX_SERVICES);
	__type(key, __u32);
	__type(value, struct eg_syn_state);
} syn_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_SYN_MAX_SERVICES);
	__type(key, __u32);
	__type(value, struct eg_syn_counters);
} syn_counters SEC(".maps");

/* The limiter's standing table (edgeguard_types.h; the loader replaces
 * this definition with the limiter's map, as it does lists): a source
 * whose cookie checks out becomes validated there, and a validated source
 * (by a cookie, an ESTABLISHED connection or the L7 stage) bypasses the SYN
 * path for the service's validated_ns. A plain hash: when it is full the
 * source is not entered (counted EG_SE_FULL) and nobody is evicted. Only a
 * valid cookie (a completed round trip) inserts, so a spoofed flood cannot
 * fill it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct eg_standing_key);
	__type(value, struct eg_standing_val);
} standing SEC(".maps");

/* The limiter's standing events (replaced like standing). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EG_SE_MAX);
	__type(key, __u32);
	__type(value, __u64);
} standing_stats SEC(".maps");

/* Answer budgets per source prefix. LRU: a spoofed flood from many
 * prefixes evicts old budgets, which then start full again; each prefix
 * still gets at most its burst per eviction cycle. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 65536);
	__type(key, struct eg_syn_prefix_key);
	__type(value, __u64); /* GCRA theoretical arrival time, ns */
} syn_answers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct eg_syn_secret);
} syn_secret SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} syn_test_clock SEC(".maps");

/* The limiter's program, slot 0: every packet the SYN path does not decide. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} syn_next SEC(".maps");

/* The limiter's deny/allow lists: the loader replaces this definition with
 * the limiter's map (same layout, edgeguard_types.h). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct eg_lpm_key);
	__type(value, struct eg_list_val);
} lists SEC(".maps");

/* Client MSS, rounded down to one of these (the cookie keeps 2 bits). */
static const __u16 mss_v4[4] = { 536, 1300, 1440, 1460 };
static const __u16 mss_v6[4] = { 1220, 1420, 1440, 8940 };

static __always_inline __u64 now_ns(void)
{
	if (eg_syn_test_clock) {
		__u32 zero = 0;
		__u64 *t = bpf_map_lookup_elem(&syn_test_clock, &zero);

		return t ? *t : 0;
	}
	return bpf_ktime_get_ns();
}

static __always_inline void count_standing(__u32 ev)
{
	__u64 *c = bpf_map_lookup_elem(&standing_stats, &ev);

	if (c)
		*c += 1;
}

/* standing_key is the limiter's: IPv4 /32 (v4-mapped), IPv6 /64. */
static __always_inline void standing_key(struct eg_standing_key *k, const __u8 *addr, int v4)
{
	__builtin_memcpy(k->addr, addr, 16);
	if (!v4)
		__builtin_memset(&k->addr[8], 0, 8);
}

/* validate records that the source completed a handshake with our cookie:
 * a new source's standing becomes validated (why: TCP) from now, which
 * lets its next SYNs pass without a cookie (validated_ns) and gives it no
 * priority in the limiter (a handshake proves an address, not good intent:
 * docs/operations.md, "Class ranking"); its clean history goes on. An
 * established source, one validated otherwise (L7, the operator) and a
 * penalised one (a penalty is about what it sent, which a handshake does
 * not undo) keep their standing; a handshake-validated one is renewed.
 * Racing CPUs may both write the same values. */
static __always_inline void validate(const struct eg_standing_key *k, __u64 now)
{
	struct eg_standing_val fresh = {
		.since = now, .clean_since = now, .last_seen = now,
		.standing = EG_STANDING_VALIDATED, .why = EG_WHY_TCP_HANDSHAKE,
	};
	struct eg_standing_val *e = bpf_map_lookup_elem(&standing, k);
	long err;

	if (e) {
		if (e->standing == EG_STANDING_NEW ||
		    (e->standing == EG_STANDING_VALIDATED && e->why == EG_WHY_TCP_HANDSHAKE)) {
			if (e->standing != EG_STANDING_VALIDATED)
				count_standing(EG_SE_VALIDATED);
			e->standing = EG_STANDING_VALIDATED;
			e->why = EG_WHY_TCP_HANDSHAKE;
			e->since = now;
		}
		e->last_seen = now;
		return;
	}
	err = bpf_map_update_elem(&standing, k, &fresh, BPF_NOEXIST);
	if (err == 0) {
		count_standing(EG_SE_CREATED);
		count_standing(EG_SE_VALIDATED);
	} else if (err == -7 /* E2BIG: the table is full */) {
		count_standing(EG_SE_FULL);
	}
}

static __always_inline void count(struct eg_syn_counters *c, __u32 what)
{
	if (c && what < EG_SYNC_MAX)
		c->c[what]++;
}

#define ROTL(x, b) (__u64)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                   \
	do {                                                                                       \
		v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);                          \
		v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                             \
		v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                             \
		v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);                          \
	} while (0)
#define SIPBLOCK(m)                                                                                \
	do {                                                                                       \
		v3 ^= (m);                                                                         \
		SIPROUND;                                                                          \
		SIPROUND;                                                                          \
		v0 ^= (m);                                                                         \
	} while (0)

/* cookie_mac is SipHash-2-4 over six little-endian words: source address
 * (2), destination address (2), ports and ISN, time window; folded to 32
 * bits with the option bits cleared. */
static __noinline __u32 cookie_mac(const struct eg_syn_secret *k, const __u64 *w)
{
	__u64 v0 = k->k0 ^ 0x736f6d6570736575ULL;
	__u64 v1 = k->k1 ^ 0x646f72616e646f6dULL;
	__u64 v2 = k->k0 ^ 0x6c7967656e657261ULL;
	__u64 v3 = k->k1 ^ 0x7465646279746573ULL;
	__u64 b = 48ULL << 56, h;

	SIPBLOCK(w[0]);
	SIPBLOCK(w[1]);
	SIPBLOCK(w[2]);
	SIPBLOCK(w[3]);
	SIPBLOCK(w[4]);
	SIPBLOCK(w[5]);
	SIPBLOCK(b);
	v2 ^= 0xff;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	h = v0 ^ v1 ^ v2 ^ v3;
	return ((__u32)h ^ (__u32)(h >> 32)) & ~((1U << EG_SYN_COOKIE_BITS) - 1);
}

/* The parsed TCP segment the SYN path works on. Addresses unified (v4 as
 * v4-mapped v6). */
struct seg {
	__u8 smac[6], dmac[6];
	__u8 saddr[16];
	__u8 daddr[16];
	__u64 mac_words[6];
	__u16 sport, dport; /* network order */
	__u32 seq, ack_seq;  /* host order */
	__u32 l3off, l4off, doff; /* bytes */
	__u8 v4, flags, ip_opts;
	/* options (SYN: the client's offer; ACK: its timestamps) */
	__u16 mss;
	__u8 wscale, wscale_ok, sack_ok, ts_ok;
	__u32 tsval, tsecr;
};

#define F_FIN 0x01
#define F_SYN 0x02
#define F_RST 0x04
#define F_ACK 0x10

static __always_inline void mac_words(struct seg *s, __u32 isn, __u64 window)
{
	__builtin_memcpy(&s->mac_words[0], s->saddr, 16);
	__builtin_memcpy(&s->mac_words[2], s->daddr, 16);
	s->mac_words[4] = (__u64)s->sport << 48 | (__u64)s->dport << 32 | isn;
	s->mac_words[5] = window;
}

struct optscan {
	__u8 buf[64];
	__u32 off, len;
	__u32 tsval, tsecr;
	__u16 mss;
	__u8 wscale, wscale_ok, sack_ok, ts_ok;
};

/* One TCP option per call (bpf_loop): 40 bytes of options are at most 40
 * options, the loop's bound. */
static long opt_step(__u64 i, void *arg)
{
	struct optscan *o = arg;
	struct optscan *s = o;
	__u32 off = o->off;
	__u8 kind, len;

	if (off >= o->len || off >= 40)
		return 1;
	kind = o->buf[off & 63];
	if (kind == 0) /* EOL */
		return 1;
	if (kind == 1) { /* NOP */
		o->off = off + 1;
		return 0;
	}
	if (off + 1 >= o->len)
		return 1;
	len = o->buf[(off + 1) & 63];
	if (len < 2 || off + len > o->len)
		return 1;
	switch (kind) {
	case 2: /* MSS */
		if (len == 4)
			s->mss = (__u16)o->buf[(off + 2) & 63] << 8 | o->buf[(off + 3) & 63];
		break;
	case 3: /* window scale */
		if (len == 3) {
			s->wscale_ok = 1;
			s->wscale = o->buf[(off + 2) & 63];
		}
		break;
	case 4: /* SACK permitted */
		if (len == 2)
			s->sack_ok = 1;
		break;
	case 8: /* timestamps */
		if (len == 10) {
			s->ts_ok = 1;
			s->tsval = (__u32)o->buf[(off + 2) & 63] << 24 | (__u32)o->buf[(off + 3) & 63] << 16 |
				   (__u32)o->buf[(off + 4) & 63] << 8 | o->buf[(off + 5) & 63];
			s->tsecr = (__u32)o->buf[(off + 6) & 63] << 24 | (__u32)o->buf[(off + 7) & 63] << 16 |
				   (__u32)o->buf[(off + 8) & 63] << 8 | o->buf[(off + 9) & 63];
		}
		break;
	}
	o->off = off + len;
	return 0;
}

static __always_inline void parse_options(struct xdp_md *ctx, struct seg *s)
{
	struct optscan o = {};
	__u32 n = s->doff - 20;

	if (n == 0 || n > 40)
		return;
	if (bpf_xdp_load_bytes(ctx, s->l4off + 20, o.buf, n) < 0)
		return;
	o.len = n;
	bpf_loop(40, opt_step, &o, 0);
	s->mss = o.mss;
	s->wscale = o.wscale;
	s->wscale_ok = o.wscale_ok;
	s->sack_ok = o.sack_ok;
	s->ts_ok = o.ts_ok;
	s->tsval = o.tsval;
	s->tsecr = o.tsecr;
}

/* parse reads Ethernet, IPv4 (any header length) or IPv6 (TCP right after
 * the fixed header) and TCP. 0: a TCP segment; -1: not one the SYN path
 * reads (the limiter decides alone). */
static __always_inline int parse(struct xdp_md *ctx, struct seg *s)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct tcphdr *th;
	__u32 l4;

	if ((void *)(eth + 1) > end)
		return -1;
	__builtin_memcpy(s->smac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(s->dmac, eth->h_dest, ETH_ALEN);
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end || ip->version != 4 || ip->protocol != IPPROTO_TCP || ip->ihl < 5)
			return -1;
		if (ip->frag_off & bpf_htons(0x1fff)) /* not the first fragment: no TCP header */
			return -1;
		s->v4 = 1;
		s->ip_opts = ip->ihl != 5 || (ip->frag_off & bpf_htons(0x2000));
		__builtin_memset(s->saddr, 0, 10);
		s->saddr[10] = s->saddr[11] = 0xff;
		__builtin_memcpy(&s->saddr[12], &ip->saddr, 4);
		__builtin_memset(s->daddr, 0, 10);
		s->daddr[10] = s->daddr[11] = 0xff;
		__builtin_memcpy(&s->daddr[12], &ip->daddr, 4);
		l4 = sizeof(*eth) + ip->ihl * 4;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end || ip6->nexthdr != IPPROTO_TCP)
			return -1;
		__builtin_memcpy(s->saddr, &ip6->saddr, 16);
		__builtin_memcpy(s->daddr, &ip6->daddr, 16);
		l4 = sizeof(*eth) + sizeof(*ip6);
	} else {
		return -1;
	}
	s->l3off = sizeof(*eth);
	s->l4off = l4;
	if (l4 > 80)
		return -1;
	th = data + l4;
	if ((void *)(th + 1) > end)
		return -1;
	s->sport = th->source;
	s->dport = th->dest;
	s->seq = bpf_ntohl(th->seq);
	s->ack_seq = bpf_ntohl(th->ack_seq);
	s->doff = th->doff * 4;
	s->flags = ((__u8 *)th)[13];
	if (s->doff < 20)
		return -1;
	return 0;
}

/* gcra admits one event at now if the bucket's theoretical arrival time
 * allows it. Read-modify-write without a lock: CPUs racing on one bucket
 * may both admit, so a budget can be exceeded by up to one event per CPU
 * per race (docs/tcp.md). */
static __always_inline int gcra(__u64 *tat, __u64 now, __u64 t, __u64 tau)
{
	__u64 cur = *tat;

	if (cur > now + tau)
		return 0;
	*tat = (cur > now ? cur : now) + t;
	return 1;
}

static __always_inline void auto_update(struct eg_syn_state *st, const struct eg_syn_service *svc, __u64 now,
					struct eg_syn_counters *c)
{
	__u64 w = now >> EG_SYN_RATE_SHIFT;
	__u64 cur = st->win;

	if (w != cur) {
		/* The first SYN of a window closes the last one. Racing CPUs
		 * may both close it; SYNs counted at the crossing may be lost
		 * (the rate is low by at most a few per window). */
		__u64 n = w == cur + 1 ? st->syns : 0;

		st->win = w;
		st->syns = 0;
		if (n >= svc->off_syns)
			st->last_busy = now;
		if (st->active && n < svc->off_syns && now - st->last_busy >= svc->hold_ns)
			st->active = 0;
	}
	if (__sync_fetch_and_add(&st->syns, 1) + 1 >= svc->on_syns && !st->active) {
		st->active = 1;
		st->last_busy = now;
		count(c, EG_SYNC_ACTIVATIONS);
	}
}

static __always_inline __u16 csum_fold(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

/* The SYN-ACK's TCP header: 20 bytes and 20 of options, always the same
 * layout (unused options are NOPs), so the frame length depends only on
 * the family: MSS, NOP+wscale, SACK-permitted+timestamps (or NOPs). */
struct synack_tcp {
	__be16 source, dest;
	__be32 seq, ack_seq;
	__u8 doff_res, flags;
	__be16 window, check, urg;
	__u8 opt[20];
};

static __always_inline int answer(struct xdp_md *ctx, struct seg *s, const struct eg_syn_service *svc,
				  const struct eg_syn_secret *key, __u64 now)
{
	struct synack_tcp t = {};
	const __u16 *tab = s->v4 ? mss_v4 : mss_v6;
	__u32 cookie, mssind = 0, frame, i;
	__u16 mymss = s->v4 ? svc->mss4 : svc->mss6;
	__u64 sum = 0;
	void *data, *end;
	int delta;

	parse_options(ctx, s);
	if (!s->mss)
		s->mss = 536; /* RFC 9293 default */
	for (i = 3; i > 0; i--)
		if (s->mss >= tab[i])
			break;
	mssind = i;
	mac_words(s, s->seq, now >> EG_SYN_WINDOW_SHIFT);
	cookie = cookie_mac(key, s->mac_words) | mssind << 6 | (s->sack_ok ? 1 << 4 : 0) |
		 (s->wscale_ok ? (s->wscale > 14 ? 14 : s->wscale) : 15);

	t.source = s->dport;
	t.dest = s->sport;
	t.seq = bpf_htonl(cookie);
	t.ack_seq = bpf_htonl(s->seq + 1);
	t.doff_res = 10 << 4;
	t.flags = F_SYN | F_ACK;
	t.window = bpf_htons(65535);
	t.opt[0] = 2;
	t.opt[1] = 4;
	t.opt[2] = mymss >> 8;
	t.opt[3] = mymss & 0xff;
	t.opt[4] = 1;
	if (s->wscale_ok) {
		t.opt[5] = 3;
		t.opt[6] = 3;
		t.opt[7] = svc->wscale;
	} else {
		t.opt[5] = t.opt[6] = t.opt[7] = 1;
	}
	if (s->sack_ok) {
		t.opt[8] = 4;
		t.opt[9] = 2;
	} else {
		t.opt[8] = t.opt[9] = 1;
	}
	if (s->ts_ok) {
		/* Our timestamp: any value works (the kernel keeps the
		 * offset to its clock); milliseconds of the clock. */
		__u32 tsval = (__u32)(now / 1000000);

		t.opt[10] = 8;
		t.opt[11] = 10;
		__builtin_memcpy(&t.opt[12], &(__be32){ bpf_htonl(tsval) }, 4);
		__builtin_memcpy(&t.opt[16], &(__be32){ bpf_htonl(s->tsval) }, 4);
	} else {
		__builtin_memset(&t.opt[10], 1, 10);
	}

	/* Resize the frame to Ethernet + IP header + 40 bytes of TCP. Every
	 * byte is written below, so growing may take headroom when a driver
	 * leaves too little tailroom (small frames on veth do). */
	frame = sizeof(struct ethhdr) + (s->v4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr)) + sizeof(t);
	delta = (int)frame - (int)(ctx->data_end - ctx->data);
	if (delta < 0 && bpf_xdp_adjust_tail(ctx, delta))
		return -1;
	if (delta > 0 && bpf_xdp_adjust_tail(ctx, delta) && bpf_xdp_adjust_head(ctx, -delta))
		return -1;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;

	if (s->v4) {
		struct ethhdr *eth = data;
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) + sizeof(t) > end)
			return -1;
		__builtin_memcpy(eth->h_dest, s->smac, ETH_ALEN);
		__builtin_memcpy(eth->h_source, s->dmac, ETH_ALEN);
		eth->h_proto = bpf_htons(ETH_P_IP);
		ip->version = 4;
		ip->ihl = 5;
		ip->tos = 0;
		ip->tot_len = bpf_htons(sizeof(*ip) + sizeof(t));
		ip->id = 0;
		ip->frag_off = bpf_htons(0x4000); /* DF */
		ip->ttl = 64;
		ip->protocol = IPPROTO_TCP;
		__builtin_memcpy(&ip->saddr, &s->daddr[12], 4);
		__builtin_memcpy(&ip->daddr, &s->saddr[12], 4);
		ip->check = 0;
		ip->check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)ip, sizeof(*ip), 0));
		/* Pseudo-header: addresses, protocol, TCP length. */
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&ip->saddr, 8, 0);
		sum += bpf_htons(IPPROTO_TCP) + bpf_htons(sizeof(t));
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&t, sizeof(t), csum_fold(sum) ^ 0xffff);
		t.check = csum_fold(sum);
		__builtin_memcpy((void *)(ip + 1), &t, sizeof(t));
	} else {
		struct ethhdr *eth = data;
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) + sizeof(t) > end)
			return -1;
		__builtin_memcpy(eth->h_dest, s->smac, ETH_ALEN);
		__builtin_memcpy(eth->h_source, s->dmac, ETH_ALEN);
		eth->h_proto = bpf_htons(ETH_P_IPV6);
		*(__be32 *)ip6 = bpf_htonl(0x60000000);
		ip6->payload_len = bpf_htons(sizeof(t));
		ip6->nexthdr = IPPROTO_TCP;
		ip6->hop_limit = 64;
		__builtin_memcpy(&ip6->saddr, s->daddr, 16);
		__builtin_memcpy(&ip6->daddr, s->saddr, 16);
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&ip6->saddr, 32, 0);
		sum += bpf_htonl(sizeof(t)) + bpf_htonl(IPPROTO_TCP);
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&t, sizeof(t), csum_fold(sum) ^ 0xffff);
		t.check = csum_fold(sum);
		__builtin_memcpy((void *)(ip6 + 1), &t, sizeof(t));
	}
	return 0;
}

/* check_cookie validates an ACK's cookie for the current or the previous
 * time window, and decodes the client's options from it. */
static __always_inline int check_cookie(struct seg *s, const struct eg_syn_secret *key, __u64 now)
{
	__u32 cookie = s->ack_seq - 1, isn = s->seq - 1;
	__u32 mask = ~((1U << EG_SYN_COOKIE_BITS) - 1);
	__u64 w = now >> EG_SYN_WINDOW_SHIFT;
	__u32 ws = cookie & 15;

	if (cookie & (1 << 5))
		return -1;
	mac_words(s, isn, w);
	if (cookie_mac(key, s->mac_words) != (cookie & mask)) {
		if (!w)
			return -1;
		s->mac_words[5] = w - 1;
		if (cookie_mac(key, s->mac_words) != (cookie & mask))
			return -1;
	}
	s->mss = (s->v4 ? mss_v4 : mss_v6)[(cookie >> 6) & 3];
	s->wscale_ok = ws != 15;
	s->wscale = ws == 15 ? 0 : ws;
	s->sack_ok = (cookie >> 4) & 1;
	return 0;
}

static __always_inline int lookup_conn(struct xdp_md *ctx, struct seg *s)
{
	struct bpf_sock_tuple tup = {};
	struct bpf_sock *sk;
	__u32 size;
	int state;

	if (s->v4) {
		__builtin_memcpy(&tup.ipv4.saddr, &s->saddr[12], 4);
		__builtin_memcpy(&tup.ipv4.daddr, &s->daddr[12], 4);
		tup.ipv4.sport = s->sport;
		tup.ipv4.dport = s->dport;
		size = sizeof(tup.ipv4);
	} else {
		__builtin_memcpy(tup.ipv6.saddr, s->saddr, 16);
		__builtin_memcpy(tup.ipv6.daddr, s->daddr, 16);
		tup.ipv6.sport = s->sport;
		tup.ipv6.dport = s->dport;
		size = sizeof(tup.ipv6);
	}
	sk = bpf_skc_lookup_tcp(ctx, &tup, size, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return -1;
	state = sk->state;
	bpf_sk_release(sk);
	return state;
}

static __always_inline int out_of_state(struct eg_syn_state *st, const struct eg_syn_service *svc, __u64 now,
					struct eg_syn_counters *c)
{
	if (svc->oos_t && st && gcra(&st->oos_tat, now, svc->oos_t, svc->oos_tau)) {
		count(c, EG_SYNC_OOS_BUDGET);
		return EG_SYN_CONTINUE;
	}
	return XDP_DROP;
}

static __always_inline int decide(struct xdp_md *ctx)
{
	struct eg_syn_endpoint ep = {};
	struct eg_syn_service *svc;
	struct eg_syn_state *st;
	struct eg_syn_counters *c;
	struct eg_syn_secret *key;
	struct eg_standing_val *val;
	struct eg_standing_key sk;
	struct seg s = {};
	struct eg_lpm_key lk;
	struct eg_list_val *lv;
	__u32 *idp, id, zero = 0;
	__u64 now;
	int active, state;

	if (parse(ctx, &s) < 0)
		return EG_SYN_CONTINUE;
	__builtin_memcpy(ep.addr, s.daddr, 16);
	ep.port = s.dport;
	idp = bpf_map_lookup_elem(&syn_endpoints, &ep);
	if (!idp) {
		__builtin_memset(ep.addr, 0, 16);
		idp = bpf_map_lookup_elem(&syn_endpoints, &ep);
		if (!idp)
			return EG_SYN_CONTINUE;
	}
	id = *idp;
	svc = bpf_map_lookup_elem(&syn_services, &id);
	if (!svc || !svc->valid || svc->mode == EG_SYN_OFF)
		return EG_SYN_CONTINUE;
	st = bpf_map_lookup_elem(&syn_state, &id);
	c = bpf_map_lookup_elem(&syn_counters, &id);
	key = bpf_map_lookup_elem(&syn_secret, &zero);
	if (!st || !key)
		return EG_SYN_CONTINUE;
	now = now_ns();

	/* Deny-listed sources never get an answer (nor anything else). */
	__builtin_memcpy(lk.addr, s.saddr, 16);
	lk.prefixlen = 128;
	lv = bpf_map_lookup_elem(&lists, &lk);
	if (lv && lv->deny_until > now) {
		count(c, EG_SYNC_DENY);
		return XDP_DROP;
	}

	if ((s.flags & (F_SYN | F_ACK | F_RST | F_FIN)) == F_SYN) {
		count(c, EG_SYNC_SYN);
		if (svc->mode == EG_SYN_AUTO)
			auto_update(st, svc, now, c);
		active = svc->mode == EG_SYN_ALWAYS || (svc->mode == EG_SYN_AUTO && st->active);
		standing_key(&sk, s.saddr, s.v4);
		val = svc->validated_ns ? bpf_map_lookup_elem(&standing, &sk) : NULL;
		if (val && val->standing == EG_STANDING_VALIDATED && now - val->since < svc->validated_ns) {
			count(c, EG_SYNC_VALIDATED_PASS);
			return EG_SYN_CONTINUE;
		}
		if (!active) {
			count(c, EG_SYNC_WOULD_ANSWER);
			return EG_SYN_CONTINUE;
		}
		if (s.ip_opts) {
			count(c, EG_SYNC_BAD_SYN);
			return XDP_DROP;
		}
		if (svc->ans_t) {
			struct eg_syn_prefix_key pk = {};
			__u32 bits = s.v4 ? 96 + (svc->ans_len4 > 32 ? 32 : svc->ans_len4)
					  : (svc->ans_len6 > 128 ? 128 : svc->ans_len6);
			__u64 init = 0, *tat;

			for (int i = 0; i < 16; i++) {
				__u32 keep = bits >= 8 * (i + 1) ? 8 : (bits > 8 * i ? bits - 8 * i : 0);

				pk.addr[i] = s.saddr[i] & (__u8)(0xff00 >> keep);
			}
			pk.service = id;
			tat = bpf_map_lookup_elem(&syn_answers, &pk);
			if (!tat) {
				bpf_map_update_elem(&syn_answers, &pk, &init, BPF_NOEXIST);
				tat = bpf_map_lookup_elem(&syn_answers, &pk);
			}
			if (tat && !gcra(tat, now, svc->ans_t, svc->ans_tau)) {
				count(c, EG_SYNC_ANSWER_LIMITED);
				return XDP_DROP;
			}
		}
		if (answer(ctx, &s, svc, key, now) < 0) {
			count(c, EG_SYNC_BAD_SYN);
			return XDP_DROP;
		}
		count(c, EG_SYNC_ANSWERED);
		return XDP_TX;
	}

	/* Not a bare SYN: a known connection, a cookie, or out of state. */
	state = lookup_conn(ctx, &s);
	if (state >= 0 && state != EG_TCP_LISTEN) {
		count(c, EG_SYNC_ESTABLISHED);
		return EG_SYN_CONTINUE;
	}
	active = svc->mode == EG_SYN_ALWAYS || (svc->mode == EG_SYN_AUTO && st->active);
	if ((s.flags & (F_SYN | F_ACK | F_RST)) == F_ACK && state == EG_TCP_LISTEN && !s.ip_opts &&
	    check_cookie(&s, key, now) == 0) {
		struct eg_syn_meta *m;
		void *data;

		__u16 mss = s.mss;
		__u8 ws = s.wscale, ws_ok = s.wscale_ok, sack = s.sack_ok;

		/* The ACK's own options: only its timestamps matter. */
		parse_options(ctx, &s);
		s.mss = mss;
		s.wscale = ws;
		s.wscale_ok = ws_ok;
		s.sack_ok = sack;
		standing_key(&sk, s.saddr, s.v4);
		validate(&sk, now);
		if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(*m)))
			return XDP_DROP;
		m = (void *)(long)ctx->data_meta;
		data = (void *)(long)ctx->data;
		if ((void *)(m + 1) > data)
			return XDP_DROP;
		m->magic = EG_SYN_META_MAGIC;
		m->tsval = s.tsval;
		m->tsecr = s.tsecr;
		m->mss = s.mss;
		m->snd_wscale = s.wscale;
		m->rcv_wscale = s.wscale_ok ? svc->wscale : 0;
		m->wscale_ok = s.wscale_ok;
		m->sack_ok = s.sack_ok;
		m->tstamp_ok = s.ts_ok;
		m->service = id;
		count(c, EG_SYNC_COOKIE_VALID);
		return EG_SYN_CONTINUE;
	}
	if (svc->mode == EG_SYN_MONITOR || !active) {
		/* Counted as what it would be; the kernel answers it. */
		count(c, (s.flags & (F_SYN | F_ACK | F_RST | F_FIN)) == F_ACK ? EG_SYNC_COOKIE_INVALID : EG_SYNC_OOS_DROP);
		return EG_SYN_CONTINUE;
	}
	if (out_of_state(st, svc, now, c) == XDP_DROP) {
		count(c, (s.flags & (F_SYN | F_ACK | F_RST | F_FIN)) == F_ACK ? EG_SYNC_COOKIE_INVALID : EG_SYNC_OOS_DROP);
		return XDP_DROP;
	}
	return EG_SYN_CONTINUE;
}

SEC("xdp")
int eg_syn_xdp(struct xdp_md *ctx)
{
	int ret = decide(ctx);

	if (ret != EG_SYN_CONTINUE)
		return ret;
	bpf_tail_call(ctx, &syn_next, 0);
	/* Only without a limiter in syn_next (never once loaded): pass, as
	 * the limiter does without a policy. */
	return XDP_PASS;
}

/* The kernel's struct bpf_tcp_req_attrs (include/net/tcp.h, Linux 6.9). */
struct bpf_tcp_req_attrs {
	__u32 rcv_tsval;
	__u32 rcv_tsecr;
	__u16 mss;
	__u8 rcv_wscale;
	__u8 snd_wscale;
	__u8 ecn_ok;
	__u8 wscale_ok;
	__u8 sack_ok;
	__u8 tstamp_ok;
	__u8 usec_ts_ok;
	__u8 reserved[3];
};

/* Only its name matters: the kfunc's argument is checked by BTF name and
 * kind, and the program never reads a field. */
struct sock {
	__u8 _opaque;
};
extern int bpf_sk_assign_tcp_reqsk(struct __sk_buff *skb, struct sock *sk, struct bpf_tcp_req_attrs *attrs,
				   int attrs__sz) __ksym;

SEC("tcx/ingress")
int eg_syn_tc(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct eg_syn_meta *m = (void *)(long)skb->data_meta;
	struct bpf_tcp_req_attrs attrs = {};
	struct bpf_sock_tuple tup = {};
	struct ethhdr *eth = data;
	struct eg_syn_counters *c;
	struct bpf_sock *skc;
	struct tcp_sock *tp;
	struct tcphdr *th;
	__u32 size, id;
	int ret;

	if ((void *)(m + 1) > data || m->magic != EG_SYN_META_MAGIC)
		return TCX_NEXT;
	id = m->service;
	c = bpf_map_lookup_elem(&syn_counters, &id);
	if ((void *)(eth + 1) > end)
		return TCX_NEXT;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end || ip->ihl != 5)
			return TCX_NEXT;
		th = (void *)(ip + 1);
		if ((void *)(th + 1) > end)
			return TCX_NEXT;
		tup.ipv4.saddr = ip->saddr;
		tup.ipv4.daddr = ip->daddr;
		tup.ipv4.sport = th->source;
		tup.ipv4.dport = th->dest;
		size = sizeof(tup.ipv4);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end)
			return TCX_NEXT;
		th = (void *)(ip6 + 1);
		if ((void *)(th + 1) > end)
			return TCX_NEXT;
		__builtin_memcpy(tup.ipv6.saddr, &ip6->saddr, 16);
		__builtin_memcpy(tup.ipv6.daddr, &ip6->daddr, 16);
		tup.ipv6.sport = th->source;
		tup.ipv6.dport = th->dest;
		size = sizeof(tup.ipv6);
	} else {
		return TCX_NEXT;
	}
	attrs.rcv_tsval = m->tsval;
	attrs.rcv_tsecr = m->tsecr;
	attrs.mss = m->mss;
	attrs.rcv_wscale = m->rcv_wscale;
	attrs.snd_wscale = m->snd_wscale;
	attrs.wscale_ok = m->wscale_ok;
	attrs.sack_ok = m->sack_ok;
	attrs.tstamp_ok = m->tstamp_ok;

	skc = bpf_skc_lookup_tcp(skb, &tup, size, BPF_F_CURRENT_NETNS, 0);
	if (!skc) {
		count(c, EG_SYNC_REQSK_FAIL);
		return TCX_NEXT;
	}
	if (skc->state != EG_TCP_LISTEN) {
		/* A connection appeared since XDP looked (a retransmitted
		 * ACK racing the first): the kernel has it. */
		bpf_sk_release(skc);
		return TCX_NEXT;
	}
	tp = bpf_skc_to_tcp_sock(skc);
	if (!tp) {
		bpf_sk_release(skc);
		count(c, EG_SYNC_REQSK_FAIL);
		return TCX_NEXT;
	}
	/* Fails with -EINVAL for an MPTCP listener (Go >= 1.24 listens with
	 * MPTCP by default): counted, and the kernel answers the ACK. */
	ret = bpf_sk_assign_tcp_reqsk(skb, (struct sock *)tp, &attrs, sizeof(attrs));
	bpf_sk_release(skc);
	count(c, ret == 0 ? EG_SYNC_REQSK : EG_SYNC_REQSK_FAIL);
	return TCX_NEXT;
}
