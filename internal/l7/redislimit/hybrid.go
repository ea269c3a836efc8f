package redislimit

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
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
//
// Share 1 is a claim the host checks on every sync: it knows what it
// reported into the window's two counts, so counts beyond those are
// foreign (another host writes the key, or this host's previous run). A
// key whose window holds foreign counts decides as hosts sharing it do
// (fixed grants, Share foreignShare, at most foreignLease) until a sync
// finds none in either count, so with N hosts all left at Share 1 the
// bound is Limit + (N−1)·foreignLease once each has seen the others, and
// Limit + (N−1)·MaxLease before (each admits at most MaxLease between the
// sync that could not yet see the others and the one that does).
type hybridState struct {
	rule  Rule
	share int64
	// foreignLease caps a single host's grant while its key's window holds
	// foreign counts: min(MaxLease, FleetLease(Limit, 1)).
	foreignLease int64
	// settled is when a Limiter replaced by this one (a reload, a restart)
	// has flushed what it admitted before: its start plus two
	// SyncIntervals (tell).
	settled int64
	// window is the sliding window a single host (share 1) decides with,
	// on the script's µs-aligned windows; nil when hosts share the rule.
	window *l7.SlidingWindow

	// capacity caps the leases (Hybrid.Capacity): a new key at capacity
	// evicts one (hybrid_cap.go); evictions counts them (under mu).
	capacity  int
	evictions int64

	mu     sync.Mutex
	leases map[string]*lease

	// users are the Limiters deciding with this state (under usersMu):
	// one, or a limit's limiters in every tier (HybridStates); the first
	// flushes it in the background (hybrid_shared.go).
	usersMu sync.Mutex
	users   []*Limiter
	// local is the Degrade fallback's local limit, shared as the leases
	// are (degrade; under usersMu).
	local *localRule
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
	last        int64         // the clock's time of its last request (eviction)
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
	// A single host's tally of the window: mine, what it reported into
	// Redis's window mine.idx and the one before; seen, the foreign counts
	// already found there (each is counted in the metric once); foreign,
	// whether the last sync found any (the key then decides with fixed
	// grants, as hosts sharing it do); since, the window of the lease's
	// first successful sync (watched).
	mine, seen       tally
	foreign, watched bool
	since            int64
}

// tally is a count in window idx (curr) and in the one before (prev).
type tally struct{ idx, curr, prev int64 }

// moveTo rolls the tally to window idx: counts older than the window
// before it no longer weigh. A window index that goes back (Redis's clock
// stepped back) clears it.
func (t *tally) moveTo(idx int64) {
	switch {
	case idx == t.idx:
		return
	case idx == t.idx+1:
		t.prev, t.curr = t.curr, 0
	default:
		t.prev, t.curr = 0, 0
	}
	t.idx = idx
}

// weighs reports whether the tally's counts still weigh in window idx.
func (t tally) weighs(idx int64) bool {
	return (t.curr > 0 && idx <= t.idx+1) || (t.prev > 0 && idx <= t.idx)
}

// foreignShare is the Share a single host's key decides with while another
// writer is seen: the fleet is at least two hosts (the fewest that explain
// a foreign count), and grants never exceed foreignLease whatever N is, so
// the bound does not depend on it; it only halves the grants as the window
// runs out.
const foreignShare = 2

// report is what a sync sends: used admitted in window idx (-1: count them
// in Redis's current window) and prev in the window before, and the grant
// it asks for: at most lease, a share of remaining.
type report struct{ used, idx, prev, lease, share int64 }

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
	rep := report{used: ls.unsynced, idx: -1, lease: h.rule.Hybrid.MaxLease, share: h.share}
	if h.window != nil {
		rep.used, rep.idx, rep.prev = ls.uCurr, ls.uIdx, ls.uPrev
		ls.uCurr, ls.uPrev = 0, 0
		if ls.foreign {
			rep.lease, rep.share = h.foreignLease, foreignShare
		}
	}
	ls.unsynced = 0
	return rep
}

