package redislimit

// Ready reports whether AllowN(ctx, key, n) would decide now without a
// round trip or a wait: every rule is hybrid and each holds a lease for
// key that decides n (a grant with room for it before it expires; a
// single host's view of the window below its cap before the lease
// expires, or refusing n, expired or not), with no sync in flight. It charges nothing. A concurrent call may use the lease up
// between Ready and AllowN: AllowN then syncs as always (its decision is
// the same either way; only where it waits differs).
func (l *Limiter) Ready(key string, n int64) bool {
	if len(l.remote) > 0 || len(l.hybrid) == 0 || n < 1 || l.ctx.Err() != nil {
		return false
	}
	now := l.cfg.Clock.Now()
	for _, h := range l.hybrid {
		if !h.ready(key, n, now) {
			return false
		}
	}
	return true
}

// Inline reports whether the Limiter's decisions may need no round trip
// (all its rules are hybrid): Ready can then be true.
func (l *Limiter) Inline() bool { return len(l.remote) == 0 && len(l.hybrid) > 0 }

// ready is hybridReserve's test before its first sync: whether key's
// lease decides n at now.
func (h *hybridRule) ready(key string, n, now int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	ls := h.leases[key]
	if ls == nil || ls.syncing != nil {
		return false
	}
	if h.single(ls) && ls.expires > 0 {
		if now < ls.expires && ls.used+n <= max(h.rule.Hybrid.MaxLease, ls.grant) {
			return true
		}
		// decideSingle refuses without a sync what the window refuses,
		// its lease expired or not.
		_, d := h.window.Take(ls.state, now-ls.offset, n)
		return !d.Allowed
	}
	return now < ls.expires && (ls.used+n <= ls.grant || ls.grant == 0)
}
