/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Map definitions. The maps marked LIBBPF_PIN_BY_NAME are the ones a
 * daemon pins (internal/loader) because they must survive a restart: the
 * policy generations and their tables (a generation's config says whether
 * it uses the IPv4 direct table, so that table outlives a restart with
 * it), buckets and counters; the new-source filter (it defers a new
 * source's first charge to its next packet: empty after a restart, every
 * source, limited ones included, would get one packet through); standing
 * (or every established user would be new again after a restart);
 * overrides and fingerprint rules (in force across a crash until they
 * expire), the gate and the watched aggregates' counters; the sampler's
 * settings, cap, counters and ring buffers. Not pinned: test_clock and
 * the per-CPU scratch maps.
 *
 * Sizes: the tables the policy sizes (tables: in the policy file) have
 * their one default in Go, internal/policy DefaultTables; the loader sets
 * their max_entries at load time. The EG_DEFAULT_* below are only the
 * object's fallbacks, equal to those defaults (a loader test checks it
 * through enum eg_table_defaults). The other EG_DEFAULT_* are fixed sizes,
 * read by Go through the same enum.
 */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "edgeguard_types.h"

#ifndef EG_DEFAULT_MAX_RULES
#define EG_DEFAULT_MAX_RULES 1024
#endif
#ifndef EG_DEFAULT_SRC_ENTRIES
#define EG_DEFAULT_SRC_ENTRIES 1048576
#endif
#ifndef EG_DEFAULT_AGG_ENTRIES
#define EG_DEFAULT_AGG_ENTRIES 65536
#endif
#ifndef EG_DEFAULT_PREFIX_ENTRIES
#define EG_DEFAULT_PREFIX_ENTRIES 1048576
#endif
#ifndef EG_DEFAULT_LIST_ENTRIES
#define EG_DEFAULT_LIST_ENTRIES 65536
#endif
#ifndef EG_DEFAULT_V4_CHUNKS
#define EG_DEFAULT_V4_CHUNKS 262144
#endif
#ifndef EG_DEFAULT_STANDING_ENTRIES
#define EG_DEFAULT_STANDING_ENTRIES 262144
#endif
#ifndef EG_DEFAULT_KNOWN_GOOD_ENTRIES
#define EG_DEFAULT_KNOWN_GOOD_ENTRIES 16384
#endif
#ifndef EG_DEFAULT_OVERRIDE_ENTRIES
#define EG_DEFAULT_OVERRIDE_ENTRIES 4096
#endif
#ifndef EG_DEFAULT_AGG_STATS_ENTRIES
#define EG_DEFAULT_AGG_STATS_ENTRIES 4096
#endif
#ifndef EG_DEFAULT_L4_ENTRIES
#define EG_DEFAULT_L4_ENTRIES 1024
#endif

/* The sizes above as an enum, which bpf2go carries to Go
 * (LimiterEgTableDefaults*, and internal/bpfsizes for the policy, which
 * must not import the loader). */
enum eg_table_defaults {
	/* Sized by the policy's tables: section. */
	EG_TBL_MAX_RULES = EG_DEFAULT_MAX_RULES,
	EG_TBL_SRC_ENTRIES = EG_DEFAULT_SRC_ENTRIES,
	EG_TBL_AGG_ENTRIES = EG_DEFAULT_AGG_ENTRIES,
	EG_TBL_PREFIX_ENTRIES = EG_DEFAULT_PREFIX_ENTRIES,
	EG_TBL_LIST_ENTRIES = EG_DEFAULT_LIST_ENTRIES,
	EG_TBL_V4_CHUNKS = EG_DEFAULT_V4_CHUNKS,
	EG_TBL_STANDING_ENTRIES = EG_DEFAULT_STANDING_ENTRIES,
	/* Fixed: the loader's L4 entries per generation (no policy field),
	 * standing.known_good's capacity, the overrides table and the
	 * watched aggregates' counters. */
	EG_TBL_L4_ENTRIES = EG_DEFAULT_L4_ENTRIES,
	EG_TBL_KNOWN_GOOD_ENTRIES = EG_DEFAULT_KNOWN_GOOD_ENTRIES,
	EG_TBL_OVERRIDE_ENTRIES = EG_DEFAULT_OVERRIDE_ENTRIES,
	EG_TBL_AGG_STATS_ENTRIES = EG_DEFAULT_AGG_STATS_ENTRIES,
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct eg_active);
} active SEC(".maps");

