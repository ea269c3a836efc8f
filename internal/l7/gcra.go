package l7

import (
	"fmt"
	"time"
)

// GCRA is the generic cell rate algorithm (virtual scheduling form): one
// int64 per key, the theoretical arrival time (TAT). It is the recommended
// default for new rules together with SlidingWindow.
//
// Definition, with emission interval T = Window/Limit (integer ns, truncated)
// and burst B: a request for n units at time t is admitted iff
//
//	max(TAT, t) + n*T - t <= B*T
//
// and then TAT = max(TAT, t) + n*T. State[0] is TAT; State[1] counts the
// refunds applied to the key (see Refund) and plays no part in decisions.
//
// Error bound: T is truncated to whole nanoseconds, so the long-run rate is
// at most Limit/(Window - Limit ns), i.e. at most one extra unit per
// Window/Limit windows (for 100 per minute: exact; for 3 per second: one
// extra unit every ~3.3e8 seconds). Memory per key: 8 bytes of state.
type GCRA struct {
	limit    int64
	window   int64
	burst    int64
	interval int64 // T
	tau      int64 // B*T
	perT     divisor
}

// NewGCRA returns a GCRA admitting limit units per window with the given
// burst (the most units admitted at once from a fresh key). burst == 0 means
// burst = limit, which makes RateLimit-Policy q exact for a fresh key.
func NewGCRA(limit int64, window time.Duration, burst int64) (*GCRA, error) {
	if err := validate("gcra", limit, window); err != nil {
		return nil, err
	}
	if burst == 0 {
		burst = limit
	}
	if int64(window) < limit {
		return nil, fmt.Errorf("gcra: limit %d per %s: emission interval below 1ns: %w", limit, window, ErrInvalidLimit)
	}
	interval := int64(window) / limit
	if burst < 1 || burst > maxScaled/interval {
		return nil, fmt.Errorf("gcra: burst %d: must be in [1, 2^62/interval]: %w", burst, ErrInvalidLimit)
	}
	return &GCRA{limit: limit, window: int64(window), burst: burst, interval: interval, tau: burst * interval, perT: newDivisor(interval)}, nil
}

// Name returns "gcra".
func (g *GCRA) Name() string { return "gcra" }

// Limit returns units per window.
func (g *GCRA) Limit() int64 { return g.limit }

// Window returns the window.
func (g *GCRA) Window() time.Duration { return time.Duration(g.window) }

// Burst returns the most units a fresh key may take at once.
func (g *GCRA) Burst() int64 { return g.burst }

// EmissionInterval returns T = Window/Limit in nanoseconds.
func (g *GCRA) EmissionInterval() int64 { return g.interval }

// Take implements Algorithm.
func (g *GCRA) Take(s State, now, n int64) (State, Decision) {
	var d Decision
	return g.decideInto(s, now, n, &d), d
}

// decideInto is Take writing the decision through d (see decideInPlace).
func (g *GCRA) decideInto(s State, now, n int64, d *Decision) State {
	return State{g.decide(s[0], now, n, d), s[1]}
}

// decide is Take on the TAT alone, writing the decision through d (the
// single-key Limiter's hot path: returning a State and a Decision by value
// costs more than the arithmetic). It returns the new TAT, which is the old
// one when the request is rejected or n is 0.
func (g *GCRA) decide(old, now, n int64, d *Decision) int64 {
	*d = Decision{Limit: g.limit, Window: time.Duration(g.window)}
	tat := max(old, now)
	if n > g.burst {
		d.Remaining = g.perT.div(g.tau - (tat - now))
		d.Reset = time.Duration(tat - now)
		d.RetryAfter = Never
		return old
	}
	newTAT := tat + n*g.interval
	diff := newTAT - now
	if diff > g.tau {
		d.Remaining = g.perT.div(g.tau - (tat - now))
		d.Reset = time.Duration(tat - now)
		d.RetryAfter = time.Duration(diff - g.tau)
		return old
	}
	d.Allowed = true
	d.Remaining = g.perT.div(g.tau - diff)
	d.Reset = time.Duration(diff)
	if n == 0 {
		return old
	}
	return newTAT
}

// Idle implements Algorithm: the key is fresh once TAT has passed.
func (g *GCRA) Idle(s State, now int64) bool { return s[0] <= now }

// Refund implements Algorithm. Seen from now, the refunded request moved
// the effective TAT max(TAT, now) up by R = max(after, now) - max(before,
// now). Every later admitted request maps x to max(x, t)+n*T with t <= now,
// which never shrinks that gap, so max(cur, now) - R is never below the TAT
// the other requests alone would have produced, and equals it when
// cur == after. Another refund in between breaks that argument (it moves
// the requests charged after it down, and our before and after with them),
// so State[1] counts refunds and a charge is given back only if none came
// between it and its refund; otherwise it stays charged (the strict side).
func (g *GCRA) Refund(cur, before, after State, now int64) State {
	r := max(after[0], now) - max(before[0], now)
	if r <= 0 || cur[1] != after[1] {
		return cur
	}
	return State{max(cur[0], now) - r, cur[1] + 1}
}
