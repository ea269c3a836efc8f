package l7

import (
	"fmt"
	"time"
)

// TokenBucket refills Limit tokens per Window continuously into a bucket of
// Burst tokens; a request for n units takes n tokens or is rejected.
//
// Exact integer form: token amounts are scaled by Window (one token = Window
// "token-nanoseconds"), so refill is Limit per nanosecond with no rounding at
// all. The state stores the deficit (how far the bucket is below full), so
// the zero State is a full bucket: State[0] is the time of the last update,
// State[1] the scaled deficit D. At time t, D' = max(0, D - (t-last)*Limit);
// n units are admitted iff D' + n*Window <= Burst*Window.
//
// Error bound: none (exact). Memory per key: 16 bytes of state.
type TokenBucket struct {
	limit    int64
	window   int64
	burst    int64
	capacity int64 // Burst*Window
	perW     divisor
	perL     divisor
}

// NewTokenBucket returns a token bucket refilling limit tokens per window
// into a bucket of burst tokens (0 means burst = limit).
func NewTokenBucket(limit int64, window time.Duration, burst int64) (*TokenBucket, error) {
	if err := validate("token_bucket", limit, window); err != nil {
		return nil, err
	}
	if burst == 0 {
		burst = limit
	}
	if burst < 1 || burst > maxScaled/int64(window) {
		return nil, fmt.Errorf("token_bucket: burst %d times window %s: must be in [1, 2^62 ns]: %w", burst, window, ErrInvalidLimit)
	}
	return &TokenBucket{limit: limit, window: int64(window), burst: burst, capacity: burst * int64(window),
		perW: newDivisor(int64(window)), perL: newDivisor(limit)}, nil
}

// Name returns "token_bucket".
func (b *TokenBucket) Name() string { return "token_bucket" }

// Limit returns tokens refilled per window.
func (b *TokenBucket) Limit() int64 { return b.limit }

// Window returns the window.
func (b *TokenBucket) Window() time.Duration { return time.Duration(b.window) }

// Burst returns the bucket size in tokens.
func (b *TokenBucket) Burst() int64 { return b.burst }

func (b *TokenBucket) deficit(s State, now int64) int64 {
	d := s[1]
	elapsed := now - s[0]
	if elapsed <= 0 || d == 0 {
		return d
	}
	if elapsed >= b.perL.ceil(d) {
		return 0
	}
	return d - elapsed*b.limit
}

// Take implements Algorithm.
func (b *TokenBucket) Take(s State, now, n int64) (State, Decision) {
	var d Decision
	return b.decideInto(s, now, n, &d), d
}

// decideInto is Take writing the decision through dec (see decideInPlace).
func (b *TokenBucket) decideInto(s State, now, n int64, dec *Decision) State {
	*dec = Decision{Limit: b.limit, Window: time.Duration(b.window)}
	d := b.deficit(s, now)
	if n > b.burst {
		dec.Remaining = b.perW.div(b.capacity - d)
		dec.Reset = time.Duration(b.perL.ceil(d))
		dec.RetryAfter = Never
		return s
	}
	nd := d + n*b.window
	if nd > b.capacity {
		dec.Remaining = b.perW.div(b.capacity - d)
		dec.Reset = time.Duration(b.perL.ceil(d))
		dec.RetryAfter = time.Duration(b.perL.ceil(nd - b.capacity))
		return s
	}
	dec.Allowed = true
	dec.Remaining = b.perW.div(b.capacity - nd)
	dec.Reset = time.Duration(b.perL.ceil(nd))
	if n == 0 {
		return s
	}
	return State{max(now, s[0]), nd}
}

// Idle implements Algorithm: the key is fresh once the bucket is full again.
func (b *TokenBucket) Idle(s State, now int64) bool { return b.deficit(s, now) == 0 }

// Refund implements Algorithm. When nothing touched the key since the
// charge (cur == after) the bucket gets back what the charge still holds
// at now, deficit(after, now) - deficit(before, now), which decides exactly
// as before would. Otherwise the charge stays (the strict side): the state
// has no spare word to tell whether a refund came in between, which is
// what makes GCRA's partial refund unsafe (see GCRA.Refund).
func (b *TokenBucket) Refund(cur, before, after State, now int64) State {
	if cur != after {
		return cur
	}
	now = max(now, cur[0], before[0])
	r := b.deficit(after, now) - b.deficit(before, now)
	if r <= 0 {
		return cur
	}
	return State{now, max(0, b.deficit(cur, now)-r)}
}
