/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Types shared by the XDP program and the Go control plane. This file is the
 * single source of truth: bpf2go generates the Go types from it (-type flags
 * in generate.go), nobody mirrors these structs by hand.
 *
 * Addresses are 16 bytes in network byte order; IPv4 is stored as the
 * IPv4-mapped IPv6 address ::ffff:a.b.c.d so one code path serves both
 * families. Prefix lengths inside the data plane are always in that 128-bit
 * space (an IPv4 /24 is 96+24 = 120).
 */
#pragma once

#include <linux/types.h>

/* Time in the data plane is kept in ticks of 1/16 ns (ktime_ns << 4): the
 * extra bits keep GCRA emission intervals exact to 0.1% up to 60 Mpps per
 * bucket while a u64 still spans 36 years of uptime. */
#define EG_TICK_SHIFT 4

/* Byte costs are (len * byte_t) >> EG_BYTE_SHIFT ticks, so byte_t can express
 * fractions of a tick per byte (100 Gbit/s is 1.28 ticks per byte). */
#define EG_BYTE_SHIFT 16

/* Counters are kept per interface slot; slot 0 counts interfaces without a
 * slot of their own. */
enum eg_sizes {
	EG_IFACE_SLOTS = 16,
	EG_IFINDEX_MAX = 65536,
	/* New-source filter: each u64 word holds an 8-bit epoch tag and two
	 * 28-bit sets of marks, the tagged epoch's and the one before it. */
	EG_SEEN_BITS = 28,
	/* Epochs are 2^30 ns (~1.07 s) of the data plane's clock. */
	EG_SEEN_EPOCH_SHIFT = 30,
	/* IPv4 direct table (struct eg_v4_entry): level 1 is indexed by the
	 * top 16 bits of the address, then up to four levels of 16-entry
	 * chunks by 4 bits each (16 + 4 * 4 = 32). A chunk is 128 bytes, two
	 * cache lines. */
	EG_V4_L1_BITS = 16,
	EG_V4_L1_ENTRIES = 65536,
	EG_V4_STRIDE = 4,
	EG_V4_CHUNK_ENTRIES = 16,
	EG_V4_LEVELS = 4,
	/* Samples carry the first EG_SNAP_LEN bytes of their frame (struct
	 * eg_sample.frame) for edgectl capture: Ethernet, two VLAN tags, an
	 * IPv6 header and a TCP header with 32 bytes of options (14 + 8 + 40
	 * + 52 = 114) fit, with the start of the payload. */
	EG_SNAP_LEN = 128,
};

/* "Never expires" for list entries. */
#define EG_FOREVER 0xffffffffffffffffULL

enum eg_action {
	EG_ACT_PASS = 0,
	EG_ACT_DROP = 1,
	EG_ACT_WOULD_DROP = 2, /* dry-run: counted as a drop, passed */
	EG_ACT_MAX = 3,
};

/* Why a packet got its verdict. Every packet is counted under exactly one
 * (action, reason) pair. */
