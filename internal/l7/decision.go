// Package l7 is Edgeguard's user-space HTTP stage: rate-limit algorithms,
// keyed stores, key extraction and the HTTP middleware that applies them.
package l7

import (
	"time"
)

// Clock gives monotonic time in integer nanoseconds. Every algorithm takes
// its time from a Clock so tests can script timelines exactly.
type Clock interface {
	Now() int64
}

// SystemClock reads the monotonic clock, counted from the moment it was made.
type SystemClock struct{ start time.Time }

// NewSystemClock returns a Clock backed by the runtime's monotonic clock.
func NewSystemClock() *SystemClock { return &SystemClock{start: time.Now()} }

// Now returns nanoseconds since the clock was made.
func (c *SystemClock) Now() int64 { return int64(time.Since(c.start)) }

// Decision is what every limiter answers for one request.
//
// Limit and Window describe the quota (RateLimit-Policy q and w); Remaining
// and Reset describe its current state (RateLimit r and t). RetryAfter is set
// only when Allowed is false: the time after which this same request would be
// admitted.
type Decision struct {
	Allowed    bool
	Limit      int64
	Window     time.Duration
	Remaining  int64
	Reset      time.Duration
	RetryAfter time.Duration
}
