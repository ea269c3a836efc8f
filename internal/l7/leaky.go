package l7

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrQueueFull is returned by LeakyQueue.Wait when the queue is at its depth
// or the wait would exceed the maximum.
var ErrQueueFull = errors.New("leaky bucket queue full")

// LeakyBucket is the leaky bucket as a queue: requests are released one at a
// time at a fixed interval I = Window/Limit, never in bursts, for smoothing
// calls to a downstream that cannot take them. A request arriving at t gets
// the release slot max(t, N) where N is the next free slot, and N becomes
// slot+I. It is admitted (queued) iff its wait slot-t is at most
// min(Depth*I, MaxWait): at most Depth requests wait at once and none waits
// longer than MaxWait. Rejected requests take no slot.
//
// State[0] is N (zero is a fresh, empty queue); State[1] is unused.
// Error bound: I is truncated to whole nanoseconds (as GCRA). Memory per
// key: 8 bytes of state.
type LeakyBucket struct {
	limit    int64
	window   int64
	interval int64
	bound    int64 // min(depth*interval, maxWait)
	depth    int64
}

// NewLeakyBucket returns a leaky bucket releasing limit requests per window,
// with at most depth requests waiting and no wait above maxWait (0 means no
// bound other than depth).
func NewLeakyBucket(limit int64, window time.Duration, depth int64, maxWait time.Duration) (*LeakyBucket, error) {
	if err := validate("leaky_bucket", limit, window); err != nil {
		return nil, err
	}
	if int64(window) < limit {
		return nil, fmt.Errorf("leaky_bucket: limit %d per %s: interval below 1ns: %w", limit, window, ErrInvalidLimit)
	}
	interval := int64(window) / limit
	if depth < 1 || depth > maxScaled/interval {
		return nil, fmt.Errorf("leaky_bucket: depth %d: must be in [1, 2^62/interval]: %w", depth, ErrInvalidLimit)
	}
	if maxWait < 0 {
		return nil, fmt.Errorf("leaky_bucket: max wait %s: must not be negative: %w", maxWait, ErrInvalidLimit)
	}
	bound := depth * interval
	if maxWait > 0 && int64(maxWait) < bound {
		bound = int64(maxWait)
	}
	return &LeakyBucket{limit: limit, window: int64(window), interval: interval, bound: bound, depth: depth}, nil
}

// Interval returns the release interval I in nanoseconds.
func (b *LeakyBucket) Interval() int64 { return b.interval }

// Schedule decides for one request arriving at now. When admitted, wait is
// how long it must wait before release; when rejected, the state is
// unchanged and the Decision's RetryAfter is the time until it would fit.
func (b *LeakyBucket) Schedule(s State, now int64) (State, time.Duration, Decision) {
	d := Decision{Limit: b.limit, Window: time.Duration(b.window)}
	slot := max(s[0], now)
	wait := slot - now
	d.Reset = time.Duration(wait)
	if wait > b.bound {
		d.Remaining = 0
		d.RetryAfter = time.Duration(wait - b.bound)
		return s, 0, d
	}
	d.Allowed = true
	// The k-th next request would wait wait+k*I; count those within bound.
	d.Remaining = (b.bound - wait) / b.interval
	d.Reset = time.Duration(wait + b.interval)
	return State{slot + b.interval, 0}, time.Duration(wait), d
}

// LeakyQueue is a single-key leaky bucket that really queues: Wait blocks
// each caller until its release slot. A caller whose context ends while
// queued keeps its slot (the downstream sees a gap, never a burst). Safe for
// concurrent use.
type LeakyQueue struct {
	bucket *LeakyBucket
	clock  Clock

	mu    sync.Mutex
	state State
}

// NewLeakyQueue returns a queue releasing through bucket, timed by clock.
func NewLeakyQueue(bucket *LeakyBucket, clock Clock) *LeakyQueue {
	return &LeakyQueue{bucket: bucket, clock: clock}
}

// Reserve takes a release slot at the clock's current time without waiting:
// the caller must wait the returned duration before calling the downstream.
func (q *LeakyQueue) Reserve() (time.Duration, Decision) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var wait time.Duration
	var d Decision
	q.state, wait, d = q.bucket.Schedule(q.state, q.clock.Now())
	return wait, d
}

// Wait blocks until the caller's release slot, or returns ErrQueueFull at
// once when the queue is full, or the context's error if it ends first.
func (q *LeakyQueue) Wait(ctx context.Context) error {
	wait, d := q.Reserve()
	if !d.Allowed {
		return fmt.Errorf("leaky queue: retry after %s: %w", d.RetryAfter, ErrQueueFull)
	}
	if wait <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("leaky queue: waiting %s: %w", wait, ctx.Err())
	}
}