enum eg_reason {
	EG_R_OK = 0,         /* passed every limit of its rule */
	EG_R_NON_IP = 1,     /* ARP, LLDP, ...: always passed, never limited */
	EG_R_NO_POLICY = 2,  /* no policy loaded yet: passed */
	EG_R_ALLOW_LIST = 3,      /* allow list: passed without limiting */
	EG_R_DENY_LIST = 4,       /* deny list */
	EG_R_SOURCE_LIMIT = 5,  /* per-source bucket empty */
	EG_R_PREFIX_LIMIT = 6, /* prefix aggregate bucket empty */
	EG_R_ASN_LIMIT = 7,  /* ASN aggregate bucket empty */
	EG_R_GLOBAL_LIMIT = 8, /* global bucket empty */
	EG_R_BAD_ETHERNET = 9,    /* frame shorter than an Ethernet header */
	EG_R_BAD_VLAN = 10,  /* truncated VLAN tag, or more than two tags */
	EG_R_BAD_IPV4 = 11,  /* IPv4 header cut off by the frame, IHL < 5, bad version */
	EG_R_BAD_IPV6 = 12,  /* IPv6 header cut off by the frame, an extension header
			      * cut off by the payload length, AH shorter than 12
			      * bytes, v4-mapped source */
	EG_R_BAD_L4 = 13,    /* TCP (with its options, data offset >= 5), UDP or
			      * ICMP header cut off by the end of the datagram */
	EG_R_RULE_DROP = 14, /* the rule's action is drop */
	EG_R_RULE_PASS = 15, /* the rule's action is pass: no limiting */
	EG_R_BAD_IP_LENGTH = 16, /* IPv4 total length < IHL * 4, or the datagram
			       * (IPv4 total length, IPv6 40 + payload length)
			       * runs past the end of the frame */
	EG_R_ICMP_WRONG_FAMILY = 17, /* ICMP under the wrong IP family: IPv4 protocol
				* 58 (ICMPv6), IPv6 next header 1 (ICMP) */
	EG_R_FINGERPRINT = 18, /* a fingerprint rule's bucket is empty (adaptive shield) */
	/* An aggregate refused the packet under an override (docs/operations.md,
	 * "Drop reasons"): its budget part was in force, or its new-source part
	 * refused; named by that part's writer, so that the policy's own
	 * *_limit reasons count only the operator's budgets. */
	EG_R_SHIELD_TIGHTEN = 19, /* written by the adaptive shield */
	EG_R_FLEET_SHARE = 20,    /* written by fleet mode (this host's share) */
	EG_R_OVERRIDE = 21,       /* written by anyone else (edgectl) */
	EG_R_MAX = 22,
};

enum eg_mode {
	EG_MODE_INHERIT = 0, /* rules only: use the global mode */
	EG_MODE_ENFORCE = 1,
	EG_MODE_DRY_RUN = 2,
};

/* Which kernel clock drives a generation's buckets (eg_config.clock). */
enum eg_clock {
	/* bpf_ktime_get_ns: CLOCK_MONOTONIC, read from the clock source on
	 * every packet (~25-30 ns on kvm-clock). The default. */
	EG_CLOCK_PRECISE = 0,
	/* bpf_ktime_get_coarse_ns: CLOCK_MONOTONIC at the last tick (1/HZ).
	 * Never ahead of the precise clock; behind it by less than a tick
	 * while the CPU is busy, a few ticks after idle or when the
	 * timekeeping CPU stalls. Cheap: no clock source read. */
	EG_CLOCK_COARSE = 1,
};

enum eg_rule_action {
	EG_RULE_LIMIT = 0, /* apply the rule's buckets */
	EG_RULE_DROP = 1,  /* drop every packet of the rule */
	EG_RULE_PASS = 2,  /* pass every packet of the rule, unlimited */
};

enum eg_agg_mode {
	EG_AGG_NONE = 0,
	EG_AGG_WHOLE = 1,   /* all sources of the rule share one bucket */
	EG_AGG_DERIVED = 2, /* every source masked to agg_len gets a bucket */
};

/* Kinds of aggregate, in aggregate keys (agg_buckets keys only use PREFIX
 * and ASN: whole and global buckets are arrays; overrides and aggregate
 * counters name all four). */
enum eg_agg_kind {
	EG_AGG_KIND_PREFIX = 1, /* a derived prefix aggregate: rule + masked source */
	EG_AGG_KIND_ASN = 2,    /* rule + ASN */
	EG_AGG_KIND_WHOLE = 3,  /* a whole aggregate: rule */
	EG_AGG_KIND_GLOBAL = 4, /* the global bucket: rule id 0 */
	EG_AGG_KIND_MAX = 5,
};

enum eg_l4_dir {
	EG_L4_ANY = 0, /* protocol alone */
	EG_L4_SRC = 1, /* source port */
	EG_L4_DST = 2, /* destination port (ICMP: the type) */
};

/* Key of both LPM tries (lists and prefix facts). */
struct eg_lpm_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/* Lists trie value. The control plane folds inheritance in: an entry under a
 * deny ancestor carries that ancestor's deny_until, so the most specific
 * match is always the whole answer. 0 = not set, EG_FOREVER = no expiry,
 * else CLOCK_MONOTONIC ns. */