/* One config per generation, indexed by gen. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct eg_config);
} configs SEC(".maps");

/* Rules of both generations: index gen * max_rules + the rule's slot. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 2 * EG_DEFAULT_MAX_RULES);
	__type(key, __u32);
	__type(value, struct eg_rule);
} rules SEC(".maps");

/* Deny and allow lists, with expiry; changed entry by entry at run time. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_DEFAULT_LIST_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct eg_lpm_key);
	__type(value, struct eg_list_val);
} lists SEC(".maps");

/* Prefix facts (rule, ASN, country) per generation: the control plane builds
 * a whole new trie, puts it into the inactive slot, then flips the gen. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 2);
	__type(key, __u32);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);
		__uint(max_entries, EG_DEFAULT_PREFIX_ENTRIES);
		__uint(map_flags, BPF_F_NO_PREALLOC);
		__type(key, struct eg_lpm_key);
		__type(value, struct eg_prefix_val);
	});
} prefix_gens SEC(".maps");

/* IPv4 direct table, level 1: one entry per /16, index gen * 65536 + the
 * address's top 16 bits. Written whole for a generation that uses it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 2 * EG_V4_L1_ENTRIES);
	__type(key, __u32);
	__type(value, struct eg_v4_entry);
} v4_l1 SEC(".maps");

/* IPv4 direct table, levels 2-5: chunks of EG_V4_CHUNK_ENTRIES entries;
 * generation gen owns chunks gen * n .. gen * n + n - 1, where n is the
 * loader's V4Chunks (max_entries is 2 * n * EG_V4_CHUNK_ENTRIES). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 2 * EG_DEFAULT_V4_CHUNKS * EG_V4_CHUNK_ENTRIES);
	__type(key, __u32);
	__type(value, struct eg_v4_entry);
} v4_chunks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 2 * EG_DEFAULT_L4_ENTRIES);
	__type(key, struct eg_l4_key);
	__type(value, __u32);
} l4_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_DEFAULT_SRC_ENTRIES);
	__type(key, struct eg_src_key);
	__type(value, struct eg_src_bucket);
} src_buckets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_DEFAULT_AGG_ENTRIES);
	__type(key, struct eg_agg_key);
	__type(value, struct eg_bucket);
} agg_buckets SEC(".maps");

/* Whole aggregates (per_prefix group: whole): one bucket per rule, indexed
 * by the rule's table slot (< eg_max_rules), shared by both generations.
 * An array, not an agg_buckets entry, so a flood's drop costs an inlined
 * bounds check instead of a 32-byte hash and a bucket walk. A surviving
 * rule keeps its slot across reloads (internal/maps Apply), so its bucket
 * keeps its state; the control plane zeroes a slot's bucket when the slot
 * changes hands. Sized to the loader's MaxRules. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_DEFAULT_MAX_RULES);
	__type(key, __u32);
	__type(value, struct eg_bucket);
} whole_buckets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_GLOBAL_SLOTS);
	__type(key, __u32);
	__type(value, struct eg_bucket);
} global_buckets SEC(".maps");

/* Counters by interface slot, action and reason:
 * index (slot * EG_ACT_MAX + action) * EG_R_MAX + reason. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_IFACE_SLOTS * EG_ACT_MAX * EG_R_MAX);
	__type(key, __u32);
	__type(value, struct eg_counter);
} stats SEC(".maps");

/* ifindex -> counter slot (1..EG_IFACE_SLOTS-1), set by the loader when it
 * attaches. An array, not a hash, so the lookup is a bounds check and an
 * add; ifindexes past its end count under slot 0 ("other"). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_IFINDEX_MAX);
	__type(key, __u32);
	__type(value, __u32);
} iface_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_DEFAULT_MAX_RULES);
	__type(key, __u32);
	__type(value, struct eg_rule_counters);
} rule_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 256 * 1024);
} samples SEC(".maps");

/* New-source filter (see seen_mark in xdp_limiter.c): words of
 * [8-bit epoch | 28 bits of this epoch | 28 bits of the previous one];
 * words of an older epoch read as empty, so it clears itself. Size is a
 * power of two set at load time (two words per per-source entry, as the
 * default here when EG_DEFAULT_SRC_ENTRIES is a power of two). Pinned
 * with the buckets: a source's deferred charge must survive a restart. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 2 * EG_DEFAULT_SRC_ENTRIES);
	__type(key, __u32);
	__type(value, __u64);
} seen_filter SEC(".maps");

/* Only read when the program was loaded with eg_test_clock set. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} test_clock SEC(".maps");

/* Source standing, keyed by address (/32, /64), not by rule. A plain hash,
 * not an LRU: when it is full, new sources are not entered (they stay new
 * and are counted, EG_SE_FULL) and nobody already in it is evicted; the
 * daemon removes entries that aged out. Entries are created only for
 * packets admitted at the new-source tolerance, so a flood an aggregate
 * refuses creates none. Pinned: standing survives restarts. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_DEFAULT_STANDING_ENTRIES);
	__type(key, struct eg_standing_key);
	__type(value, struct eg_standing_val);
} standing SEC(".maps");

/* Standing settings per generation, read only when a source's standing is
 * updated (at most once per source per epoch). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct eg_standing_cfg);
} standing_cfg SEC(".maps");

/* Class counters of congested aggregates: index
 * ((dry * EG_CAGG_MAX + agg) * EG_CLASS_MAX + class) * EG_CO_MAX + outcome,
 * dry 1 for refusals of dry-run rules ("would drop"). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 2 * EG_CAGG_MAX * EG_CLASS_MAX * EG_CO_MAX);
	__type(key, __u32);
	__type(value, struct eg_counter);
} class_stats SEC(".maps");

/* Standing table events, by enum eg_standing_event. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_SE_MAX);
	__type(key, __u32);
	__type(value, __u64);
} standing_stats SEC(".maps");

/* standing.known_good: prefixes whose sources count as established when
 * they have no standing entry of their own (cold start). Looked up only in
 * an aggregate's reserve band. Value unused (1). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_DEFAULT_KNOWN_GOOD_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct eg_lpm_key);
	__type(value, __u32);
} known_good SEC(".maps");

/* Aggregate overrides (struct eg_override), keyed by aggregate. A plain
 * hash: the daemon deletes expired entries (the program ignores them) and
 * refuses new ones when it is full. Pinned: a crash leaves the last
 * decisions in force until they expire. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_DEFAULT_OVERRIDE_ENTRIES);
	__type(key, struct eg_agg_key);
	__type(value, struct eg_override);
} overrides SEC(".maps");

/* Which overrides and watches a rule slot's packets look up (enum
 * eg_gate), sized to the loader's MaxRules. Maintained by the daemon from
 * overrides, agg_watches and the live rule slots. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_DEFAULT_MAX_RULES);
	__type(key, __u32);
	__type(value, __u32);
} agg_gate SEC(".maps");

/* Watched (rule, kind) pairs; the data plane never reads it (agg_gate is
 * its compiled form). Value unused (1). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 1024);
	__type(key, struct eg_watch_key);
	__type(value, __u32);
} agg_watches SEC(".maps");

/* Counters of watched aggregate instances, created by the data plane on
 * an instance's first packet. An LRU: when full, the least recently
 * counted instance is evicted (and starts from zero if it comes back). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, EG_DEFAULT_AGG_STATS_ENTRIES);
	__type(key, struct eg_agg_key);
	__type(value, struct eg_agg_stats);
} agg_stats SEC(".maps");

/* Scratch space for the aggregate key an override or watch lookup builds
 * (the program's stack is full). One per CPU, used within one packet. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct eg_agg_key);
} agg_scratch SEC(".maps");

/* Scratch space for the socket tuple of standing's TCP handshake check
 * (bpf_skc_lookup_tcp), off the full stack. One per CPU, within one
 * packet. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct bpf_sock_tuple);
} tuple_scratch SEC(".maps");

/* A sampled packet's first bytes, copied by eg_frame_copy (a global
 * function: the copy is verified once) and put into the sample by
 * take_frame; eg_rate_sample has no room left for the context among its
 * five arguments. One per CPU, written and read within one packet. */
