package redislimit

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// hybridRule decides a hot SlidingWindow rule from local leases. Each
// instance holds, per key, a grant of requests it may admit without asking
// Redis until the lease expires (SyncInterval) or runs out. A sync sends the
// count admitted since the last one (a fact, added unconditionally) and
// receives a new grant of min(MaxLease, ⌈remaining/Share⌉), not charged.
//
// Overshoot bound (fixed timeline, N instances, grants ≤ L): let j be the
// instance whose last sync s_j came last. Redis had every other instance's
// counts up to its own last sync, so admitted ≤ C(s_j) + g_j + Σ_{i≠j} g_i
// ≤ C(s_j) + (limit − C(s_j)) + (N−1)·L = limit + (N−1)·L.
//
// A single host (Share 1) has no one to share the window with: its grant is
// not a fixed count but the window itself. A sync also returns the window's
// state (its counts and position, in Redis's time), and until the lease
// expires the host decides each request with the sliding window's own
// arithmetic (package l7, the same as the scripts') on that state, moved on
// by the time passed and charged with what it admitted since: what the
// window frees as it slides is admitted without a round trip. MaxLease
// still caps what it admits between two syncs (what a crash loses). With
// N = 1 the bound above is the limit itself: the host admits what the
// window admits, as the local backend would.
type hybridRule struct {
	rule  Rule
	index int
	share int64
	// window is the sliding window a single host (share 1) decides with,
	// on the script's µs-aligned windows; nil when hosts share the rule.
	window *l7.SlidingWindow

	mu     sync.Mutex
	leases map[string]*lease
}

// lease is one key's local allowance (about 100 bytes with its map entry).
type lease struct {
	grant, used int64 // admitted under this grant
	unsynced    int64 // admitted and not yet reported to Redis
	remaining   int64 // Redis's remaining at the last sync
	reset       int64 // Redis's reset (ns) at the last sync
	retry       int64 // Redis's retry-after (ns) when grant is 0
	syncedAt    int64
	expires     int64
	syncing     chan struct{} // closed when the sync in flight ends
	// A single host's view of the window (hybridRule.window): the state
	// Redis returned, charged with what was admitted since, and offset,
	// the clock's time minus Redis's at the sync.
	state  l7.State
	offset int64
	// A single host's unsynced admissions by window (in Redis's time):
	// uCurr in window uIdx, uPrev in the one before (older ones no longer
	// weigh in the window).
	uIdx, uCurr, uPrev int64
}

// report is what a sync sends: used admitted in window idx (-1: count them
// in Redis's current window) and prev in the window before.
type report struct{ used, idx, prev int64 }

// addUnsynced counts n admitted in window idx; the caller holds h.mu.
func (ls *lease) addUnsynced(idx, n int64) {
	switch {
	case n == 0:
	case idx == ls.uIdx:
		ls.uCurr += n
	case idx == ls.uIdx-1:
		ls.uPrev += n
	case idx == ls.uIdx+1:
		ls.uIdx, ls.uPrev, ls.uCurr = idx, ls.uCurr, n
	case idx > ls.uIdx:
		ls.uIdx, ls.uPrev, ls.uCurr = idx, 0, n
	}
}

// takeReport is the report of everything unsynced, which it clears; the
// caller holds h.mu.
func (h *hybridRule) takeReport(ls *lease) report {
	rep := report{used: ls.unsynced, idx: -1}
	if h.window != nil {
		rep = report{used: ls.uCurr, idx: ls.uIdx, prev: ls.uPrev}
		ls.uCurr, ls.uPrev = 0, 0
	}
	ls.unsynced = 0
	return rep
}

func newHybridRule(r Rule, index int) *hybridRule {
	h := &hybridRule{rule: r, index: index, share: max(r.Hybrid.Share, 1), leases: map[string]*lease{}}
	if h.share == 1 {
		// The script's window, in whole µs; NewSlidingWindow fails only
		// for a limit the rule's own validation refuses.
		if w, err := l7.NewSlidingWindow(r.Limit, time.Duration(r.windowMicros())*time.Microsecond); err == nil {
			h.window = w
		}
	}
	return h
}