struct eg_list_val {
	__u64 deny_until;
	__u64 allow_until;
	__u32 origin; /* who added it: policy, cli, l7 (see eg_origin) */
	__u32 _pad;
};

enum eg_origin {
	EG_ORIGIN_POLICY = 0,
	EG_ORIGIN_CLI = 1,
	EG_ORIGIN_L7 = 2,
	EG_ORIGIN_SHIELD = 3, /* the adaptive shield (overrides, fingerprints) */
	EG_ORIGIN_FLEET = 4,  /* fleet mode (shares, shared lists) */
};

/* Prefix facts trie value: everything the control plane knows about a
 * source prefix, most specific wins (rule prefix, ASN range, country). */
struct eg_prefix_val {
	__u32 rule_slot;
	__u32 asn;
	__u16 country; /* two ASCII letters, first in the high byte; 0 = unknown */
	__u16 _pad0;
	__u32 _pad1;
};

/* "This entry is a chunk": a rule slot that never names a rule (slots are
 * below max_rules, unknown rules are 0xffffffff). */
#define EG_V4_CHILD 0xfffffffeU

/* One entry of the IPv4 direct table, the compiled form of the prefix facts
 * for IPv4 sources: either the answer of the most specific fact covering
 * the entry's addresses (rule slot and ASN; 0/0 when none does), or, when
 * rule_slot is EG_V4_CHILD, the index of the chunk one level down in asn
 * (an index into v4_chunks in units of chunks, generation included). */
struct eg_v4_entry {
	__u32 rule_slot;
	__u32 asn;
};

struct eg_l4_key {
	__u8 gen;
	__u8 proto; /* IPPROTO_* */
	__u8 dir;   /* enum eg_l4_dir */
	__u8 _pad0;
	__u16 port; /* host byte order */
	__u16 _pad1;
};

/* GCRA parameters of one bucket. pkt_t: ticks per packet; byte_t: ticks per
 * byte << EG_BYTE_SHIFT; *_tau: burst tolerance in ticks (burst * t). A zero
 * t means "no limit" for that dimension. */
struct eg_bucket_cfg {
	__u64 pkt_t;
	__u64 pkt_tau;
	__u64 byte_t;
	__u64 byte_tau;
};

struct eg_rule {
	struct eg_bucket_cfg src;
	struct eg_bucket_cfg agg;
	struct eg_bucket_cfg asn;
	__u32 id;
	__u8 src_len4; /* per-source key length, 0-32 */
	__u8 src_len6; /* 0-128, default 64 */
	__u8 agg_len4;
	__u8 agg_len6;
	__u8 agg_mode; /* enum eg_agg_mode */
	__u8 mode;     /* enum eg_mode */
	__u8 valid;
	__u8 action; /* enum eg_rule_action */
	/* Share of the prefix and ASN aggregates' burst tolerance that only
	 * established and validated sources may use, in 1/65536 (0: off).
	 * Held in what was padding, so the layout (and pinned maps) stay. */
	__u16 reserve;
	__u8 _pad[2];
};

/* Settings of one policy generation. */
struct eg_config {
	struct eg_bucket_cfg global;
	struct eg_bucket_cfg sample; /* drop-sample ring buffer budget (pkt_t/pkt_tau) */
	__u8 mode;              /* enum eg_mode: ENFORCE or DRY_RUN */
	__u8 malformed_verdict; /* enum eg_action: PASS or DROP */
	__u8 l4_protos;         /* bit per protocol with L4 rules (EG_L4P_*) */
	__u8 valid;
	/* 1: IPv4 sources are looked up in this generation's direct table
	 * (v4_l1, v4_chunks), not the prefix trie. 0 when the control plane
	 * chose the trie, or the table did not fit. */
	__u8 v4_direct;
	__u8 clock; /* enum eg_clock */
	/* The global bucket's reserve, as eg_rule.reserve. */
	__u16 reserve;
};

