package l7

import (
	"fmt"
	"time"
)

// LeakyBucket is the leaky bucket: requests leave it one at a time at a
// fixed interval I = Window/Limit, and at most Depth wait behind the one
// leaving. As a policer (the keyed Store's Algorithm) it admits what fits
// and passes it at once; as a shaper (Rule.Shape) the caller also holds
// each admitted request until its release slot (Delay), so the downstream
// sees at most one request per I, never a burst.
//
// Definition: a request for n units arriving at t gets the release slot
// max(t, N), where N is the next free slot; it is admitted iff the last of
// its units waits at most bound = min(Depth*I, MaxWait), i.e.
// max(t, N) - t + (n-1)*I <= bound, and then N = max(t, N) + n*I. Rejected
// requests take no slot. With N the theoretical arrival time this is the
// GCRA with a burst tolerance of bound + I (the two are the same meter),
// so a fresh key admits Depth+1 requests at once.
//
// State[0] is N (zero: an empty bucket); State[1] counts refunds (see
// Refund) and plays no part in decisions. Error bound: I is truncated to
// whole nanoseconds (as GCRA). Memory per key: 8 bytes of state.
type LeakyBucket struct {
	limit    int64
	window   int64
	interval int64
	bound    int64 // min(depth*interval, maxWait)
	perI     divisor
}

// NewLeakyBucket returns a leaky bucket releasing limit requests per window,
// with at most depth requests waiting behind the one released (0: none, a
// strict one-per-interval policer) and no wait above maxWait (0 means no
// bound other than depth).
func NewLeakyBucket(limit int64, window time.Duration, depth int64, maxWait time.Duration) (*LeakyBucket, error) {
	if err := validate("leaky_bucket", limit, window); err != nil {
		return nil, err
	}
	if int64(window) < limit {
		return nil, fmt.Errorf("leaky_bucket: limit %d per %s: interval below 1ns: %w", limit, window, ErrInvalidLimit)
	}
	interval := int64(window) / limit
	if depth < 0 || depth > maxScaled/interval-1 {
		return nil, fmt.Errorf("leaky_bucket: depth %d: must be in [0, 2^62/interval): %w", depth, ErrInvalidLimit)
	}
	if maxWait < 0 {
		return nil, fmt.Errorf("leaky_bucket: max wait %s: must not be negative: %w", maxWait, ErrInvalidLimit)
	}
	bound := depth * interval
	if maxWait > 0 && int64(maxWait) < bound {
		bound = int64(maxWait)
	}
	return &LeakyBucket{limit: limit, window: int64(window), interval: interval, bound: bound,
		perI: newDivisor(interval)}, nil
}

// Name returns "leaky_bucket".
func (b *LeakyBucket) Name() string { return "leaky_bucket" }

// Limit returns requests per window.
func (b *LeakyBucket) Limit() int64 { return b.limit }

// Window returns the window.
func (b *LeakyBucket) Window() time.Duration { return time.Duration(b.window) }

// Interval returns the release interval I in nanoseconds.
func (b *LeakyBucket) Interval() int64 { return b.interval }

// Take implements Algorithm.
func (b *LeakyBucket) Take(s State, now, n int64) (State, Decision) {
	d := Decision{Limit: b.limit, Window: time.Duration(b.window)}
	slot := max(s[0], now)
	wait := slot - now
	last := wait + (n-1)*b.interval // the wait of the request's last unit
	if n == 0 {
		last = wait - b.interval
	}
	d.Reset = time.Duration(wait)
	if wait <= b.bound {
		d.Remaining = b.perI.div(b.bound-wait) + 1
	}
	if (n-1)*b.interval > b.bound {
		d.RetryAfter = Never
		return s, d
	}
	if last > b.bound {
		d.RetryAfter = time.Duration(last - b.bound)
		return s, d
	}
	d.Allowed = true
	if n == 0 {
		return s, d
	}
	next := slot + n*b.interval
	d.Reset = time.Duration(next - now)
	// The k-th next request would wait next-now+(k-1)*I; count those within bound.
	d.Remaining = 0
	if next-now <= b.bound {
		d.Remaining = b.perI.div(b.bound-(next-now)) + 1
	}
	return State{next, s[1]}, d
}

// Delay is how long a shaper holds a request of n units that Take admitted
// with decision d: until the release slot of its first unit (0 when it may
// leave at once).
func (b *LeakyBucket) Delay(d Decision, n int64) time.Duration {
	if !d.Allowed || n <= 0 {
		return 0
	}
	return max(0, d.Reset-time.Duration(n*b.interval))
}

// Idle implements Algorithm: the bucket is empty once N has passed.
func (b *LeakyBucket) Idle(s State, now int64) bool { return s[0] <= now }

// Refund implements Algorithm exactly as GCRA's (N is GCRA's TAT): the part
// of the charge not yet drained at now, R = max(after, now) - max(before,
// now), comes off N, unless another refund came between the charge and this
// one (State[1] counts them); then the charge stays (the strict side).
func (b *LeakyBucket) Refund(cur, before, after State, now int64) State {
	r := max(after[0], now) - max(before[0], now)
	if r <= 0 || cur[1] != after[1] {
		return cur
	}
	return State{max(cur[0], now) - r, cur[1] + 1}
}