struct eg_frame_scratch {
	__u32 len; /* bytes of data valid, at most EG_SNAP_LEN */
	__u8 data[EG_SNAP_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct eg_frame_scratch);
} frame_scratch SEC(".maps");

/* 1-in-N samples of passed and dropped packets (EG_SAMPLE_RATE), apart
 * from the drop samples so that each has its own reader. 1 MiB: ~5,400
 * samples of 192 bytes (with the ring's header), a quarter of a second of
 * the default cap. (Its size is kept: a pinned ring of another size would
 * refuse the upgrade.) */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 1024 * 1024);
} rate_samples SEC(".maps");

/* The 1-in-N sampler's settings, per generation. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct eg_sample_cfg);
} sample_cfgs SEC(".maps");

/* The sampler's cap: one GCRA bucket shared by all CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct eg_bucket);
} rate_sample_cap SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct eg_rsample_stats);
} rate_sample_stats SEC(".maps");

/* Fingerprint rules (struct eg_fp_val), keyed by mask and fields. A plain
 * hash written by the daemon; expired entries are ignored, then deleted. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 4096);
	__type(key, struct eg_fp_key);
	__type(value, struct eg_fp_val);
} fp_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct eg_fp_masks);
} fp_masks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct eg_fp_stats);
} fp_stats SEC(".maps");

/* The fingerprint prefilter (enum eg_fp_field, EG_FP_PRE_*): written by
 * the daemon before a fingerprint is added and after one is removed, so a
 * packet never skips a mask slot that has an installed fingerprint of its
 * values. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct eg_fp_pre);
} fp_pre_words SEC(".maps");