#define EG_L4P_TCP (1 << 0)
#define EG_L4P_UDP (1 << 1)
#define EG_L4P_ICMP (1 << 2)
#define EG_L4P_ICMPV6 (1 << 3)

/* Which generation is live; flipped last, after the new generation's rules,
 * config, L4 entries and prefix trie are all in place. */
struct eg_active {
	__u32 gen;
	__u32 _pad;
};

/* Bucket state: GCRA theoretical arrival times, in ticks. */
struct eg_bucket {
	__u64 pkt_tat;
	__u64 byte_tat;
};

/* A per-source bucket (src_buckets): its GCRA state, and a count of the
 * packets that reached it (a plain increment on the line the CAS already
 * wrote: approximate when one source's packets land on several CPUs at
 * once, a lost increment undercounts by one). Standing reads it once per
 * epoch to learn the source's rate (docs/operations.md, "Usual rate"). */
struct eg_src_bucket {
	struct eg_bucket b;
	__u32 pkts;
	__u32 _pad;
};

struct eg_src_key {
	__u32 rule_id;
	__u32 _pad;
	__u8 addr[16];
};

struct eg_agg_key {
	__u32 rule_id;
	__u8 kind; /* enum eg_agg_kind */
	__u8 len;  /* prefix length in the 128-bit space, 0 for ASN */
	__u16 _pad0;
	__u32 asn;
	__u32 _pad1;
	__u8 addr[16];
};

enum eg_global_slot {
	EG_GLOBAL_BUCKET = 0,
	EG_SAMPLE_BUCKET = 1,
	EG_GLOBAL_SLOTS = 2,
};

struct eg_counter {
	__u64 packets;
	__u64 bytes;
};

struct eg_rule_counters {
	struct eg_counter by_action[EG_ACT_MAX];
};

/* Which sampler sent a sample. */
enum eg_sample_kind {
	/* A dropped (or would-drop) packet, within the drop-sample budget
	 * (eg_config.sample): top talkers, explain. Ring buffer samples. */
	EG_SAMPLE_DROP = 0,
	/* A packet chosen 1 in one_in at random, passed or dropped, within
	 * the sampler's cap (eg_sample_cfg): rate estimates. Ring buffer
	 * rate_samples. */
	EG_SAMPLE_RATE = 1,
};

/* One sampled packet. */
struct eg_sample {
	__u64 ktime_ns;
	__u8 addr[16];
	__u32 asn;
	__u32 rule_slot;
	__u16 len; /* the frame's length */
	__u16 dport;
	__u16 sport;
	__u8 proto;
	__u8 reason;
	__u8 action;
	__u8 kind;      /* enum eg_sample_kind */
	__u8 ttl;       /* TTL or hop limit */
	__u8 tcp_flags; /* 0 for other protocols */
	__u16 ip_len;   /* IP total length (IPv6: 40 + payload length) */
	/* EG_CO_REFUSED_RESERVE or _FULL when an aggregate (reason) refused
	 * the packet, else 0; cls is the source's enum eg_class there
	 * (EG_CLASS_UNKNOWN: standing not looked up, as for every packet no
	 * aggregate refused). Both samplers. */
	__u8 refused;
	__u8 cls;
	/* EG_SAMPLE_RATE: how many packets this sample stands for: one_in,
	 * times one more for each chosen packet this CPU could not send since
	 * its last sample (cap or ring buffer full). Sum of weights over an
	 * interval / interval = the rate. 0 for drop samples. */
	__u32 weight;
	/* The frame's first cap_len bytes (at most EG_SNAP_LEN, fewer for a
	 * shorter frame; 0: not copied). Bytes past cap_len are not written. */
	__u16 cap_len;
	__u8 has_rule; /* 1: rule_slot is the packet's rule; 0: no rule yet (lists, malformed, no policy) */
	/* With refused: the enum eg_class_agg of the aggregate that refused.
	 * The reason says it too for prefix/asn/global_limit, not for an
	 * override's (shield_tighten, fleet_share, override). */
	__u8 refused_agg;
	__u8 frame[EG_SNAP_LEN];
};