// leaseReply is one sync's outcome; needRetry is when the cost of the
// request that synced fits (0 if it fits now); idx, pos (µs), prev and curr
// are the window's state after the sync.
type leaseReply struct {
	grant, remaining, retry, reset, needRetry int64
	idx, pos, prev, curr                      int64
	err                                       error
}

// hybridReserve takes n units (a request's cost) from key's lease, syncing
// first when the lease has expired or has fewer than n left. The returned
// refund gives the units back if another rule refuses; it is nil when
// nothing was taken. A request costing more than the window has left is
// refused after its sync, with the RetryAfter of its own cost.
func (l *Limiter) hybridReserve(ctx context.Context, h *hybridRule, key string, n int64) (RuleDecision, func(), error) {
	r := h.rule
	rd := RuleDecision{Rule: r.Name, Source: SourceLease}
	var synced *leaseReply // this request's own sync, once made
	for {
		now := l.cfg.Clock.Now()
		h.mu.Lock()
		ls := h.leases[key]
		if ls == nil {
			ls = &lease{}
			h.leases[key] = ls
		}
		if ch := ls.syncing; ch != nil {
			h.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return rd, nil, fmt.Errorf("redis limiter: wait for hybrid sync: %w", ctx.Err())
			}
		}
		if h.window != nil && now < ls.expires {
			if rd, refund, ok := h.decideSingle(l, ls, now, n, synced != nil); ok {
				h.mu.Unlock()
				rd.Rule, rd.Source = r.Name, SourceLease
				return rd, refund, nil
			}
		}
		// After its own sync, a request that does not fit a grant sized
		// for it (grant < n: the window has fewer than n left) is refused.
		short := synced != nil && synced.needRetry > 0 && ls.used+n > ls.grant
		if h.window == nil && now < ls.expires && (ls.used+n <= ls.grant || ls.grant == 0 || short) {
			d := l7.Decision{Limit: r.Limit, Window: r.Window, Reset: time.Duration(max(ls.reset-(now-ls.syncedAt), 0))}
			verdict := "deny"
			var refund func()
			switch {
			case ls.used+n <= ls.grant:
				ls.used += n
				ls.unsynced += n
				d.Allowed = true
				d.Remaining = max(ls.remaining-ls.used, 0)
				verdict = "allow"
				refund = func() { h.giveBack(ls, n) }
			case short:
				d.Remaining = max(ls.remaining-ls.used, 0)
				d.RetryAfter = time.Duration(max(synced.needRetry-(now-ls.syncedAt), 1))
			default:
				d.RetryAfter = time.Duration(max(ls.retry-(now-ls.syncedAt), 1))
			}
			h.mu.Unlock()
			l.metrics.hybridLocal.WithLabelValues(r.Name, verdict).Inc()
			rd.Decision = d
			return rd, refund, nil
		}
		ch := make(chan struct{})
		ls.syncing = ch
		used := ls.unsynced
		sent := h.takeReport(ls)
		h.mu.Unlock()

		rep := l.syncOne(ctx, h, key, sent, n)
		h.mu.Lock()
		h.applySync(ls, used, sent, rep, l.cfg.Clock.Now())
		h.mu.Unlock()
		if rep.err != nil {
			if ctx.Err() != nil {
				return rd, nil, fmt.Errorf("redis limiter: hybrid sync: %w", ctx.Err())
			}
			return l.hybridFallback(h, key, rep.err, n)
		}
		synced = &rep
	}
}

