package l7

import (
	"fmt"
	"sync"
	"time"
)

// MaxSlidingLogEntries caps the memory of one SlidingLog: it keeps one
// timestamp per admitted unit still inside the window, so Limit is at most
// this many (8 bytes each, 512 KiB at the cap).
const MaxSlidingLogEntries = 1 << 16

// SlidingLog is the exact sliding window: a log of the admission times of
// the units still inside the window (now-Window, now]. A request for n units
// is admitted iff live+n <= Limit. It is exact (no error bound) but costs
// 8*Limit bytes per key, so it is a single-key limiter (not an Algorithm for
// the keyed Store) with Limit capped at MaxSlidingLogEntries. Safe for
// concurrent use.
type SlidingLog struct {
	limit  int64
	window int64
	clock  Clock

	mu    sync.Mutex
	times []int64 // ring buffer of admission times, oldest at head
	head  int
	count int
}

// NewSlidingLog returns a sliding log admitting limit units per window.
func NewSlidingLog(limit int64, window time.Duration, clock Clock) (*SlidingLog, error) {
	if err := validate("sliding_log", limit, window); err != nil {
		return nil, err
	}
	if limit > MaxSlidingLogEntries {
		return nil, fmt.Errorf("sliding_log: limit %d above the memory cap of %d entries: use SlidingWindow: %w",
			limit, MaxSlidingLogEntries, ErrInvalidLimit)
	}
	return &SlidingLog{limit: limit, window: int64(window), clock: clock, times: make([]int64, limit)}, nil
}

// Allow takes one unit now.
func (l *SlidingLog) Allow() Decision { return l.TakeAt(l.clock.Now(), 1) }

// TakeAt decides whether n units may be taken at time now.
func (l *SlidingLog) TakeAt(now, n int64) Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	size := len(l.times)
	if l.count > 0 {
		// Keep the log sorted when a caller read the clock early.
		now = max(now, l.times[(l.head+l.count-1)%size])
	}
	for l.count > 0 && now-l.times[l.head] >= l.window {
		l.head = (l.head + 1) % size
		l.count--
	}
	d := Decision{Limit: l.limit, Window: time.Duration(l.window), Remaining: l.limit - int64(l.count)}
	if l.count > 0 {
		newest := l.times[(l.head+l.count-1)%size]
		d.Reset = time.Duration(newest + l.window - now)
	}
	if int64(l.count)+n > l.limit {
		if n > l.limit {
			d.RetryAfter = Never
			return d
		}
		// The (count+n-limit)-th oldest entry must leave the window.
		k := int64(l.count) + n - l.limit
		oldest := l.times[(l.head+int(k)-1)%size]
		d.RetryAfter = time.Duration(oldest + l.window - now)
		return d
	}
	d.Allowed = true
	for range n {
		l.times[(l.head+l.count)%size] = now
		l.count++
	}
	d.Remaining = l.limit - int64(l.count)
	if n > 0 {
		d.Reset = time.Duration(l.window)
	}
	return d
}