/* The 1-in-N sampler's settings of one generation (sample_cfgs[gen]). */
struct eg_sample_cfg {
	struct eg_bucket_cfg cap; /* samples per second sent at most (pkt_t/pkt_tau) */
	__u32 thresh;             /* a packet is chosen when eg_rand < thresh; 0: off */
	__u32 one_in;             /* N: thresh = 2^32 / N, rounded down */
};

/* The 1-in-N sampler's per-CPU state and counters (rate_sample_stats). */
struct eg_rsample_stats {
	__u64 chosen;  /* packets chosen */
	__u64 sent;    /* samples sent */
	__u64 capped;  /* chosen, not sent: over the cap */
	__u64 lost;    /* chosen, not sent: ring buffer full */
	__u64 pending; /* chosen and not sent since this CPU's last sample */
	/* This CPU's random state (a 64-bit LCG; 0: not seeded yet), for the
	 * sampler's and the penalty sample's draws: a few instructions per
	 * packet, where a helper call costs a mispredicted return. */
	__u64 rng;
};

/* ---- Aggregate overrides (docs/operations.md, "Aggregate overrides") ----
 *
 * An override is what the shield or fleet mode decided for one aggregate
 * (keyed by struct eg_agg_key, rule id not slot) since the policy was
 * applied: a replacement budget, and/or a bucket only new and penalised
 * sources are charged against. Written directly by the daemon, no
 * generation swap; ignored once expired, deleted by the daemon. */
struct eg_override {
	/* Each part is in force until its own expiry (CLOCK_MONOTONIC ns;
	 * EG_FOREVER: never; 0: no such part), so parts written by different
	 * origins expire apart: expires is the budget part's, new_expires the
	 * new-source part's. */
	__u64 expires;
	__u64 new_expires;
	/* Replaces the aggregate's budget for every class; zero pkt_t and
	 * byte_t: the policy's budget. */
	struct eg_bucket_cfg budget;
	/* Charged only by new and penalised sources, in addition to the
	 * aggregate's bucket; zero: none. */
	struct eg_bucket_cfg new_budget;
	struct eg_bucket new_bucket; /* new_budget's GCRA state (CAS'd) */
	/* The parts' writers (enum eg_origin): the budget part's in bits 0-7,
	 * the new-source part's in bits 8-15. */
	__u32 origin;
	__u32 _pad;
};

/* Per-instance counters of watched aggregates (agg_stats, per CPU). Every
 * packet of a limit rule that reaches the buckets is counted once per
 * watched aggregate on its path: passed, or refused by any bucket
 * (would-drops included). */
struct eg_agg_stats {
	struct eg_counter passed;
	struct eg_counter dropped;
};

/* "Count every instance of this rule's aggregate kind" (agg_watches key). */
struct eg_watch_key {
	__u32 rule_id; /* rule id, 0 for kind global */
	__u32 kind;    /* enum eg_agg_kind */
};

/* agg_gate[slot]: which lookups a packet of the rule in that slot makes.
 * Bit 1 << kind: an override of that kind may exist for the rule; bit
 * 1 << (EG_GATE_WATCH_SHIFT + kind): the rule's instances of that kind are
 * counted. Global bits are set in every slot. All zero: no lookup. */
enum eg_gate {
	EG_GATE_WATCH_SHIFT = 8,
};

/* ---- Fingerprint rules (docs/operations.md, "Fingerprint rules") ----
 *
 * A fingerprint matches header fields (those in its mask) and has its own
 * bucket. Fingerprints are grouped by mask, at most EG_FP_MAX_MASKS, each in
 * a slot; a mask costs one hash lookup for a packet the prefilter (below)
 * cannot rule out of its slot; none installed, one array load. */