// decideSingle decides n units at now for a single host from its view of
// the window; the caller holds h.mu and the lease is valid. ok is false
// when the host must sync first: it admitted its cap (max(MaxLease, the
// grant)) since the last sync. After the request's own sync (synced) the
// window alone decides (a cost above MaxLease passes when the window has
// room for it, as with hosts sharing the rule).
func (h *hybridRule) decideSingle(l *Limiter, ls *lease, now, n int64, synced bool) (RuleDecision, func(), bool) {
	limitCap := max(h.rule.Hybrid.MaxLease, ls.grant)
	if ls.used+n > limitCap && !synced {
		return RuleDecision{}, nil, false
	}
	at := now - ls.offset // Redis's time, moved on by the clock
	before := ls.state
	next, d := h.window.Take(before, at, n)
	verdict := "deny"
	var refund func()
	if d.Allowed {
		ls.state = next
		ls.used += n
		ls.unsynced += n
		widx := next[0] / int64(h.window.Window())
		ls.addUnsynced(widx, n)
		verdict = "allow"
		refund = func() { h.giveBackSingle(ls, n, before, next, at, widx) }
	}
	// The rule's window is the script's (whole µs): report the limit's.
	d.Window = h.rule.Window
	l.metrics.hybridLocal.WithLabelValues(h.rule.Name, verdict).Inc()
	return RuleDecision{Decision: d}, refund, true
}

// giveBackSingle is giveBack for a single host: the units also leave its
// view of the window.
func (h *hybridRule) giveBackSingle(ls *lease, n int64, before, after l7.State, at, widx int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := min(n, ls.used, ls.unsynced)
	switch widx {
	case ls.uIdx:
		k = min(k, ls.uCurr)
		ls.uCurr -= k
	case ls.uIdx - 1:
		k = min(k, ls.uPrev)
		ls.uPrev -= k
	default:
		k = 0 // its window slid out (or was synced): nothing weighs
	}
	if k > 0 {
		ls.used -= k
		ls.unsynced -= k
		ls.state = h.window.Refund(ls.state, before, after, at)
	}
}

// giveBack returns n reserved units to their lease, as many as are still
// unsynced (units a sync already reported stay counted: the strict side).
func (h *hybridRule) giveBack(ls *lease, n int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := min(n, ls.used, ls.unsynced)
	if k > 0 {
		ls.used -= k
		ls.unsynced -= k
	}
}

// applySync installs a sync's outcome; the caller holds h.mu. On failure
// the counts stay unsynced (they are not lost) and the lease is void.
func (h *hybridRule) applySync(ls *lease, used int64, sent report, rep leaseReply, now int64) {
	close(ls.syncing)
	ls.syncing = nil
	if rep.err != nil {
		ls.unsynced += used
		if h.window != nil {
			ls.addUnsynced(sent.idx-1, sent.prev)
			ls.addUnsynced(sent.idx, sent.used)
		}
		ls.grant, ls.used, ls.expires = 0, 0, 0
		return
	}
	ls.grant, ls.used = rep.grant, 0
	ls.remaining, ls.retry, ls.reset, ls.syncedAt = rep.remaining, rep.retry, rep.reset, now
	ls.expires = now + int64(h.rule.Hybrid.SyncInterval)
	if h.window != nil {
		// Redis's window as of the sync (counts over 2^32 cannot occur
		// under a limit below it, but clamp rather than wrap).
		w := int64(h.window.Window())
		c := func(v int64) int64 { return min(max(v, 0), math.MaxUint32) }
		ls.state = l7.State{rep.idx * w, c(rep.prev)<<32 | c(rep.curr)}
		ls.offset = now - (rep.idx*w + rep.pos*int64(time.Microsecond))
		// The window frees capacity as it slides: no early expiry.
		return
	}
	if rep.grant == 0 && rep.retry > 0 {
		ls.expires = now + min(int64(h.rule.Hybrid.SyncInterval), rep.retry)
	}
}

func (l *Limiter) hybridFallback(h *hybridRule, key string, cause error, n int64) (RuleDecision, func(), error) {
	r := h.rule
	rd := RuleDecision{Rule: r.Name}
	var refund func()
	switch r.Failure {
	case FailOpen:
		rd.Source = SourceFailOpen
		rd.Decision = l7.Decision{Allowed: true, Limit: r.Limit, Window: r.Window, Remaining: r.Limit}
	case FailClosed:
		rd.Source = SourceFailClosed
		rd.Decision = l7.Decision{Limit: r.Limit, Window: r.Window, RetryAfter: l.failClosedRetry()}
	case Degrade:
		lr := l.local[h.index]
		lr.mu.Lock()
		c := lr.check(key, l.cfg.Clock.Now(), n)
		if c.decision.Allowed {
			c.commit()
			refund = func() { c.undo(l.cfg.Clock) }
		}
		lr.mu.Unlock()
		rd.Source = SourceLocal
		rd.Decision = c.decision
	}
	verdict := "allow"
	if !rd.Decision.Allowed {
		verdict = "deny"
	}
	l.metrics.fallback.WithLabelValues(r.Name, r.Failure.String(), verdict).Inc()
	l.warn.warn("redis limiter: deciding without redis", "cause", cause.Error(), "breaker", l.breaker.State().String())
	return rd, refund, nil
}