// single reports whether key's lease decides from the window itself: a
// single host whose last sync found no foreign counts.
func (h *hybridRule) single(ls *lease) bool { return h.window != nil && !ls.foreign }

func newHybridState(r Rule, now int64) *hybridState {
	h := &hybridState{rule: r, share: max(r.Hybrid.Share, 1), leases: map[string]*lease{},
		foreignLease: min(r.Hybrid.MaxLease, FleetLease(r.Limit, 1)), settled: now + 2*int64(r.Hybrid.SyncInterval),
		capacity: cmp.Or(r.Hybrid.Capacity, defaultHybridCapacity)}
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
		ls, vkey, victim := l.leaseFor(h, key, now)
		if victim != nil {
			if err := l.evictFlush(ctx, h, vkey, victim); err != nil {
				if ctx.Err() != nil {
					return rd, nil, fmt.Errorf("redis limiter: hybrid sync: %w", ctx.Err())
				}
				return l.hybridFallback(h, key, err, n)
			}
			continue
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
		// A single host's view of the window, from a sync that did not
		// fail, decides until its lease expires, and after it refuses
		// what the window refuses (decideSingle).
		if h.single(ls) && ls.expires > 0 {
			if rd, refund, ok := h.decideSingle(ls, now, n, synced != nil); ok {
				h.mu.Unlock()
				rd.Rule, rd.Source = r.Name, SourceLease
				return rd, refund, nil
			}
		}
		// After its own sync, a request that does not fit a grant sized
		// for it (grant < n: the window has fewer than n left) is refused.
		short := synced != nil && synced.needRetry > 0 && ls.used+n > ls.grant
		if !h.single(ls) && now < ls.expires && (ls.used+n <= ls.grant || ls.grant == 0 || short) {
			d := l7.Decision{Limit: r.Limit, Window: r.Window, Reset: time.Duration(max(ls.reset-(now-ls.syncedAt), 0))}
			var refund func()
			switch {
			case ls.used+n <= ls.grant:
				ls.used += n
				ls.unsynced += n
				widx := int64(-1)
				if h.window != nil {
					// A single host's key with foreign counts: its
					// admissions are still reported by window.
					widx = (now - ls.offset) / int64(h.window.Window())
					ls.addUnsynced(widx, n)
				}
				d.Allowed = true
				d.Remaining = max(ls.remaining-ls.used, 0)
				refund = func() { h.giveBack(ls, n, widx) }
			case short:
				d.Remaining = max(ls.remaining-ls.used, 0)
				d.RetryAfter = time.Duration(max(synced.needRetry-(now-ls.syncedAt), 1))
			default:
				d.RetryAfter = time.Duration(max(ls.retry-(now-ls.syncedAt), 1))
			}
			h.mu.Unlock()
			h.countDecided(d.Allowed)
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
		fresh := h.applySync(ls, used, sent, rep, l.cfg.Clock.Now())
		h.mu.Unlock()
		l.foreignCounts(h, fresh)
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
// the window; the caller holds h.mu and the view comes from a sync that
// did not fail (ls.expires > 0). ok is false when the host must sync
// first: the window admits the request, and the lease has expired or the
// host admitted its cap (max(MaxLease, the grant)) since the last sync.
// After the request's own sync (synced) the window alone decides (a cost
// above MaxLease passes when the window has room for it, as with hosts
// sharing the rule).
func (h *hybridRule) decideSingle(ls *lease, now, n int64, synced bool) (RuleDecision, func(), bool) {
	at := now - ls.offset // Redis's time, moved on by the clock
	before := ls.state
	next, d := h.window.Take(before, at, n)
	// The lease bounds admissions between syncs and how long the view
	// admits; a request the window refuses admits nothing, and a sync
	// could only add counts (another host's) that refuse it too: it is
	// refused without one, expired lease or not. (A window Redis lost
	// would admit more; the host's own counts in its view slide out
	// within two windows.)
	if d.Allowed && !synced && (now >= ls.expires || ls.used+n > max(h.rule.Hybrid.MaxLease, ls.grant)) {
		return RuleDecision{}, nil, false
	}
	var refund func()
	if d.Allowed {
		ls.state = next
		ls.used += n
		ls.unsynced += n
		widx := next[0] / int64(h.window.Window())
		ls.addUnsynced(widx, n)
		refund = func() { h.giveBackSingle(ls, n, before, next, at, widx) }
	}
	// The rule's window is the script's (whole µs): report the limit's.
	d.Window = h.rule.Window
	h.countDecided(d.Allowed)
	return RuleDecision{Decision: d}, refund, true
}

// giveBackSingle is giveBack for a single host deciding from its view of
// the window: the units also leave that view.
func (h *hybridRule) giveBackSingle(ls *lease, n int64, before, after l7.State, at, widx int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.takeBack(ls, n, widx) > 0 {
		ls.state = h.window.Refund(ls.state, before, after, at)
	}
}

// giveBack returns n reserved units, admitted in window widx (-1: not
// tracked by window), to their lease.
func (h *hybridRule) giveBack(ls *lease, n, widx int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.takeBack(ls, n, widx)
}

// takeBack removes up to n units admitted in window widx from the unsynced
// counts, as many as are still unsynced (units a sync already reported
// stay counted: the strict side), and returns how many; the caller holds
// h.mu.
func (h *hybridRule) takeBack(ls *lease, n, widx int64) int64 {
	k := min(n, ls.used, ls.unsynced)
	if h.window != nil {
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
	}
	k = max(k, 0)
	ls.used -= k
	ls.unsynced -= k
	return k
}

// applySync installs a sync's outcome and returns the foreign counts it
// found written while this host held the key (tell); the caller holds
// h.mu. On
// failure the counts stay unsynced (they are not lost) and the lease is
// void.
func (h *hybridRule) applySync(ls *lease, used int64, sent report, rep leaseReply, now int64) int64 {
	close(ls.syncing)
	ls.syncing = nil
	if rep.err != nil {
		ls.unsynced += used
		if h.window != nil {
			ls.addUnsynced(sent.idx-1, sent.prev)
			ls.addUnsynced(sent.idx, sent.used)
		}
		ls.grant, ls.used, ls.expires = 0, 0, 0
		return 0
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
		fresh := h.tell(ls, sent, rep, now)
		if !ls.foreign {
			// The window frees capacity as it slides: no early expiry.
			return fresh
		}
		// A grant asked for as the only host is cut to what hosts
		// sharing the key would be granted.
		ls.grant = min(ls.grant, h.foreignLease)
		if rep.grant == 0 && rep.retry > 0 {
			ls.expires = now + min(int64(h.rule.Hybrid.SyncInterval), rep.retry)
		}
		return fresh
	}
	if rep.grant == 0 && rep.retry > 0 {
		ls.expires = now + min(int64(h.rule.Hybrid.SyncInterval), rep.retry)
	}
	return 0
}

// tell adds what a sync reported to the host's own tally (where the lease
// script added it) and compares the window's counts with it: the excess is
// foreign. It sets ls.foreign (any foreign count, whoever wrote it) and
// returns the foreign counts another host wrote while this one held the
// key: those not seen before, found by a later sync than the key's first,
// once the Limiter has settled or in windows after the first sync's. A
// previous Limiter on the same keys (before a restart or a reload)
// admitted its counts before this one took over, in windows up to the
// first sync's, and flushes them within a SyncInterval (its background
// flush; a restart's at its Close): they are foreign, not another host's.
// The caller holds h.mu.
func (h *hybridRule) tell(ls *lease, sent report, rep leaseReply, now int64) int64 {
	ls.mine.moveTo(rep.idx)
	ls.seen.moveTo(rep.idx)
	if sent.used > 0 || sent.prev > 0 {
		switch {
		case sent.idx < 0 || sent.idx >= rep.idx:
			ls.mine.curr += sent.used
			ls.mine.prev += sent.prev
		case sent.idx == rep.idx-1:
			ls.mine.prev += sent.used
		}
	}
	curr, prev := max(rep.curr-ls.mine.curr, 0), max(rep.prev-ls.mine.prev, 0)
	var written int64
	switch {
	case !ls.watched: // the key's first sync: they were there before it
		ls.watched, ls.since = true, rep.idx
	default:
		if now >= h.settled || rep.idx > ls.since {
			written += max(curr-ls.seen.curr, 0)
		}
		if now >= h.settled || rep.idx-1 > ls.since {
			written += max(prev-ls.seen.prev, 0)
		}
	}
	ls.seen.curr, ls.seen.prev = max(ls.seen.curr, curr), max(ls.seen.prev, prev)
	ls.foreign = curr > 0 || prev > 0
	return written
}

// foreignCounts records n foreign counts a single host's syncs of h found
// written while it held their keys: the metric, and a warning (one per
// rule and LogEvery) that the rule's hosts: 1 is not true.
func (l *Limiter) foreignCounts(h *hybridRule, n int64) {
	if n <= 0 {
		return
	}
	l.metrics.hybridForeign.WithLabelValues(h.rule.Name).Add(float64(n))
	l.warn.warnFor("foreign:"+h.rule.Name, "redis limiter: l7.redis.hosts is 1 but another host writes this hybrid limit's keys; "+
		"its keys decide with fixed grants while it does (the bound is the limit + (hosts − 1) × lease); set l7.redis.hosts to the number of hosts sharing the limit",
		slog.String("rule", h.rule.Name), slog.Int64("foreign_counts", n), slog.Int64("lease", h.foreignLease))
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
		args: l.scriptArgs([]any{r.windowMicros(), r.Limit, sent.used, sent.lease, sent.share, need, sent.idx, sent.prev}),
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
func (l *Limiter) Sync(ctx context.Context) { l.sync(ctx, nil) }

// sync is Sync for the hybrid rules flush selects (nil: all).
func (l *Limiter) sync(ctx context.Context, flush func(*hybridRule) bool) {
	if ok, probe := l.breaker.allow(); !ok {
		if probe {
			l.startProbe()
		}
		return // counts stay unsynced until Redis is back
	}
	for _, h := range l.hybrid {
		if flush != nil && !flush(h) {
			continue
		}
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
				todo = append(todo, pending{key: key, ls: ls})
			case now >= ls.expires && !h.remembers(ls, now):
				delete(h.leases, key)
			}
		}
		h.mu.Unlock()
		for start := 0; start < len(todo); start += l.cfg.MaxBatch {
			// A batch's leases are taken when it is sent: a key's
			// requests wait for its own batch's round trip only, not
			// for the batches before it. A lease a request has synced
			// since (or is syncing) is left out.
			part := todo[start:min(start+l.cfg.MaxBatch, len(todo))]
			h.mu.Lock()
			n := 0
			for _, p := range part {
				if p.ls.syncing != nil || p.ls.unsynced == 0 {
					continue
				}
				p.ls.syncing = make(chan struct{})
				p.used = p.ls.unsynced
				p.sent = h.takeReport(p.ls)
				part[n] = p
				n++
			}
			h.mu.Unlock()
			if n == 0 {
				continue
			}
			part = part[:n]
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
			var fresh int64
			h.mu.Lock()
			for i, p := range part {
				fresh += h.applySync(p.ls, p.used, p.sent, decodeLease(calls[i]), now)
			}
			h.mu.Unlock()
			l.foreignCounts(h, fresh)
		}
	}
}

// remembers reports whether an idle lease must be kept: a single host's
// own counts still weigh in the window, and a new lease would take them
// for another host's (and decide with fixed grants until they slide out).
func (h *hybridRule) remembers(ls *lease, now int64) bool {
	if h.window == nil {
		return false
	}
	return ls.mine.weighs((now - ls.offset) / int64(h.window.Window()))
}

func (l *Limiter) syncLoop(every time.Duration) {
	defer l.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			l.backgroundSync(l.ctx)
		case <-l.ctx.Done():
			return
		}
	}
}