enum eg_fp_field {
	EG_FP_PROTO = 1 << 0,
	EG_FP_DPORT = 1 << 1, /* ICMP: the type */
	EG_FP_SPORT = 1 << 2,
	EG_FP_LEN = 1 << 3, /* IP total length */
	EG_FP_TTL = 1 << 4, /* TTL or hop limit */
	EG_FP_TCP_FLAGS = 1 << 5,
	EG_FP_SRC = 1 << 6, /* source prefix of src_len (128-bit space) */
	EG_FP_ALL = (1 << 7) - 1,
	EG_FP_MAX_MASKS = 8,
	/* The prefilter (fp_pre_words, u64 words): which mask slots may match a
	 * packet, so that a packet no fingerprint can match costs one load
	 * per field instead of one hash lookup per mask. Word 0 is the
	 * header, one byte each (bit i: mask slot i): EG_FP_PRE_H_USED, the
	 * slots with fingerprints; then per field, the slots that cannot be
	 * filtered on it (their mask lacks the field, or for src a prefix
	 * the index cannot cover). Then one region per field: the byte of
	 * value v is byte v & 7 of word base + (v >> 3), the slots with a
	 * fingerprint of that value. A packet's candidate slots are USED
	 * ANDed, per field, with (its value's byte | the field's header
	 * byte). src values are a 16-bit index of the address: IPv4-mapped
	 * (a[13] << 8 | a[12]), otherwise (a[1] << 8 | a[0]) ^ (a[3] << 8 |
	 * a[2]); a fingerprint's prefix is covered if IPv4 of at least /16
	 * or IPv6 of at least /32 with a nonzero first 32 bits. */
	EG_FP_PRE_H_USED = 0,
	EG_FP_PRE_H_DPORT = 1,
	EG_FP_PRE_H_SPORT = 2,
	EG_FP_PRE_H_LEN = 3,
	EG_FP_PRE_H_TTL = 4,
	EG_FP_PRE_H_TCP_FLAGS = 5,
	EG_FP_PRE_H_SRC = 6,
	EG_FP_PRE_H_PROTO = 7,
	EG_FP_PRE_DPORT = 1,                      /* 65,536 values */
	EG_FP_PRE_SPORT = EG_FP_PRE_DPORT + 8192, /* 65,536 values */
	EG_FP_PRE_LEN = EG_FP_PRE_SPORT + 8192,   /* 65,536 values */
	EG_FP_PRE_SRC = EG_FP_PRE_LEN + 8192,     /* 65,536 index values */
	EG_FP_PRE_TTL = EG_FP_PRE_SRC + 8192,     /* 256 values */
	EG_FP_PRE_TCP_FLAGS = EG_FP_PRE_TTL + 32, /* 256 values */
	EG_FP_PRE_PROTO = EG_FP_PRE_TCP_FLAGS + 32,
	EG_FP_PRE_WORDS = EG_FP_PRE_PROTO + 32,
};

/* The prefilter as one value (fp_pre_words, a single array entry): the
 * program reads any word at a bounded offset of one pointer, with no
 * lookup and no null check per field. */
struct eg_fp_pre {
	__u64 w[EG_FP_PRE_WORDS];
};

/* fp_rules key: the mask and the packet's fields under it (others zero). */
struct eg_fp_key {
	__u32 fields;  /* enum eg_fp_field bits */
	__u8 src_len;  /* with EG_FP_SRC, else 0 */
	__u8 proto;
	__u8 ttl;
	__u8 tcp_flags;
	__u16 dport;
	__u16 sport;
	__u16 len;
	__u16 _pad;
	__u8 addr[16]; /* masked to src_len */
};

struct eg_fp_val {
	struct eg_bucket_cfg budget; /* zero: every match is refused (unless dry_run) */
	struct eg_bucket bucket;
	__u64 expires; /* CLOCK_MONOTONIC ns */
	__u32 id;
	__u32 origin; /* enum eg_origin */
	__u8 dry_run; /* count would-drops, never drop */
	__u8 _pad[7];
};

/* The masks in use (fp_masks, one entry), by slot: a mask keeps its slot
 * while it has fingerprints (the prefilter's bits name slots); a free slot
 * has fields 0 and a new mask takes the lowest free one. n: slots below it
 * may be in use. */
struct eg_fp_masks {
	__u32 n;
	__u32 fields[EG_FP_MAX_MASKS];
	__u8 src_len[EG_FP_MAX_MASKS];
};