// syncOne sends one key's count and asks for a new grant that fits need.
func (l *Limiter) syncOne(ctx context.Context, h *hybridRule, key string, sent report, need int64) leaseReply {
	ok, probe := l.breaker.allow()
	if probe {
		l.startProbe()
	}
	if !ok {
		l.metrics.errors.WithLabelValues("lease", "breaker_open").Inc()
		return leaseReply{err: ErrBreakerOpen}
	}
	// Through the batch queue: concurrent syncs (and decisions) share
	// pipelined round trips; a sync is never merged into a decide run.
	c := l.leaseCall(h, key, sent, need)
	c.custom = true
	if err := l.roundTrip(ctx, c); err != nil {
		return leaseReply{err: err}
	}
	return decodeLease(c)
}

func (l *Limiter) leaseCall(h *hybridRule, key string, sent report, need int64) *call {
	r := h.rule
	return &call{
		script: l.leaseSH, src: leaseSource,
		keys: []string{redisKey(l.cfg.Prefix, key, r.Name)},
		args: l.scriptArgs([]any{r.windowMicros(), r.Limit, sent.used, r.Hybrid.MaxLease, h.share, need, sent.idx, sent.prev}),
	}
}

func decodeLease(c *call) leaseReply {
	if c.err != nil {
		return leaseReply{err: c.err}
	}
	v, err := intReply(c.reply, 9)
	if err != nil {
		return leaseReply{err: err}
	}
	return leaseReply{grant: v[0], remaining: v[1], retry: v[2], reset: v[3], needRetry: v[4],
		idx: v[5], pos: v[6], prev: v[7], curr: v[8]}
}

// Sync reports every hybrid key's unsynced count to Redis now, in pipelined
// batches of MaxBatch, and renews those keys' leases. Idle expired leases
// are dropped. The background loop calls it every SyncEvery.
func (l *Limiter) Sync(ctx context.Context) {
	if ok, probe := l.breaker.allow(); !ok {
		if probe {
			l.startProbe()
		}
		return // counts stay unsynced until Redis is back
	}
	for _, h := range l.hybrid {
		type pending struct {
			key  string
			ls   *lease
			used int64
			sent report
		}
		var todo []pending
		now := l.cfg.Clock.Now()
		h.mu.Lock()
		for key, ls := range h.leases {
			switch {
			case ls.syncing != nil:
			case ls.unsynced > 0:
				ls.syncing = make(chan struct{})
				used := ls.unsynced
				todo = append(todo, pending{key, ls, used, h.takeReport(ls)})
			case now >= ls.expires:
				delete(h.leases, key)
			}
		}
		h.mu.Unlock()
		for start := 0; start < len(todo); start += l.cfg.MaxBatch {
			part := todo[start:min(start+l.cfg.MaxBatch, len(todo))]
			calls := make([]*call, len(part))
			for i, p := range part {
				calls[i] = l.leaseCall(h, p.key, p.sent, 1)
			}
			if ctx.Err() == nil {
				l.runBatch(calls, "lease")
			} else {
				for _, c := range calls {
					c.err = ctx.Err()
				}
			}
			now := l.cfg.Clock.Now()
			h.mu.Lock()
			for i, p := range part {
				h.applySync(p.ls, p.used, p.sent, decodeLease(calls[i]), now)
			}
			h.mu.Unlock()
		}
	}
}

func (l *Limiter) syncLoop(every time.Duration) {
	defer l.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			l.Sync(l.ctx)
		case <-l.ctx.Done():
			return
		}
	}
}
