/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * GCRA (generic cell rate algorithm) on one 64-bit theoretical arrival time
 * (TAT) per dimension, shared by every CPU and updated with compare-and-swap.
 * A limit of R/s is R/s across all CPUs: there is one TAT, not one per CPU.
 *
 * A bucket with emission interval t and tolerance tau = burst * t admits an
 * event of cost inc at time now iff max(tat, now) + inc - now <= tau, and then
 * moves tat to max(tat, now) + inc. A rejected event changes nothing.
 * internal/maps/gcra.go mirrors this math for tests and the reference model.
 */
#pragma once

#include "edgeguard_types.h"

/* Bounded CAS retries. Each failure means another CPU just updated the same
 * bucket, so it made progress; eight in a row only happens under extreme
 * contention. Then the event is rejected: never admitting more than the
 * limit matters more than admitting a packet we could have taken. */
#define EG_CAS_RETRIES 8

static __always_inline __u64 gcra_base(__u64 tat, __u64 now)
{
	return tat > now ? tat : now;
}

/* gcra_would_admit reports whether an event of cost inc fits now, without
 * changing state. */
static __always_inline int gcra_would_admit(const __u64 *tatp, __u64 now, __u64 inc, __u64 tau)
{
	__u64 tat = *(volatile const __u64 *)tatp;

	return gcra_base(tat, now) + inc - now <= tau;
}

/* gcra_take admits and charges an event of cost inc, or rejects it and
 * charges nothing. */
static __always_inline int gcra_take(__u64 *tatp, __u64 now, __u64 inc, __u64 tau)
{
#pragma unroll
	for (int i = 0; i < EG_CAS_RETRIES; i++) {
		__u64 old = *(volatile __u64 *)tatp;
		__u64 next = gcra_base(old, now) + inc;

		if (next - now > tau)
			return 0;
		if (__sync_val_compare_and_swap(tatp, old, next) == old)
			return 1;
	}
	return 0;
}

/* gcra_refund gives back a charge made by gcra_take. Used when the packet
 * dimension admitted a packet and the byte dimension of the same bucket then
 * rejected it. TATs add, so an atomic subtract is exact. */
static __always_inline void gcra_refund(__u64 *tatp, __u64 inc)
{
	__sync_fetch_and_sub(tatp, inc);
}

/* gcra_charge charges an event that was already admitted, whatever the
 * bucket holds: the new-source filter's deferred charge for a packet it let
 * through without looking its bucket up. It may leave tat beyond tau, so
 * the next events wait for it. */
static __always_inline void gcra_charge(__u64 *tatp, __u64 now, __u64 inc)
{
#pragma unroll
	for (int i = 0; i < EG_CAS_RETRIES; i++) {
		__u64 old = *(volatile __u64 *)tatp;

		if (__sync_val_compare_and_swap(tatp, old, gcra_base(old, now) + inc) == old)
			return;
	}
}

static __always_inline __u64 byte_cost(const struct eg_bucket_cfg *cfg, __u32 len)
{
	return ((__u64)len * cfg->byte_t) >> EG_BYTE_SHIFT;
}

/* bucket_would_admit: would this packet pass this bucket right now? */
static __always_inline int bucket_would_admit(const struct eg_bucket *b, const struct eg_bucket_cfg *cfg,
					      __u64 now, __u32 len)
{
	if (cfg->pkt_t && !gcra_would_admit(&b->pkt_tat, now, cfg->pkt_t, cfg->pkt_tau))
		return 0;
	if (cfg->byte_t && !gcra_would_admit(&b->byte_tat, now, byte_cost(cfg, len), cfg->byte_tau))
		return 0;
	return 1;
}

/* bucket_take charges the packet to both dimensions, or to neither. */
static __always_inline int bucket_take(struct eg_bucket *b, const struct eg_bucket_cfg *cfg, __u64 now, __u32 len)
{
	if (cfg->pkt_t && !gcra_take(&b->pkt_tat, now, cfg->pkt_t, cfg->pkt_tau))
		return 0;
	if (cfg->byte_t && !gcra_take(&b->byte_tat, now, byte_cost(cfg, len), cfg->byte_tau)) {
		if (cfg->pkt_t)
			gcra_refund(&b->pkt_tat, cfg->pkt_t);
		return 0;
	}
	return 1;
}

/* bucket_charge charges an already admitted packet to both dimensions. */
static __always_inline void bucket_charge(struct eg_bucket *b, const struct eg_bucket_cfg *cfg, __u64 now, __u32 len)
{
	if (cfg->pkt_t)
		gcra_charge(&b->pkt_tat, now, cfg->pkt_t);
	if (cfg->byte_t)
		gcra_charge(&b->byte_tat, now, byte_cost(cfg, len));
}

static __always_inline int bucket_limited(const struct eg_bucket_cfg *cfg)
{
	return cfg->pkt_t || cfg->byte_t;
}