/* Per-fingerprint counters (fp_stats, per CPU, keyed by id). */
struct eg_fp_stats {
	struct eg_counter matched;
	struct eg_counter dropped; /* would-drops for dry-run ones; validated sources are never dropped */
	struct eg_counter spared;  /* refused by the bucket but validated: passed */
};

/* Source standing (docs/operations.md, "Standing"): what the data plane
 * knows of a source address (IPv4 /32, IPv6 /64), kept in the standing map,
 * which is a plain hash, not an LRU, so a flood of new sources cannot evict
 * the sources that earned their standing. */
enum eg_standing {
	EG_STANDING_NEW = 0,         /* no entry, or not yet established */
	EG_STANDING_ESTABLISHED = 1, /* clean history for established_after */
	EG_STANDING_VALIDATED = 2,   /* proved not spoofed (TCP handshake, L7 promotion) */
	EG_STANDING_PENALISED = 3,   /* exceeded its own limit, escalated or denied */
	EG_STANDING_MAX = 4,
};

/* Why a source's standing last changed. */
enum eg_standing_why {
	EG_WHY_NONE = 0,
	EG_WHY_FIRST_SEEN = 1,   /* entry created: a packet admitted as new */
	EG_WHY_CLEAN_HISTORY = 2,        /* clean history for established_after */
	EG_WHY_OWN_LIMIT = 3,    /* exceeded its own (per-source) limit */
	EG_WHY_DENY_LIST = 4,         /* deny-listed (CLI, policy, L7 escalation) */
	EG_WHY_PENALTY_OVER = 5,      /* penalty over: new again */
	EG_WHY_KNOWN_GOOD = 6,       /* standing.known_good */
	EG_WHY_L7_PROMOTION = 7,           /* promoted by the L7 stage */
	EG_WHY_CONGESTED = 8,    /* history restarted: seen while congested */
	EG_WHY_SET = 9,          /* set by the operator (edgectl) */
	EG_WHY_TCP_HANDSHAKE = 10,         /* its TCP connection is ESTABLISHED on this host */
	EG_WHY_MAX = 11,
};

struct eg_standing_key {
	__u8 addr[16]; /* IPv4 /32 as ::ffff:a.b.c.d, IPv6 masked to /64 */
};

/* Times are CLOCK_MONOTONIC ns. */
struct eg_standing_val {
	__u64 since;       /* when the current standing began */
	__u64 clean_since; /* NEW: start of the clean history that counts */
	__u64 last_seen;   /* last update (at most one per source per epoch) */
	/* Rates (docs/operations.md, "Usual rate"), in packets/s << EG_RATE_SHIFT:
	 * usual is a decayed peak of the measured rates (frozen while jumped),
	 * current the last measured one, over rate_at's interval. */
	__u64 rate_at;  /* when the rate was last measured (0: never) */
	__u64 usual_at; /* usual's decay clock (whole decay steps) */
	/* The personal budget's GCRA word (docs/operations.md, "Personal
	 * budget"), in ticks: charged only when the source's class is looked
	 * up (a packet in an aggregate's reserve band). */
	__u64 budget_tat;
	__u32 usual;
	__u32 current;
	/* mean is the source's mean rate over up to rate_history, measured
	 * only while uncongested (same fixed point as usual); mean_w the
	 * weight it has, in ms (at most rate_history). */
	__u32 mean;
	__u32 mean_w;
	__u32 src_mark; /* the source bucket's pkts at rate_at */
	__u32 pkts;     /* packets counted at its standing lookup (not at its bucket) */
	__u32 pkts_mark; /* pkts at rate_at */
	__u8 standing;  /* enum eg_standing */
	__u8 why;       /* enum eg_standing_why */
	__u8 jumped;    /* current > jump_factor x usual (and > jump_min) */
	__u8 held;      /* current was measured while congested: it never joins usual */
};

