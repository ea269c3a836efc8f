package redislimit

import (
	"context"
	"fmt"
)

// defaultHybridCapacity is Hybrid.Capacity when it is 0: the policy's
// default capacity of a limit (proxy.DefaultLocalCapacity), which the
// proxy and the rate-limit service always pass.
const defaultHybridCapacity = 1 << 16

// evictSample is how many leases an eviction compares (in the map's
// random iteration order): the least recently used of them goes, as in
// Redis's approximated LRU. A key in use is about as recent as the last
// request: a spray of fresh keys evicts it only when every sampled lease
// was used more recently.
const evictSample = 8

// leaseFor returns key's lease, made if it has none, and marks it used at
// now; the caller holds h.mu. When key has none and the rule holds
// capacity leases, one is evicted first (leastRecent): a victim with
// nothing unsynced is dropped at once; one with unsynced counts, or a sync
// in flight, is returned instead of a lease, for the caller to flush and
// drop (evictFlush) or wait for, before it tries again: counts never leave
// with their lease.
func (l *Limiter) leaseFor(h *hybridRule, key string, now int64) (ls *lease, victimKey string, victim *lease) {
	if ls = h.leases[key]; ls != nil {
		ls.last = now
		return ls, "", nil
	}
	if len(h.leases) >= h.capacity {
		vk, v := h.leastRecent()
		if v.syncing != nil || v.unsynced > 0 || v.uCurr > 0 || v.uPrev > 0 {
			return nil, vk, v
		}
		l.dropLease(h, vk)
	}
	ls = &lease{last: now}
	h.leases[key] = ls
	return ls, "", nil
}

// leastRecent is the least recently used of evictSample leases that no
// sync holds, or a held one when all sampled are; the caller holds h.mu
// and the map is not empty.
func (h *hybridRule) leastRecent() (string, *lease) {
	var key string
	var best *lease
	seen := 0
	for k, ls := range h.leases {
		switch {
		case best == nil,
			best.syncing != nil && ls.syncing == nil,
			(best.syncing == nil) == (ls.syncing == nil) && ls.last < best.last:
			key, best = k, ls
		}
		if seen++; seen == evictSample {
			break
		}
	}
	return key, best
}

// dropLease evicts key's lease, which has nothing unsynced; the caller
// holds h.mu.
func (l *Limiter) dropLease(h *hybridRule, key string) {
	delete(h.leases, key)
	h.evictions++
	l.metrics.hybridEvictions.WithLabelValues(h.rule.Name).Inc()
}

// HybridLeases is one hybrid rule's lease map: the leases held, its
// capacity, and the leases evicted so far.
type HybridLeases struct {
	Rule             string
	Leases, Capacity int
	Evictions        int64
}

// HybridLeases reads every hybrid rule's lease map (for a caller that
// exports it without a Registerer: the rate-limit service). A state shared
// with other Limiters (HybridStates) is read by the one that flushes it,
// so a sum over the Limiters counts it once.
func (l *Limiter) HybridLeases() []HybridLeases {
	out := make([]HybridLeases, 0, len(l.hybrid))
	for _, h := range l.hybrid {
		if !h.flusher(l) {
			continue
		}
		h.mu.Lock()
		out = append(out, HybridLeases{Rule: h.rule.Name, Leases: len(h.leases), Capacity: h.capacity, Evictions: h.evictions})
		h.mu.Unlock()
	}
	return out
}

// evictFlush makes room for a new key: it waits for the victim's sync in
// flight, or reports the victim's unsynced counts to Redis (the grant that
// sync returns is not used) and then drops it. The caller holds h.mu; it
// is released. An error is the sync's (the counts stay unsynced in the
// victim, which stays) or ctx's.
func (l *Limiter) evictFlush(ctx context.Context, h *hybridRule, vkey string, v *lease) error {
	if ch := v.syncing; ch != nil {
		h.mu.Unlock()
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("redis limiter: wait for hybrid sync: %w", ctx.Err())
		}
	}
	v.syncing = make(chan struct{})
	used := v.unsynced
	sent := h.takeReport(v)
	h.mu.Unlock()
	rep := l.syncOne(ctx, h, vkey, sent, 1)
	h.mu.Lock()
	fresh := h.applySync(v, used, sent, rep, l.cfg.Clock.Now())
	if rep.err == nil && h.leases[vkey] == v && v.unsynced == 0 {
		l.dropLease(h, vkey)
	}
	h.mu.Unlock()
	l.foreignCounts(h, fresh)
	if rep.err != nil {
		return fmt.Errorf("redis limiter: flush an evicted hybrid lease: %w", rep.err)
	}
	return nil
}