/* Standing settings of one policy generation (standing_cfg[gen]). */
struct eg_standing_cfg {
	__u64 established_after_ns; /* 0: standing off, nobody is promoted */
	__u64 penalty_ns;
	/* Usual rate and jumps (standing.rate_history, jump_factor,
	 * jump_min): half-life in ms (0: rates off), factor << 4, minimum
	 * rate in packets/s << EG_RATE_SHIFT. */
	__u32 rate_half_life_ms;
	__u32 jump_factor16;
	__u32 jump_min;
	/* Personal budget (standing.personal_budget): headroom x 16 over the
	 * mean rate (0: personal budgets off, privileged sources are not
	 * metered); the default budget in packets/s << EG_RATE_SHIFT for a
	 * source without a measured mean, and the least one of a vouched
	 * source (known_good, validated); the burst in the source's busiest
	 * seconds (standing.personal_budget.burst_seconds). */
	__u32 headroom16;
	__u32 default_rate;
	__u32 burst_seconds;
};

/* Fixed point of the standing rates (eg_standing_val.usual, current). */
#define EG_RATE_SHIFT 4

/* Admission classes in an aggregate bucket, for the class counters. UNKNOWN
 * is a packet admitted below the reserve band: its standing was not looked
 * up, which is what keeps an uncongested aggregate's cost unchanged. */
enum eg_class {
	EG_CLASS_NEW = 0,
	EG_CLASS_ESTABLISHED = 1,
	EG_CLASS_VALIDATED = 2,
	EG_CLASS_PENALISED = 3,
	/* An established or validated source (or known_good) over its
	 * personal budget: this packet is charged as new. */
	EG_CLASS_OVER_BUDGET = 4,
	EG_CLASS_UNKNOWN = 5,
	EG_CLASS_MAX = 6,
};

/* Aggregates the class counters are kept for. */
enum eg_class_agg {
	EG_CAGG_PREFIX = 0, /* per_prefix, derived or whole */
	EG_CAGG_ASN = 1,
	EG_CAGG_GLOBAL = 2,
	EG_CAGG_MAX = 3,
};

/* What happened to a packet at an aggregate that was congested (its level
 * past half the new-source tolerance, or refusing). */
enum eg_class_outcome {
	EG_CO_ADMITTED = 0,        /* admitted below the reserve band */
	EG_CO_ADMITTED_RESERVE = 1, /* admitted inside the band (established, validated) */
	EG_CO_REFUSED_RESERVE = 2, /* refused by the reserve (new, penalised) */
	EG_CO_REFUSED_FULL = 3,    /* refused: the whole tolerance was used */
	EG_CO_MAX = 4,
};

/* Standing table events (standing_stats index). */
enum eg_standing_event {
	EG_SE_CREATED = 0,     /* entries created */
	EG_SE_FULL = 1,        /* creations refused: table full */
	EG_SE_ESTABLISHED = 2, /* promotions new -> established */
	EG_SE_PENALISED = 3,   /* penalties */
	EG_SE_VALIDATED = 4,   /* validations by a completed TCP handshake */
	EG_SE_JUMPED = 5,      /* established sources whose rate jumped (charged as new in a shielded aggregate) */
	EG_SE_MAX = 6,
};

/* Shifts of the data plane's fixed-point time and byte costs, as an enum so
 * that bpf2go hands them to Go (EG_TICK_SHIFT, EG_BYTE_SHIFT above). */
enum eg_shifts {
	EG_SHIFT_TICK = EG_TICK_SHIFT,
	EG_SHIFT_BYTE = EG_BYTE_SHIFT,
	EG_SHIFT_RATE = EG_RATE_SHIFT,
};

/* L4 protocol bits of eg_config.l4_protos, for Go. */
enum eg_l4_proto_bit {
	EG_L4BIT_TCP = EG_L4P_TCP,
	EG_L4BIT_UDP = EG_L4P_UDP,
	EG_L4BIT_ICMP = EG_L4P_ICMP,
	EG_L4BIT_ICMPV6 = EG_L4P_ICMPV6,
};

/* "Never expires" (EG_FOREVER), for Go. */
enum eg_expiry {
	EG_EXPIRY_FOREVER = EG_FOREVER,
};

/* The IPv4 direct table's chunk mark (EG_V4_CHILD), for Go. */
enum eg_v4_mark {
	EG_V4_MARK_CHILD = EG_V4_CHILD,
};
